// Layout of a rank's shared-memory segment; every rank's segment is laid out alike:
//   control block (2 pages) | arrival board (used in rank 0's segment only) |
//   one-shot block (a page, then two buffers; absent when the one-shot size is 0) | a channel per peer
// The control block holds the rank's doorbell (doorbell.h), published progress, abort flag and
// message, and pid. A channel is the ring through which the segment's owner sends to one peer
// (channel.h): a header page with the head and tail counters, then num_slots slots, each a
// 128-byte SlotHeader followed by slot_bytes of payload.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/transport.h"

namespace stragg::shm {

constexpr uint64_t kMagic = 0x5354524147475348ull;  // "STRAGGSH"
constexpr size_t kPage = 4096;
constexpr size_t kControlBytes = 2 * kPage;
constexpr size_t kChannelHeaderBytes = kPage;
constexpr size_t kSlotHeaderBytes = 128;
constexpr size_t kAbortMessageBytes = 4000;
constexpr int kMaxReportedRanks = 1024;  // a Progress names awaited ranks below this
constexpr int kAwaitWords = kMaxReportedRanks / 64;

// The owner's published Progress (transport.h). One writer (the owner), any number of readers:
// a sequence lock (`version` odd while the owner writes) gives readers a consistent copy.
struct ProgressBlock {
  std::atomic<uint32_t> version;
  std::atomic<int32_t> step;
  std::atomic<int64_t> seq;
  std::atomic<int64_t> call;
  std::atomic<uint64_t> awaiting[kAwaitWords];  // bit q: waits for rank q
};

struct ControlBlock {
  uint64_t magic;
  uint64_t nonce;
  int32_t pid;
  int32_t rank;
  int32_t size;
  uint32_t pad0;
  alignas(64) std::atomic<uint32_t> doorbell;  // event count: bumped by anyone who has news
  std::atomic<uint32_t> sleeping;              // threads of the owner (about to be) in futex_wait
  alignas(64) ProgressBlock progress;          // where the owner is (publish_progress)
  alignas(64) std::atomic<uint32_t> abort_by;  // 0, or 1 + the rank whose message explains it
  std::atomic<uint32_t> own_abort_ready;       // own_abort_message is valid
  char own_abort_message[kAbortMessageBytes];
};
static_assert(sizeof(ControlBlock) <= kControlBytes, "control block too large");

// The owner's inputs of the one-shot all_reduce (OneshotArea in transport.h): `published` is the
// number of one-shot calls whose input the owner has put in place (release); call #i's header
// and input are in slot i % 2.
struct OneshotBlock {
  alignas(64) std::atomic<uint64_t> published;
  alignas(64) OneshotHeader header[2];
};

struct ChannelHeader {
  alignas(64) std::atomic<uint64_t> head;  // slots published by the sender
  alignas(64) std::atomic<uint64_t> tail;  // slots consumed by the receiver
};

struct SlotHeader {
  MessageHeader message;  // of the message this piece belongs to
  uint64_t offset;        // payload offset of this piece
  uint64_t len;           // payload bytes in this piece
};
static_assert(sizeof(SlotHeader) <= kSlotHeaderBytes, "slot header too large");

// The owner writes its progress; any rank reads a consistent copy (ranks >= kMaxReportedRanks
// are not recorded in `awaiting`).
void write_progress(ProgressBlock& block, const Progress& progress);
Progress read_progress(const ProgressBlock& block, int size);

// Offsets and sizes of the segments of a group of `size` ranks. `slot_bytes` is a multiple of
// kPage and `num_slots` at least 1 (ShmTransport rounds the options so).
struct Layout {
  // `oneshot_bytes`: capacity of each one-shot buffer (a multiple of kPage; 0: no one-shot block).
  Layout(size_t slot_bytes, size_t num_slots, int size, size_t oneshot_bytes);

  size_t slot_bytes;
  size_t num_slots;
  size_t slot_stride;     // SlotHeader + payload
  size_t channel_stride;  // channel header + slots, whole pages
  size_t board_offset;    // of the arrival board
  size_t oneshot_offset;  // of the one-shot block
  size_t oneshot_bytes;   // capacity of each of its two buffers (0: no block)
  size_t control_bytes;   // control block + arrival board + one-shot block; the channels follow
  size_t segment_bytes;

  size_t channel_offset(int peer) const {
    return control_bytes + static_cast<size_t>(peer) * channel_stride;
  }
  ControlBlock* control(uint8_t* base) const { return reinterpret_cast<ControlBlock*>(base); }
  OneshotBlock* oneshot(uint8_t* base) const {
    return reinterpret_cast<OneshotBlock*>(base + oneshot_offset);
  }
  uint8_t* oneshot_buffer(uint8_t* base, uint64_t index) const {
    return base + oneshot_offset + kPage + (index % 2) * oneshot_bytes;
  }
  // The channel in `base`'s segment through which its owner sends to `peer`.
  ChannelHeader* channel(uint8_t* base, int peer) const {
    return reinterpret_cast<ChannelHeader*>(base + channel_offset(peer));
  }
  SlotHeader* slot(ChannelHeader* ch, uint64_t index) const {
    auto* first = reinterpret_cast<uint8_t*>(ch) + kChannelHeaderBytes;
    return reinterpret_cast<SlotHeader*>(first + (index % num_slots) * slot_stride);
  }
  static uint8_t* payload(SlotHeader* s) {
    return reinterpret_cast<uint8_t*>(s) + kSlotHeaderBytes;
  }

  // Constructs the control block, the arrival board, the one-shot block and the channel headers of a fresh segment
  // of `rank` (the slots need no initialization).
  void initialize(uint8_t* base, uint64_t nonce, int pid, int rank, int size) const;
};

}  // namespace stragg::shm
