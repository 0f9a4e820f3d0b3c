// GpuP2P between in-process ranks on host devices: the staged protocol of CUDA IPC
// (kernels/staged_p2p.h) with host memory for the staging areas, host events, and the shared
// block in process memory. CI runs the GPU executor over it (no torch, no CUDA).
//
// Usage: one HostP2PGroup for the group, then each rank (a thread) constructs its HostP2P with
// its own HostDevice; the constructor waits until every rank has joined. Declare the group before
// the devices: the devices' streams may still copy into staging areas until they are destroyed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/host/host_device.h"
#include "kernels/staged_p2p.h"

namespace stragg::gpu::host {

class HostP2PGroup {
 public:
  // `size` ranks; staging of `slots` slots of `slot_bytes` per directed channel.
  explicit HostP2PGroup(int size, size_t slot_bytes = size_t{64} << 10, int slots = 2);
  ~HostP2PGroup();
  HostP2PGroup(const HostP2PGroup&) = delete;
  HostP2PGroup& operator=(const HostP2PGroup&) = delete;

  int size() const { return size_; }

 private:
  friend class HostP2P;
  struct Member {
    bool joined = false;
    std::atomic<bool> gone{false};
    uint8_t* staging = nullptr;
    std::vector<Event> ready;     // recorded by this rank: [peer * slots + slot], me -> peer
    std::vector<Event> consumed;  // recorded by this rank: [peer * slots + slot], peer -> me
  };

  int size_;
  size_t slot_bytes_;
  int slots_;
  void* shared_ = nullptr;  // StagedP2P::shared_bytes(size), zero-initialised
  std::vector<std::unique_ptr<uint8_t[]>> staging_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Member> members_;
};

class HostP2P final : public StagedP2P {
 public:
  // Joins `group` as `rank` on `device` (its index is this rank's device()). Throws
  // stragg::TimeoutError naming the ranks that did not join within `timeout`.
  HostP2P(HostP2PGroup& group, int rank, HostDevice& device, std::chrono::milliseconds timeout);
  // The rank leaves: peers waiting for it fail with "rank R has died" (its process ended).
  ~HostP2P() override;
  HostP2P(const HostP2P&) = delete;
  HostP2P& operator=(const HostP2P&) = delete;

  const char* name() const override { return "host"; }

 private:
  bool peer_gone(int q) override;
  HostP2PGroup& group_;
};

}  // namespace stragg::gpu::host
