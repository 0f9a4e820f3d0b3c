#include "session/serial_worker.h"

namespace stragg {

SerialWorker::SerialWorker() {
  std::shared_ptr<State> state = state_;
  thread_ = std::thread([state] { loop(state); });
  thread_id_ = thread_.get_id();
}

SerialWorker::~SerialWorker() {
  stop(false, "the worker was destroyed");
  // Destroyed by a job's closures on the worker thread: it cannot join itself; it finishes the
  // loop on the shared state (stopping, nothing queued) and exits.
  if (thread_.joinable()) thread_.detach();
}

bool SerialWorker::submit(Job job) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->stopping) return false;
    state_->queue.push_back(std::move(job));
  }
  state_->cv.notify_one();
  return true;
}

void SerialWorker::loop(const std::shared_ptr<State>& state) {
  State& s = *state;
  while (true) {
    {
      Job job;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.cv.wait(lock, [&] { return !s.queue.empty() || s.stopping; });
        if (s.queue.empty()) return;  // stopping and nothing left
        job = std::move(s.queue.front());
        s.queue.pop_front();
        s.running = true;
      }
      std::exception_ptr error;
      try {
        if (job.run) job.run();
      } catch (...) {
        error = std::current_exception();
      }
      if (job.finish) job.finish(error);
    }  // the job's closures are released here (possibly destroying the SerialWorker)
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.running = false;
    }
    s.cv.notify_all();
  }
}

void SerialWorker::stop(bool drain, const std::string& why) {
  std::deque<Job> cancelled;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->draining = state_->stopping ? state_->draining && drain : drain;
    state_->stopping = true;
    if (!state_->draining) cancelled.swap(state_->queue);
  }
  state_->cv.notify_all();
  for (auto& job : cancelled) {
    if (job.cancel) job.cancel(why);
  }
  if (on_worker_thread()) return;
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool SerialWorker::busy() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->running;
}

size_t SerialWorker::pending() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->queue.size() + (state_->running ? 1 : 0);
}

bool SerialWorker::stopped() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stopping;
}

}  // namespace stragg
