// The staged point-to-point protocol of CUDA IPC, over the Device interface (no torch, no CUDA):
// CudaIpcP2P runs it on the CUDA device across processes, HostP2P (host/host_p2p.h) on the host
// device across in-process ranks, so CI exercises the protocol itself.
//
// Each rank owns a receive staging area (per sender: `slots` slots of `slot_bytes`). A send copies
// its message piece by piece into the receiver's staging slots on the sender's stream; the
// receiver copies each piece out on its own stream. Ordering uses events plus counters in memory
// shared by the group:
//
//   per directed channel s -> d and slot:  ready event (recorded by s),  consumed event (by d)
//   per directed channel:                  ready counter (pieces s has enqueued),
//                                          consumed counter (pieces d has enqueued to copy out)
//
//   sender, piece k (slot k % slots): host waits until consumed >= k - slots + 1, then enqueues
//     wait(consumed event of the slot) -> copy into the slot -> record(ready event); ready = k+1
//   receiver, piece k: host waits until ready >= k + 1, then enqueues
//     wait(ready event of the slot) -> copy out of the slot -> record(consumed event); consumed =
//     k+1
//
// A counter is published only after the event record it announces was enqueued, and an event
// slot is re-recorded only after the peer has enqueued its wait on the previous record (that is
// what the counter it waits for says), so every wait waits for exactly the right record. The
// host waits only for the peers' host-side enqueues, never for the device; staging is bounded
// (size x slots x slot_bytes per rank) whatever the message size. group_end() interleaves all ops
// of the group piece by piece, so a step's sends and receives progress together.
//
// Faults: an abort flag and reason in the shared block (first writer wins), dead peers (the
// subclass says how it knows), and a deadline on every group; all become stragg::Error /
// TimeoutError naming the rank and peers. The shared block also holds each rank's last announced
// collective (GpuP2P::announce_arrival): a timeout names the ranks that never called it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/gpu_p2p.h"

namespace stragg::gpu {

class StagedP2P : public GpuP2P {
 public:
  // Bytes of the block shared by a group of n ranks (zero-initialised by its creator).
  static size_t shared_bytes(int n);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  void group_start() override;
  void send(const void* buf, size_t bytes, int peer, Stream stream) override;
  void recv(void* buf, size_t bytes, int peer, Stream stream) override;
  void group_end(std::chrono::milliseconds timeout) override;

  std::optional<std::string> async_error() override;
  void abort(const std::string& reason) override;

  void announce_arrival(const char* op_name, uint64_t seq) override;
  int64_t peer_arrival(int peer) override;

 protected:
  // Validates rank/size/slots (throws stragg::Error naming the rank). The subclass then sets up
  // the members below and calls attach_shared(). `layer` names it in messages ("cuda-ipc").
  StagedP2P(Device& dev, const std::string& layer, int rank, int size, int device,
            size_t slot_bytes, int slots);

  // The block shared by all ranks of the group (shared_bytes(size) bytes, zero-initialised).
  void attach_shared(void* block);
  void* shared_block() const { return shared_; }

  // Whether rank q is gone for good (its process died); checked while waiting for it.
  virtual bool peer_gone(int q) = 0;
  // "stragg: rank R: <layer> p2p", the prefix of every message.
  const std::string& where() const { return where_; }

  Device& dev_;
  std::string where_;
  int rank_;
  int size_;
  int device_;
  size_t slot_bytes_;
  int slots_;

  // Set up by the subclass. Staging areas are indexed by sender: slot `s` of the channel
  // q -> r lies at staging(r) + (q * slots + s) * slot_bytes.
  uint8_t* staging_ = nullptr;          // mine
  std::vector<uint8_t*> peer_staging_;  // peers' (nullptr for me)
  std::vector<Event> ready_mine_;       // [peer * slots + slot]: channel me -> peer, recorded by me
  std::vector<Event> consumed_mine_;    // [peer * slots + slot]: channel peer -> me, recorded by me
  std::vector<Event> ready_peer_;       // [peer * slots + slot]: channel peer -> me, by the peer
  std::vector<Event> consumed_peer_;    // [peer * slots + slot]: channel me -> peer, by the peer

 private:
  struct Op {
    bool is_send;
    int peer;
    uint8_t* buf;
    size_t bytes;
    size_t done;
    Stream stream;
  };
  struct Channel;
  struct Header;
  Channel& channel(int sender, int receiver) const;
  std::atomic<int64_t>& arrival(int q) const;
  bool progress(Op& op);  // enqueues at most one piece; true if it did
  void check_waiting(const std::chrono::steady_clock::time_point& deadline,
                     std::chrono::milliseconds timeout);

  void* shared_ = nullptr;
  std::chrono::steady_clock::time_point last_health_check_;
  std::string arrived_op_;  // the collective announced last (named by timeouts)
  int64_t arrived_seq_ = -1;
  std::vector<uint64_t> sent_pieces_;      // per peer: pieces enqueued to it
  std::vector<uint64_t> received_pieces_;  // per peer: pieces enqueued to copy out from it
  std::vector<Op> group_;
  bool in_group_ = false;
};

}  // namespace stragg::gpu
