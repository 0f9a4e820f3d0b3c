// The Work object stragg returns for the collectives its session runs.
#pragma once

#include <ATen/ThreadLocalState.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace stragg {

// Completed by the session's worker thread. wait() blocks until then and rethrows the error;
// getFuture() returns a future whose value is the list of output tensors (what DDP comm hooks and
// torch.futures expect), or which carries the error. The input tensors are recorded for the
// profiler (record_shapes), like Gloo's works. The future is made when first asked for (a plain
// dist.all_reduce never asks): a small call does not pay for it.
class StraggWork final : public c10d::Work {
 public:
  StraggWork(int rank, c10d::OpType type, const char* profiling_title,
             std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type, profiling_title,
                   profiling_title != nullptr
                       ? std::optional<std::vector<at::Tensor>>(outputs)
                       : std::nullopt),
        outputs_(std::move(outputs)) {}

  // Opens the call's torch.profiler range now, where c10d::Work opens it at construction (pass
  // no title then): `title`, the outputs as its inputs (record_shapes) and `kwargs` (the trace
  // event's args), async like c10d::Work's; complete() ends it. Nothing without a profiler.
  void begin_profiler_range(const char* title,
                            const std::unordered_map<std::string, c10::IValue>& kwargs) {
    auto range = std::make_shared<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (!range->isActive()) return;
    range->_setAsync();
    const std::vector<c10::IValue> inputs(outputs_.begin(), outputs_.end());
    range->before(title, &inputs, &kwargs);
    std::function<void()> end = [range] { range->end(); };
    std::lock_guard<std::mutex> lock(mutex_);
    recordFunctionEndCallback_ = at::wrapPropagateTLSState(std::move(end));
  }

  std::vector<at::Tensor> result() override { return outputs_; }
  const std::vector<at::Tensor>& outputs() const { return outputs_; }

  // The contiguous tensor the collective runs on, kept alive until the call is done; when it is
  // not the output itself (`copy_back`), the result is copied from it into the outputs.
  void keep_buffer(at::Tensor buffer, bool copy_back) {
    buffer_ = std::move(buffer);
    copy_back_ = copy_back;
  }
  const at::Tensor& buffer() const { return buffer_; }
  bool needs_copy_back() const { return copy_back_; }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mu_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
      if (completed_call_) settle(*future_);  // no callbacks yet: fine under the lock
    }
    return future_;
  }

  // Called once, by the worker thread (or by the thread that cancels the call).
  void complete(std::exception_ptr error) {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    {
      std::lock_guard<std::mutex> lock(future_mu_);
      completed_call_ = true;
      error_ = error;
      future = future_;
    }
    if (future) settle(*future);  // outside the lock: runs the future's callbacks
    finish(error);
  }

 private:
  void settle(c10::ivalue::Future& future) {
    if (error_) {
      future.setError(error_);
    } else {
      future.markCompleted(c10::IValue(outputs_));
    }
  }

  std::vector<at::Tensor> outputs_;
  at::Tensor buffer_;
  bool copy_back_ = false;
  std::mutex future_mu_;
  bool completed_call_ = false;  // complete() ran (under future_mu_)
  std::exception_ptr error_;     // its error (set before completed_call_, under future_mu_)
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made by the first getFuture()
};

}  // namespace stragg
