// Lowers a schedule from the core library to what one rank executes (no torch here).
#pragma once

#include <cstddef>

#include "core/ir.h"
#include "runtime/plan.h"

namespace stragg {

// True if some rank, in some round, receives into a range it also sends or receives in that
// round: such receives must be staged (the IR's sends read start-of-step data).
bool schedule_needs_staging(const core::Schedule& s);

// The steps `rank` executes for an all_reduce of `numel` elements of `elem_size` bytes.
// Steps of one round become one PlanStep (ops issued concurrently). When the schedule needs
// staging, the buffer is split into segments small enough that a staged chunk is at most
// `max_staging_bytes`; all pre-arrival steps of all segments come first (so the early ranks do
// as much as they can before the straggler arrives), then the remaining steps, segment by
// segment. The result is identical on every rank except for the rank's own ops.
RankPlan lower_schedule(const core::Schedule& s, int rank, size_t numel, size_t elem_size,
                        size_t max_staging_bytes = 1 << 20);

}  // namespace stragg
