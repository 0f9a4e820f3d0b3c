// The Work object stragg returns for the collectives its session runs.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>
#include <vector>

namespace stragg {

// Completed by the session's worker thread. wait() blocks until then and rethrows the error;
// getFuture() returns a future whose value is the list of output tensors (what DDP comm hooks and
// torch.futures expect), or which carries the error. The input tensors are recorded for the
// profiler (record_shapes), like Gloo's works.
class StraggWork final : public c10d::Work {
 public:
  StraggWork(int rank, c10d::OpType type, const char* profiling_title,
             std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type, profiling_title, outputs),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Called once, by the worker thread (or by the thread that cancels the call).
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace stragg
