// Symbolic verifier: executes a schedule on sets of contributions instead of numbers.
//
// State: for every (rank, chunk) the exact set of ranks whose input is summed into that slice
// (a bitset of n bits). Initially rank r holds {r} for every chunk (allreduce / reduce-scatter),
// or the chunk owner holds the full set (allgather). A send requires a non-empty set at the
// sender (nobody sends data it does not hold yet); a reduce requires the two sets to be disjoint
// (every contribution is counted exactly once) and the receiver to hold data; a copy replaces
// the receiver's set. Sends read the state at the start of their round (see ir.h). At the end:
// allreduce / allgather — every rank holds the full set for every chunk; reduce-scatter — every
// chunk owner holds the full set of its chunk.
#pragma once

#include <string>

#include "core/ir.h"

namespace stragg {
namespace core {

struct VerifyResult {
  bool ok = false;
  std::string error;       // first problem found, empty when ok
  int steps_checked = 0;
  explicit operator bool() const { return ok; }
};

VerifyResult verify(const Schedule& s);

// Throws ScheduleError with the verifier's message when the schedule is wrong.
void verify_or_throw(const Schedule& s);

}  // namespace core
}  // namespace stragg
