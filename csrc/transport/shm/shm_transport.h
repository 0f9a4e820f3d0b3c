// Shared-memory transport for ranks on one host (no torch here).
//
// Each rank owns one POSIX shared-memory segment (segment.h) holding its control block and one
// outgoing channel per peer (layout.h): a ring of `num_slots` slots of `slot_bytes` each through
// which messages stream in pieces (channel.h), so staging memory per peer is bounded whatever the
// tensor size and a piece crosses memory once. Waiting sleeps on the rank's doorbell
// (doorbell.h); the arrival board for straggler agreement lives in rank 0's segment
// (arrival_board.h), each rank's inputs of the one-shot all_reduce in its own (oneshot_area.h). Every rank maps every peer's segment, then the names are unlinked, so
// nothing is left in /dev/shm even if a process is killed later.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous.h"
#include "transport/group_transport.h"
#include "transport/transport.h"

namespace stragg {

namespace shm {
struct ControlBlock;
struct Layout;
class Segment;
}  // namespace shm

struct ShmOptions {
  size_t slot_bytes = 512 * 1024;  // payload bytes per slot (rounded up to 4 KiB)
  size_t num_slots = 4;            // slots per directed channel
  int spin_us = 5;                 // busy-poll before yielding
  int yield_us = 50;               // sched_yield polling before sleeping on the futex
  size_t oneshot_bytes = 0;        // capacity of the one-shot buffers (rounded up to 4 KiB; 0: none)
  std::chrono::milliseconds setup_timeout{std::chrono::minutes(5)};
};

class ShmTransport final : public GroupTransport {
 public:
  // Collective over all `size` ranks: creates this rank's segment, maps every peer's segment
  // (names exchanged through `rdv` under `key_prefix`), then unlinks the names.
  // Throws stragg::Error / TimeoutError naming missing ranks.
  ShmTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
               const ShmOptions& options);
  ~ShmTransport() override;

  const char* name() const override { return "shm"; }

  // Both ring the peer's doorbell when anything moved.
  bool progress(SendOp& op) override;
  bool progress(RecvOp& op) override;
  bool supports_recv_limit() const override { return true; }
  // The token is this rank's doorbell.
  uint64_t activity_token() override;
  void wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) override;

  // Flags every rank's control block (the first aborting rank wins) and rings every doorbell.
  void signal_abort(const std::string& reason) override;
  std::optional<std::string> abort_reason() override;
  // Peers whose process is gone (checked by pid where the pid namespace is shared) and whose
  // channel to this rank holds nothing unread.
  std::vector<int> dead_peers() override;
  // Peers whose process is gone (pid check), unread messages or not.
  std::vector<int> gone_peers() override;
  // Progress lives in the control block; a peer is Stopped when its process is in state T
  // (SIGSTOP, a debugger), Dead when gone (pid checks need a shared pid namespace).
  void publish_progress(const Progress& progress) override;
  PeerStatus peer_status(int peer) override;
  ArrivalBoard* arrival_board() override { return board_.get(); }
  OneshotArea* oneshot_area() override { return oneshot_.get(); }
  // "shm_slot_bytes", "shm_slots", "oneshot_bytes" and every peer via shm (peer_stats.h).
  TransportStats stats() const override;

  // For transports composed of this one (transport/mixed), from any thread: ring this rank's
  // own doorbell (wakes its waiters), and wait for it like wait_for_activity() but sleeping at
  // once, without the spin and yield phases (for a helper thread).
  void ring_own_doorbell() { ring_doorbell(rank_); }
  void sleep_for_activity(uint64_t token, std::chrono::microseconds max_wait);

  const ShmOptions& options() const { return options_; }
  // Staging bytes one directed channel uses (slots + headers).
  size_t channel_bytes() const;

 private:
  void create_own_segment(const std::string& name, uint64_t nonce);
  void map_peer_segments(Rendezvous& rdv, const std::string& key_prefix,
                         const std::string& own_name, uint64_t nonce);
  void map_peer_segment(int peer, const std::string& name, const std::string& nonce);
  shm::ControlBlock* control(int r) const;
  void ring_doorbell(int r);
  void ring_all_doorbells();
  void ensure_channel_backed(int peer);

  ShmOptions options_;
  std::unique_ptr<shm::Layout> layout_;
  std::vector<std::unique_ptr<shm::Segment>> segments_;  // one per rank, ours included
  std::vector<int> peer_pids_;
  std::vector<bool> pid_checkable_;
  std::vector<bool> channel_backed_;
  std::unique_ptr<ArrivalBoard> board_;  // lives in rank 0's segment
  std::unique_ptr<OneshotArea> oneshot_;  // nullptr when options_.oneshot_bytes is 0
};

}  // namespace stragg
