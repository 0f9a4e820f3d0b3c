// The CUDA all_reduce calls enqueued on the GPU (cuda_allreduce.cc), oldest first, and the poller
// thread that completes their Work when its completion event fires, or fails them (timeout, the
// p2p layer aborted, shutdown). Compiled only with -DSTRAGG_BACKEND_CUDA, like cuda_allreduce.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "backend/cuda_work.h"

namespace stragg {

namespace gpu {
class GpuP2P;
}

class CudaInFlight {
 public:
  CudaInFlight() = default;
  // stop() with no grace, if it was not called.
  ~CudaInFlight();
  CudaInFlight(const CudaInFlight&) = delete;
  CudaInFlight& operator=(const CudaInFlight&) = delete;

  // Starts the poller on `device`; `p2p` (aborted when a call fails) must outlive it (stop()
  // joins it). Once, by the first call's setup; after stop() the poller exits at once.
  void start(int device, gpu::GpuP2P& p2p);
  // The session's worker: `work` is enqueued (its completion event recorded); it fails if it did
  // not complete within `timeout`.
  void add(c10::intrusive_ptr<CudaWork> work, std::chrono::milliseconds timeout);
  // The calls in flight get `grace` to finish (the earliest deadline of all stop() calls holds),
  // then they fail; joins the poller (unless called on it).
  void stop(std::chrono::milliseconds grace);

  // Calls the poller failed.
  int64_t failed() const { return failed_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Call {
    c10::intrusive_ptr<CudaWork> work;
    Clock::time_point deadline;
  };

  void poller_loop();
  // Completes the calls whose event fired (unless the group was aborted), fails the others.
  void fail_all(const std::string& msg);

  int device_ = -1;
  gpu::GpuP2P* p2p_ = nullptr;  // set by start(), before the poller runs
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Call> calls_;  // oldest first (they complete in this order)
  bool stop_ = false;
  Clock::time_point drain_deadline_ = Clock::time_point::max();
  std::thread poller_;
  std::atomic<int64_t> failed_{0};
};

}  // namespace stragg
