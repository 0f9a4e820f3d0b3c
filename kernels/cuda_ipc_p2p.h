// GpuP2P for ranks on one node (several may share one GPU), over CUDA IPC.
//
// The protocol (staging slots per directed channel, events, counters; staged_p2p.h) runs on the
// CUDA device: each rank's staging area is device memory exported with cudaIpcGetMemHandle, the
// events are interprocess events (cudaIpcGetEventHandle), and the shared block (counters, abort
// flag, arrivals) is a POSIX shared-memory segment created by rank 0. Setup exchanges the handles
// through a Rendezvous. The protocol itself also runs on the host device in CI (host/host_p2p.h);
// this class's setup, and the protocol on CUDA, need a GPU (tests/gpu/README.md).
//
// Dead peers are noticed by pid. Requires one process per rank (CUDA IPC handles cannot be opened
// in the process that created them). Destroy the object only after every rank's collectives have
// completed.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/rendezvous.h"
#include "kernels/staged_p2p.h"

namespace stragg::gpu {

struct CudaIpcOptions {
  size_t slot_bytes = size_t{1} << 20;  // must be equal on all ranks (checked at setup)
  int slots = 4;                        // per directed channel
};

class CudaIpcP2P final : public StagedP2P {
 public:
  // Sets up the group of `size` ranks meeting under `key_prefix` in `rdv`. Throws stragg::Error
  // (TimeoutError after `timeout`) naming the rank and what failed.
  CudaIpcP2P(Rendezvous& rdv, const std::string& key_prefix, int rank, int size, int device,
             std::chrono::milliseconds timeout, CudaIpcOptions options = {});
  ~CudaIpcP2P() override;
  CudaIpcP2P(const CudaIpcP2P&) = delete;
  CudaIpcP2P& operator=(const CudaIpcP2P&) = delete;

  const char* name() const override { return "cuda-ipc"; }

 private:
  bool peer_gone(int q) override;
  void setup(Rendezvous& rdv, const std::string& key_prefix, std::chrono::milliseconds timeout,
             std::string& shm_name);
  void create_shared(std::string& shm_name);
  void open_shared(const std::string& shm_name);
  void open_peer(int q, const std::vector<std::string>& fields);
  void cleanup() noexcept;

  std::vector<int64_t> pids_;
  void* shared_map_ = nullptr;  // the mapped segment
  size_t shared_map_bytes_ = 0;
};

}  // namespace stragg::gpu
