// Lowers a schedule from the core library to what one rank executes (no torch here).
#pragma once

#include <cstddef>

#include "core/ir.h"
#include "runtime/lowered_schedule.h"

namespace stragg {

// True if some rank, in some round, has a receive that must be staged: it overlaps another
// receive of the round, or a send of the round (the IR's sends read start-of-step data) unless
// `ordered_recvs` (the transport lands received bytes only after the send read them, see
// RecvOp::limit) and it overlaps exactly one send.
bool schedule_needs_staging(const core::Schedule& s, bool ordered_recvs);

// The steps `rank` executes for an all_reduce of `numel` elements of `elem_size` bytes.
// Steps of one round become one LoweredStep (ops issued concurrently). When the schedule needs
// staging, the buffer is split into segments small enough that a staged chunk is at most
// `max_staging_bytes`; all pre-arrival steps of all segments come first (so the early ranks do
// as much as they can before the straggler arrives), then the remaining steps, segment by
// segment. The result is identical on every rank except for the rank's own ops.
//
// `pipeline_bytes` > 0 (a schedule that needs no staging, where receives overlap at most a send
// of exactly their range): chunks larger than that are split
// into segments of about that size, issued round by round (round r of every segment, then round
// r+1), so that a rank forwards a segment as soon as it has it instead of a whole chunk (a
// pipelined Ring: on a network the forward no longer waits for the chunk's last byte), and
// StragglAR gets ordered_sends (runtime/lowered_schedule.h).
LoweredSchedule lower_schedule(const core::Schedule& s, int rank, size_t numel, size_t elem_size,
                               size_t max_staging_bytes = 1 << 20, bool ordered_recvs = false,
                               size_t pipeline_bytes = 0);

}  // namespace stragg
