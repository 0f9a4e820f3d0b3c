// The median the profilers and the link analysis use: of a copy, the mean of the two middle
// values for an even count, 0 for none. nth_element, not a sort: the profiler takes medians of
// a batch's call times at every exchange.
#pragma once

#include <algorithm>
#include <vector>

namespace stragg {

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2) return *mid;
  return 0.5 * (*std::max_element(v.begin(), mid) + *mid);
}

}  // namespace stragg
