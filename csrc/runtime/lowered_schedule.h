// What one rank does in a collective: the executor's input (no torch here).
//
// A LoweredSchedule is a schedule (core/ir.h) lowered to one rank (plan/lower.h): a list of
// steps, each with the sends and receives this rank performs, as element ranges of its own
// buffer. Within a step all ops progress concurrently; a step finishes when all its ops are done.
// Ops to the same peer in one step run in the order listed (messages between two ranks are FIFO).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/algorithm.h"  // vocabulary only: what a schedule's tag names

namespace stragg {

// Carried in message headers so ranks running different schedules notice it: an all_reduce
// Algorithm (core/algorithm.h), or kLinkProbeTag for the profiler's link probes.
inline constexpr uint8_t kLinkProbeTag = 0xFF;
// Set in the tag of a host-level plan (core/host_level.cc) of an algorithm.
inline constexpr uint8_t kHostLevelTagBit = 0x40;
inline uint8_t schedule_tag(Algorithm a, bool by_host = false) {
  return static_cast<uint8_t>(static_cast<uint8_t>(a) | (by_host ? kHostLevelTagBit : 0));
}
// "ring", "stragglar", ..., "host:ring", "link probe", or "plan <tag>".
std::string schedule_tag_name(uint8_t tag);

struct LoweredOp {
  int peer = -1;
  size_t offset = 0;    // first element
  size_t count = 0;     // elements
  bool reduce = false;  // receives only: reduce into the buffer (true) or overwrite it (false)
  // Receives only: land in a staging buffer and apply at the end of the step, because this
  // step also sends (or receives) an overlapping range: sends read the data as it was at the
  // start of the step (the schedule IR's semantics).
  bool staged = false;
  // Receives only: index in the step's sends of a send that reads an overlapping range. With a
  // transport that supports RecvOp::limit, the receive only lands bytes that send has already
  // read (no staging copy); otherwise the executor stages it.
  int follows_send = -1;
  // Receives with reduce only: the received data is the left operand (x = received (+) x;
  // core::RecvAction::kReduceFirst), else the right one (x = x (+) received).
  bool received_first = false;
};

struct LoweredStep {
  uint32_t id = 0;           // same on every rank; checked in message headers
  bool pre_arrival = false;  // does not involve the straggler (StragglAR's early reduce-scatter)
  std::vector<LoweredOp> sends;
  std::vector<LoweredOp> recvs;
};

struct LoweredSchedule {
  uint8_t tag = schedule_tag(Algorithm::Ring);
  // Steps the executor should keep in flight at least (0: its default). Pipelined schedules cut
  // every round into many small steps; a window of a round or two lets a rank run the next
  // round's independent transfers while a partner is still behind in this one.
  size_t min_lookahead = 0;
  // A send waits until the sends of every earlier step have finished, to whichever peer. For
  // StragglAR over a network: a later round's send (its rounds each go to a new partner, the
  // straggler's own chunks are all ready at once) would otherwise share this rank's link with
  // the round everybody waits for. The executor paces the transport's sends for such plans
  // (Transport::set_paced_sends), else a send finishes once the kernel has buffered it.
  bool ordered_sends = false;
  std::vector<LoweredStep> steps;
};

}  // namespace stragg
