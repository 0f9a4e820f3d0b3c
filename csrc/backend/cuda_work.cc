// CudaWork and the CUDA events of the backend's CUDA all_reduce; see cuda_work.h.
#ifndef STRAGG_BACKEND_CUDA
#error "cuda_work.cc is compiled only with -DSTRAGG_BACKEND_CUDA (CMake STRAGG_BACKEND_CUDA)"
#endif

#include "backend/cuda_work.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <sstream>

#include "backend/dist_error.h"
#include "common/error.h"
#include "kernels/cuda_check.h"

namespace stragg {

EventPtr make_event(int device) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  cudaEvent_t ev = nullptr;
  const cudaError_t rc = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (rc != cudaSuccess) throw Error("cudaEventCreateWithFlags: " + gpu::cuda_error_text(rc));
  return EventPtr(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
}

CudaWork::CudaWork(int rank, int device, std::string where, at::Tensor output, EventPtr done)
    : c10d::Work(rank, c10d::OpType::ALLREDUCE, "stragg:all_reduce"),
      device_(device),
      where_(std::move(where)),
      outputs_{std::move(output)},
      done_(std::move(done)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

bool CudaWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (state_ == State::Done || state_ == State::Failed) return true;
    if (state_ == State::Queued) return false;
  }
  // Enqueued: the event says. A query error is left to the poller, which fails the call.
  return cudaEventQuery(done_.get()) == cudaSuccess;
}

bool CudaWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(m_);
  return state_ != State::Failed;
}

std::exception_ptr CudaWork::exception() const {
  std::lock_guard<std::mutex> lock(m_);
  return error_;
}

void CudaWork::synchronize() {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (state_ == State::Queued || state_ == State::Failed) return;
  }
  const auto dev = static_cast<c10::DeviceIndex>(device_);
  c10::cuda::CUDAGuard guard(dev);
  const cudaStream_t current = c10::cuda::getCurrentCUDAStream(dev).stream();
  const cudaError_t rc = cudaStreamWaitEvent(current, done_.get(), 0);
  if (rc != cudaSuccess) {
    throw_dist_error(where_ + ": Work.wait: cudaStreamWaitEvent: " + gpu::cuda_error_text(rc));
  }
}

bool CudaWork::wait(std::chrono::milliseconds timeout) {
  {
    std::unique_lock<std::mutex> lock(m_);
    auto started = [&] { return state_ != State::Queued; };
    if (timeout == ::kNoTimeout) {
      cv_.wait(lock, started);
    } else if (!cv_.wait_for(lock, timeout, started)) {
      std::ostringstream m;
      m << where_ << ": Work.wait timed out after " << timeout.count() / 1000.0
        << " s: the call was not enqueued on the GPU yet";
      throw_dist_error(m.str());
    }
    if (state_ == State::Failed) std::rethrow_exception(error_);
  }
  synchronize();
  std::lock_guard<std::mutex> lock(m_);
  if (state_ == State::Failed) std::rethrow_exception(error_);
  return true;
}

void CudaWork::mark_enqueued() {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (state_ != State::Queued) return;
    state_ = State::Enqueued;
  }
  cv_.notify_all();
}

void CudaWork::mark_done() {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (state_ == State::Done || state_ == State::Failed) return;
    state_ = State::Done;
  }
  cv_.notify_all();
  try {
    future_->markCompleted(c10::IValue(outputs_));
  } catch (const std::exception&) {
    // A callback attached with add_done_callback threw: its own problem, not the call's.
  }
  finish(nullptr);
}

bool CudaWork::mark_failed(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (state_ == State::Done || state_ == State::Failed) return false;
    state_ = State::Failed;
    error_ = error;
  }
  cv_.notify_all();
  try {
    future_->setError(error);
  } catch (const std::exception&) {
  }
  finish(error);
  return true;
}

}  // namespace stragg
