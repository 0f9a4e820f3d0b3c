// The Work stragg returns for a collective it delegated to the inner Gloo / NCCL backend. It makes
// the group's abort total for those collectives too:
//  * waiting on it raises at once (instead of after the inner backend's own timeout) when the
//    group is aborted while the collective runs: by an executor failure, abort(), or any rank's
//    abort, with the original cause;
//  * when the inner collective fails, the group is aborted with that cause (like NCCL's watchdog
//    would), so every rank's next operation on the group raises at once.
// Everything else (result, future, completion) is the inner Work's. Works without a future
// (Gloo's send/recv, which complete inside their own wait()) are waited on directly: an abort
// does not interrupt them, their own failure still aborts the group.
#pragma once

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace stragg {

class DelegatedWork final : public c10d::Work {
 public:
  // Why the group cannot be used (Session::failure), or empty.
  using Failure = std::function<std::optional<std::string>()>;
  // Aborts the group with this cause.
  using OnError = std::function<void(const std::string& cause)>;

  // `on_success` (optional) runs when wait() returns without an error (the flight recorder).
  DelegatedWork(c10::intrusive_ptr<c10d::Work> inner, int rank, std::string op, Failure failure,
                OnError on_error, std::function<void()> on_success = nullptr)
      : c10d::Work(rank, inner->retrieveOpType()),
        inner_(std::move(inner)),
        op_(std::move(op)),
        failure_(std::move(failure)),
        on_error_(std::move(on_error)),
        on_success_(std::move(on_success)),
        wake_(std::make_shared<Wake>()) {
    try {
      // Wakes wait() when the inner collective completes (works without a future are polled).
      auto wake = wake_;
      inner_->getFuture()->addCallback([wake](c10::ivalue::Future&) {
        std::lock_guard<std::mutex> lock(wake->mu);
        wake->done = true;
        wake->cv.notify_all();
      });
      has_future_ = true;
    } catch (const c10::Error&) {
      // Gloo's send/recv works complete inside their own wait(): nothing to poll.
    }
  }

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override {
    using Clock = std::chrono::steady_clock;
    const bool bounded = timeout != ::kNoTimeout;
    const auto deadline = Clock::now() + timeout;
    while (has_future_ && !inner_->isCompleted()) {
      if (auto why = failure_()) {
        C10_THROW_ERROR(DistBackendError, "stragg: rank " + std::to_string(rank_) + ": " + op_ +
                                              " on a process group that was " + *why);
      }
      if (bounded && Clock::now() >= deadline) break;  // the inner wait reports its timeout
      std::unique_lock<std::mutex> lock(wake_->mu);
      wake_->cv.wait_for(lock, kPoll, [&] { return wake_->done; });
    }
    try {
      const bool done = !has_future_
                            ? inner_->wait(timeout)
                            : inner_->wait(bounded ? std::chrono::milliseconds(1) : ::kNoTimeout);
      if (done && on_success_) on_success_();
      return done;
    } catch (const c10::Error& e) {
      const std::string msg = e.msg();
      on_error_(op_ + " failed: " + msg.substr(0, msg.find('\n')));
      throw;
    } catch (const std::exception& e) {
      // Gloo rethrows its transport's own errors (gloo::IoException: a peer's connection
      // closed), which are no c10::Error.
      const std::string msg = e.what();
      on_error_(op_ + " failed: " + msg.substr(0, msg.find('\n')));
      throw;
    }
  }

 private:
  static constexpr auto kPoll = std::chrono::milliseconds(20);  // abort checks while waiting
  struct Wake {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };

  c10::intrusive_ptr<c10d::Work> inner_;
  std::string op_;
  Failure failure_;
  OnError on_error_;
  std::function<void()> on_success_;
  std::shared_ptr<Wake> wake_;
  bool has_future_ = false;  // else wait() is the inner one's (no abort checks while it runs)
};

}  // namespace stragg
