// Shared-memory transport for ranks on one host (no torch here).
//
// Each rank owns one POSIX shared-memory segment holding its control block (doorbell, arrival
// ticket, abort flag and message, pid) and one outgoing channel per peer: a ring of `num_slots`
// slots of `slot_bytes` each. Messages are streamed through the slots in pieces, so staging
// memory per peer is bounded (num_slots * slot_bytes) whatever the tensor size. The receiver
// consumes pieces straight from the sender's slots (reducing or copying into its own buffer), so
// a piece crosses memory once.
//
// Every rank maps every peer's segment; once all ranks have mapped all segments the names are
// unlinked, so nothing is left in /dev/shm even if a process is killed later. Waiting is
// spin -> yield -> futex sleep on the rank's doorbell (an event count), which matters when more
// ranks than cores share the machine.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/rendezvous.h"
#include "transport/transport.h"

namespace stragg {

struct ShmOptions {
  size_t slot_bytes = 512 * 1024;  // payload bytes per slot (rounded up to 4 KiB)
  size_t num_slots = 4;            // slots per directed channel
  int spin_us = 5;                 // busy-poll before yielding
  int yield_us = 50;               // sched_yield polling before sleeping on the futex
  std::chrono::milliseconds setup_timeout{std::chrono::minutes(5)};
};

class ShmTransport final : public Transport {
 public:
  // Collective over all `size` ranks: creates this rank's segment, maps every peer's segment
  // (names exchanged through `rdv` under `key_prefix`), then unlinks the names.
  // Throws stragg::Error / TimeoutError naming missing ranks.
  ShmTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
               const ShmOptions& options);
  ~ShmTransport() override;

  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  const char* name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  bool progress(SendOp& op) override;
  bool progress(RecvOp& op) override;
  uint64_t activity_token() override;
  void wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) override;

  void signal_abort(const std::string& reason) override;
  std::optional<std::string> abort_reason() override;
  std::vector<int> dead_peers() override;
  void announce_arrival(uint64_t coll_seq) override;
  int64_t peer_arrival(int peer) override;
  ArrivalBoard* arrival_board() override { return board_.get(); }
  bool supports_recv_limit() const override { return true; }

  const ShmOptions& options() const { return options_; }
  // Staging bytes one directed channel uses (slots + headers).
  size_t channel_bytes() const { return channel_stride_; }

 private:
  struct Segment;
  struct ControlBlock;
  class SharedArrivalBoard;
  friend class SharedArrivalBoard;
  struct ChannelHeader;
  struct SlotHeader;

  ControlBlock* control(int r) const;
  ChannelHeader* channel(int owner, int peer) const;
  SlotHeader* slot(ChannelHeader* ch, uint64_t index) const;
  void ring_doorbell(int r);
  void ensure_channel_backed(int peer);

  int rank_;
  int size_;
  ShmOptions options_;
  size_t slot_stride_ = 0;
  size_t channel_stride_ = 0;
  size_t control_bytes_ = 0;
  size_t board_offset_ = 0;
  size_t segment_bytes_ = 0;
  std::vector<std::unique_ptr<Segment>> segments_;  // one per rank, ours included
  std::vector<int> peer_pids_;
  std::vector<bool> pid_checkable_;
  std::vector<bool> channel_backed_;
  std::unique_ptr<ArrivalBoard> board_;  // lives in rank 0's segment
  std::string own_name_;
  bool own_unlinked_ = false;
};

}  // namespace stragg
