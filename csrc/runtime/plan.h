// What one rank does in a collective: the executor's input (no torch here).
//
// A RankPlan is a schedule lowered to one rank: a list of steps, each with the sends and receives
// this rank performs, as element ranges of its own buffer. Within a step all ops progress
// concurrently; a step finishes when all its ops are done. Ops to the same peer in one step run
// in the order listed (messages between two ranks are FIFO).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stragg {

enum class Algo : uint8_t { Ring = 1 };

const char* algo_name(Algo algo);

struct PlanOp {
  int peer = -1;
  size_t offset = 0;    // first element
  size_t count = 0;     // elements
  bool reduce = false;  // receives only: reduce into the buffer (true) or overwrite it (false)
};

struct PlanStep {
  std::vector<PlanOp> sends;
  std::vector<PlanOp> recvs;
};

struct RankPlan {
  Algo algo = Algo::Ring;
  std::vector<PlanStep> steps;
};

}  // namespace stragg
