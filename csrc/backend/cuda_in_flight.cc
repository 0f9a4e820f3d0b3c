// CudaInFlight: the CUDA all_reduce calls in flight and their poller; see cuda_in_flight.h.
#ifndef STRAGG_BACKEND_CUDA
#error "cuda_in_flight.cc is compiled only with -DSTRAGG_BACKEND_CUDA (CMake STRAGG_BACKEND_CUDA)"
#endif

#include "backend/cuda_in_flight.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include "backend/dist_error.h"
#include "common/error.h"
#include "kernels/cuda_check.h"
#include "kernels/gpu_p2p.h"

namespace stragg {

CudaInFlight::~CudaInFlight() { stop(std::chrono::milliseconds(0)); }

void CudaInFlight::start(int device, gpu::GpuP2P& p2p) {
  device_ = device;
  p2p_ = &p2p;
  poller_ = std::thread([this] { poller_loop(); });
}

void CudaInFlight::add(c10::intrusive_ptr<CudaWork> work, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({std::move(work), deadline});
  }
  cv_.notify_all();
}

void CudaInFlight::stop(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    drain_deadline_ = std::min(drain_deadline_, Clock::now() + grace);
  }
  cv_.notify_all();
  if (poller_.joinable() && poller_.get_id() != std::this_thread::get_id()) poller_.join();
}

void CudaInFlight::fail_all(const std::string& msg) {
  std::deque<Call> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    victims.swap(calls_);
  }
  for (auto& f : victims) {
    // A call whose event fired completed, unless the group was aborted: an aborted NCCL kernel
    // can exit without having moved the data.
    if (cudaEventQuery(f.work->done_event()) == cudaSuccess && !p2p_->async_error()) {
      f.work->mark_done();
    } else if (f.work->mark_failed(dist_error(f.work->where() + ": " + msg))) {
      failed_.fetch_add(1);
    }
  }
}

void CudaInFlight::poller_loop() {
  (void)cudaSetDevice(device_);  // no context gets created on another device
  auto sleep = std::chrono::microseconds(5);
  while (true) {
    Call front;
    Clock::time_point drain;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !calls_.empty(); });
      if (calls_.empty()) return;  // stopping and drained
      front = calls_.front();
      drain = drain_deadline_;
    }
    const cudaError_t rc = cudaEventQuery(front.work->done_event());
    if (rc == cudaSuccess && !p2p_->async_error()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!calls_.empty() && calls_.front().work == front.work) calls_.pop_front();
      }
      front.work->mark_done();
      sleep = std::chrono::microseconds(5);
      continue;
    }
    std::optional<std::string> reason;
    if (auto err = p2p_->async_error()) {
      reason = "the process group was aborted: " + *err;
    } else if (rc != cudaErrorNotReady) {
      reason = "cudaEventQuery: " + gpu::cuda_error_text(rc);
    } else {
      const auto now = Clock::now();
      if (now >= front.deadline) {
        reason = "did not finish on the GPU within the timeout (a peer did not take part or a "
                 "GPU is stuck); the process group is aborted";
      } else if (now >= drain) {
        reason = "still running on the GPU when the process group was shut down; it is aborted";
      }
    }
    if (reason) {
      p2p_->abort(front.work->where() + ": " + *reason);  // releases peers (and NCCL kernels)
      fail_all(*reason);
      continue;
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, sleep, [&] { return drain_deadline_ != drain; });  // shutdown wakes it
    }
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace stragg
