// GpuP2P for ranks on one node (several may share one GPU), over CUDA IPC.
//
// Each rank owns a receive staging area in device memory (per sender: `slots` slots of
// `slot_bytes`), exported with cudaIpcGetMemHandle. A send copies its message piece by piece
// (cudaMemcpyAsync on the caller's stream) into the receiver's staging slots; the receiver copies
// each piece out on its own stream. Cross-process ordering uses interprocess events
// (cudaIpcGetEventHandle) plus counters in a POSIX shared-memory segment:
//
//   per directed channel s -> d and slot:  ready event (recorded by s),  consumed event (by d)
//   per directed channel:                  ready counter (pieces s has enqueued),
//                                          consumed counter (pieces d has enqueued to copy out)
//
//   sender, piece k (slot k % slots): host waits until consumed >= k - slots + 1, then enqueues
//     wait(consumed event of the slot) -> memcpy into the slot -> record(ready event); ready = k+1
//   receiver, piece k: host waits until ready >= k + 1, then enqueues
//     wait(ready event of the slot) -> memcpy out of the slot -> record(consumed event); consumed = k+1
//
// A counter is published only after the event record it announces was enqueued, and an event
// slot is re-recorded only after the peer has enqueued its wait on the previous record (that is
// what the counter it waits for says), so every cudaStreamWaitEvent waits for exactly the right
// record. The host waits only for the peers' host-side enqueues, never for the GPU; staging is
// bounded (size x slots x slot_bytes per rank) whatever the message size. group_end() interleaves
// all ops of the group piece by piece, so a step's sends and receives progress together.
//
// Faults: an abort flag and reason in the shared segment (first writer wins), dead peers noticed
// by pid, and a deadline on every group; all become stragg::Error / TimeoutError naming the rank
// and peers. Requires one process per rank (CUDA IPC handles cannot be opened in the process that
// created them). Destroy the object only after every rank's collectives have completed.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/gpu_p2p.h"
#include "runtime/rendezvous.h"

namespace stragg::gpu {

struct CudaIpcOptions {
  size_t slot_bytes = size_t{1} << 20;  // must be equal on all ranks (checked at setup)
  int slots = 4;                        // per directed channel
};

class CudaIpcP2P final : public GpuP2P {
 public:
  // Sets up the group of `size` ranks meeting under `key_prefix` in `rdv`. Throws stragg::Error
  // (TimeoutError after `timeout`) naming the rank and what failed.
  CudaIpcP2P(Rendezvous& rdv, const std::string& key_prefix, int rank, int size, int device,
             std::chrono::milliseconds timeout, CudaIpcOptions options = {});
  ~CudaIpcP2P() override;
  CudaIpcP2P(const CudaIpcP2P&) = delete;
  CudaIpcP2P& operator=(const CudaIpcP2P&) = delete;

  const char* name() const override { return "cuda-ipc"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  void group_start() override;
  void send(const void* buf, size_t bytes, int peer, cudaStream_t stream) override;
  void recv(void* buf, size_t bytes, int peer, cudaStream_t stream) override;
  void group_end(std::chrono::milliseconds timeout) override;

  std::optional<std::string> async_error() override;
  void abort(const std::string& reason) override;

  struct Shared;  // layout of the shared-memory segment (cuda_ipc_p2p.cc)

 private:
  struct Op {
    bool is_send;
    int peer;
    uint8_t* buf;
    size_t bytes;
    size_t done = 0;
    cudaStream_t stream;
  };
  bool progress(Op& op);  // enqueues at most one piece; true if it did
  std::string where() const;
  void cleanup() noexcept;

  int rank_;
  int size_;
  int device_;
  CudaIpcOptions opt_;
  std::vector<int64_t> pids_;

  Shared* shared_ = nullptr;
  size_t shared_bytes_ = 0;

  void* staging_ = nullptr;                // mine: size x slots x slot_bytes, indexed by sender
  std::vector<void*> peer_staging_;        // opened peers' staging (nullptr for me)
  std::vector<cudaEvent_t> ready_mine_;    // [peer * slots + slot]: channel me -> peer
  std::vector<cudaEvent_t> consumed_mine_; // [peer * slots + slot]: channel peer -> me
  std::vector<cudaEvent_t> ready_peer_;    // opened: channel peer -> me
  std::vector<cudaEvent_t> consumed_peer_; // opened: channel me -> peer
  std::vector<uint64_t> sent_pieces_;      // per peer: pieces enqueued to it
  std::vector<uint64_t> received_pieces_;  // per peer: pieces enqueued to copy out from it

  std::vector<Op> group_;
  bool in_group_ = false;
};

}  // namespace stragg::gpu
