// The Work of one CUDA all_reduce (cuda_allreduce.h) and the CUDA events it waits on. Compiled
// only with -DSTRAGG_BACKEND_CUDA, like cuda_allreduce.cc.
//
// States: Queued (the session's worker has not enqueued the call yet), Enqueued (its GPU work
// and completion event are enqueued), Done (the event fired), Failed. wait() blocks the host only
// until the call is enqueued, then makes the caller's current stream wait for the completion
// event and rethrows the call's error; isCompleted() queries the event; the future (a list of
// the output tensors) is completed by the poller through mark_done / mark_failed.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct CUevent_st;

namespace stragg {

// A CUDA event (cudaEvent_t), destroyed with its last owner.
using EventPtr = std::shared_ptr<CUevent_st>;

// An event on `device` (timing disabled). Throws stragg::Error.
EventPtr make_event(int device);

class CudaWork final : public c10d::Work {
 public:
  // `where` names the call in errors ("stragg: rank R: all_reduce #S (gpu, nccl)"); `done` is
  // its completion event.
  CudaWork(int rank, int device, std::string where, at::Tensor output, EventPtr done);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // Makes the caller's current stream (of the tensor's device) wait for the collective. No-op
  // while the call is not enqueued yet or failed (wait() handles both).
  void synchronize() override;
  // Blocks the host until the call is enqueued on the GPU (not until it finished there), makes
  // the current stream wait for it and rethrows its error.
  bool wait(std::chrono::milliseconds timeout) override;

  CUevent_st* done_event() const { return done_.get(); }
  const std::string& where() const { return where_; }

  // Worker thread: the GPU work and the completion event are enqueued.
  void mark_enqueued();
  // Poller thread: the completion event fired.
  void mark_done();
  // Worker or poller thread (or shutdown): the call failed; returns false if it had already
  // completed.
  bool mark_failed(std::exception_ptr error);

 private:
  enum class State { Queued, Enqueued, Done, Failed };
  const int device_;
  const std::string where_;
  std::vector<at::Tensor> outputs_;
  EventPtr done_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  State state_ = State::Queued;
  std::exception_ptr error_;
};

}  // namespace stragg
