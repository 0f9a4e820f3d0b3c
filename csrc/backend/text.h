// Small text helpers of the torch adapter's messages and dumps.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace stragg {

// "[1, 3]": a list of ranks as torch's messages and the flight recorder's dumps print them.
inline std::string bracketed(const std::vector<int64_t>& values) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < values.size(); ++i) s << (i ? ", " : "") << values[i];
  s << "]";
  return s.str();
}

}  // namespace stragg
