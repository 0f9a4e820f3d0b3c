// Ring all_reduce lowered to one rank: n-1 reduce-scatter steps, then n-1 allgather steps.
#pragma once

#include <cstddef>

#include "runtime/plan.h"

namespace stragg {

// Element range of chunk `c` when `numel` elements are split into `parts` nearly equal chunks
// (the first numel % parts chunks get one element more).
void chunk_range(size_t numel, int parts, int c, size_t* offset, size_t* count);

// Rank `rank` of `size` sends to rank+1 and receives from rank-1. After the reduce-scatter,
// rank r holds the fully reduced chunk (r+1) % size; the allgather copies each reduced chunk to
// everybody, so every rank ends with bitwise identical data.
RankPlan ring_allreduce_plan(int rank, int size, size_t numel);

}  // namespace stragg
