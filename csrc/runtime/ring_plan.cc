#include "runtime/ring_plan.h"

namespace stragg {

const char* algo_name(Algo algo) {
  switch (algo) {
    case Algo::Ring:
      return "ring";
    case Algo::Schedule:
      return "schedule";
  }
  return "unknown";
}

void chunk_range(size_t numel, int parts, int c, size_t* offset, size_t* count) {
  const size_t base = numel / parts;
  const size_t extra = numel % parts;
  const size_t uc = static_cast<size_t>(c);
  *offset = uc * base + (uc < extra ? uc : extra);
  *count = base + (uc < extra ? 1 : 0);
}

RankPlan ring_allreduce_plan(int rank, int size, size_t numel) {
  RankPlan plan;
  plan.algo = Algo::Ring;
  if (size <= 1) return plan;
  const int next = (rank + 1) % size;
  const int prev = (rank + size - 1) % size;
  auto mod = [size](int v) { return ((v % size) + size) % size; };
  auto op = [&](int peer, int chunk, bool reduce) {
    PlanOp o;
    o.peer = peer;
    chunk_range(numel, size, chunk, &o.offset, &o.count);
    o.reduce = reduce;
    return o;
  };
  // Reduce-scatter: in step s, send chunk (rank - s) and reduce chunk (rank - s - 1).
  for (int s = 0; s < size - 1; ++s) {
    PlanStep step;
    step.id = static_cast<uint32_t>(plan.steps.size());
    step.sends.push_back(op(next, mod(rank - s), false));
    step.recvs.push_back(op(prev, mod(rank - s - 1), true));
    plan.steps.push_back(std::move(step));
  }
  // Allgather: in step s, forward chunk (rank + 1 - s), receive chunk (rank - s).
  for (int s = 0; s < size - 1; ++s) {
    PlanStep step;
    step.id = static_cast<uint32_t>(plan.steps.size());
    step.sends.push_back(op(next, mod(rank + 1 - s), false));
    step.recvs.push_back(op(prev, mod(rank - s), false));
    plan.steps.push_back(std::move(step));
  }
  return plan;
}

}  // namespace stragg
