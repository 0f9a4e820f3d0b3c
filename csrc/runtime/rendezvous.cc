#include "runtime/rendezvous.h"

#include <sstream>

#include "runtime/error.h"

namespace stragg {

std::vector<std::string> exchange_all(Rendezvous& rdv, const std::string& prefix, int rank,
                                      int size, const std::string& value,
                                      std::chrono::milliseconds timeout, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  rdv.set(prefix + "/" + std::to_string(rank), value);
  std::vector<std::string> values(size);
  for (int peer = 0; peer < size; ++peer) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() < 1) left = std::chrono::milliseconds(1);
    auto got = rdv.get(prefix + "/" + std::to_string(peer), left);
    if (got) {
      values[peer] = std::move(*got);
      continue;
    }
    std::vector<int> missing;
    for (int q = peer; q < size; ++q) {
      if (!rdv.check(prefix + "/" + std::to_string(q))) missing.push_back(q);
    }
    if (missing.empty()) missing.push_back(peer);
    std::ostringstream msg;
    msg << "stragg: rank " << rank << ": " << what << " timed out after "
        << std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count() / 1000.0
        << " s: rank" << (missing.size() == 1 ? " " : "s [");
    for (size_t i = 0; i < missing.size(); ++i) msg << (i ? ", " : "") << missing[i];
    msg << (missing.size() == 1 ? "" : "]") << " did not join";
    throw TimeoutError(msg.str());
  }
  return values;
}

}  // namespace stragg
