// GpuP2P over NCCL point-to-point (ncclSend / ncclRecv in ncclGroupStart / ncclGroupEnd).
//
// The communicator is created non-blocking (ncclConfig_t::blocking = 0) so that no NCCL call can
// hang the host: initialisation and every group are polled with ncclCommGetAsyncError until they
// leave ncclInProgress, with a deadline; on timeout or error the communicator is aborted
// (ncclCommAbort) and stragg::Error / TimeoutError is thrown, naming the rank.
// The ncclUniqueId goes through a Rendezvous (csrc/common/rendezvous.h): rank 0 publishes it.
#pragma once

#include <nccl.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>

#include "common/rendezvous.h"
#include "kernels/gpu_p2p.h"

namespace stragg::gpu {

class NcclP2P final : public GpuP2P {
 public:
  // Collective over the `size` ranks meeting under `key_prefix` in `rdv`; `device` must be this
  // rank's CUDA device. Throws stragg::Error / TimeoutError (after `timeout`) naming the rank.
  NcclP2P(Rendezvous& rdv, const std::string& key_prefix, int rank, int size, int device,
          std::chrono::milliseconds timeout);
  ~NcclP2P() override;
  NcclP2P(const NcclP2P&) = delete;
  NcclP2P& operator=(const NcclP2P&) = delete;

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }

  void group_start() override;
  void send(const void* buf, size_t bytes, int peer, cudaStream_t stream) override;
  void recv(void* buf, size_t bytes, int peer, cudaStream_t stream) override;
  void group_end(std::chrono::milliseconds timeout) override;

  std::optional<std::string> async_error() override;
  void abort(const std::string& reason) override;

  ncclComm_t comm() const { return comm_; }

 private:
  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress; aborts and throws
  // on an error or after `timeout`.
  void wait_ready(const std::string& what, std::chrono::milliseconds timeout);
  [[noreturn]] void fail(const std::string& what, ncclResult_t rc);
  std::string where() const;

  int rank_;
  int size_;
  int device_;
  ncclComm_t comm_ = nullptr;
  bool in_group_ = false;
  std::mutex mu_;  // guards aborted_ / reason_ (abort may come from a watchdog thread)
  bool aborted_ = false;
  std::string reason_;
};

}  // namespace stragg::gpu
