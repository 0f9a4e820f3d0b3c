#include "session/serial_worker.h"

namespace stragg {

SerialWorker::SerialWorker() {
  std::shared_ptr<State> state = state_;
  thread_ = std::thread([state] { loop(state); });
  thread_id_ = thread_.get_id();
}

SerialWorker::~SerialWorker() {
  stop(false, "the worker was destroyed");
  // Destroyed on the worker thread (by a job's closures) or by a job running inline: the thread
  // cannot be joined here; it finishes its loop on the shared state (stopping) and exits.
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
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->stopping || state_->running || !state_->queue.empty()) return false;
  state_->running = true;
  state_->inline_thread = std::this_thread::get_id();
  return true;
}

void SerialWorker::run_claimed(Job& job) {
  const std::shared_ptr<State> state = state_;  // outlives this worker if the job destroys it
  run_job(job);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->running = false;
    state->inline_thread = std::thread::id();
    wake = !state->queue.empty() || state->stopping;
  }
  if (wake) state->cv.notify_all();  // jobs submitted meanwhile: the worker takes them now
}

void SerialWorker::loop(const std::shared_ptr<State>& state) {
  State& s = *state;
  while (true) {
    {
      Job job;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        // A job running inline keeps the queued ones waiting (issue order); stopping with
        // nothing queued ends the thread even then (the inline job may be the one stopping it).
        s.cv.wait(lock,
                  [&] { return (s.stopping && s.queue.empty()) || (!s.queue.empty() && !s.running); });
        if (s.queue.empty()) return;  // stopping and nothing left
        job = std::move(s.queue.front());
        s.queue.pop_front();
        s.running = true;
      }
      run_job(job);
    }  // the job's closures are released here (possibly destroying the SerialWorker)
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.running = false;
    }
    s.cv.notify_all();
  }
}

bool SerialWorker::on_worker_thread() const {
  const auto me = std::this_thread::get_id();
  if (me == thread_id_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->running && me == state_->inline_thread;
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
