// The StragglAR paper's App. E heuristic (see stragglar_appendix_e.cc). Offline tool code.
#pragma once

#include <cstdint>

#include "core/ir.h"

namespace stragg {
namespace core {
namespace tools {

// Post-arrival StragglAR schedule for n (straggler n-1, partner of round r is rank r): the best
// of `restarts` seeded runs of the randomised maximum-weight matching heuristic.
Schedule appendix_e(int n, int restarts, uint64_t seed);

}  // namespace tools
}  // namespace core
}  // namespace stragg
