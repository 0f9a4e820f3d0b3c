#include "session/serial_worker.h"

namespace stragg {

SerialWorker::SerialWorker() : thread_([this] { loop(); }) {}

SerialWorker::~SerialWorker() { stop(false, "the worker was destroyed"); }

bool SerialWorker::submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void SerialWorker::run_job(Job& job) {
  std::exception_ptr error;
  try {
    if (job.run) job.run();
  } catch (...) {
    error = std::current_exception();
  }
  if (job.finish) job.finish(error);
}

bool SerialWorker::claim_inline() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || running_ || !queue_.empty()) return false;
  running_ = true;
  inline_thread_ = std::this_thread::get_id();
  return true;
}

void SerialWorker::run_claimed(Job& job) {
  run_job(job);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    inline_thread_ = std::thread::id();
    wake = !queue_.empty();
  }
  if (wake) cv_.notify_all();  // jobs submitted meanwhile: the worker takes them now
}

void SerialWorker::loop() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A job running inline keeps the queued ones waiting (issue order); stopping with nothing
      // queued ends the thread even then (the inline job may be the one stopping the worker).
      cv_.wait(lock,
               [&] { return (stopping_ && queue_.empty()) || (!queue_.empty() && !running_); });
      if (queue_.empty()) return;  // stopping and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    run_job(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    cv_.notify_all();
  }
}

bool SerialWorker::on_worker_thread() const {
  const auto me = std::this_thread::get_id();
  if (me == thread_.get_id()) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return running_ && me == inline_thread_;
}

void SerialWorker::stop(bool drain, const std::string& why) {
  std::deque<Job> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = stopping_ ? draining_ && drain : drain;
    stopping_ = true;
    if (!draining_) cancelled.swap(queue_);
  }
  cv_.notify_all();
  for (auto& job : cancelled) {
    if (job.cancel) job.cancel(why);
  }
  if (on_worker_thread()) return;
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool SerialWorker::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

size_t SerialWorker::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + (running_ ? 1 : 0);
}

bool SerialWorker::stopped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

}  // namespace stragg
