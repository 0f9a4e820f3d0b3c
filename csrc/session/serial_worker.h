// One thread that runs jobs in the order they were submitted (no torch here). Both all_reduce
// paths use it: the CPU session (csrc/session/session.h) and the CUDA path
// (csrc/backend/cuda_allreduce.cc), so issue order, failure reporting and shutdown work the same.
//
// A job is run(), then finish(error) with the exception run() threw (or nullptr), always on the
// worker thread; a job still queued when the worker stops without draining gets cancel(why)
// instead, on the stopping thread. finish/cancel must not throw.
//
// The worker may be destroyed by its own thread: when a job's closures hold the last reference
// to the worker's owner (a Work that keeps its process group alive), releasing them runs the
// owner's destructor there. The queue and flags are shared with the thread, which is then
// detached and leaves its loop without touching the destroyed object.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace stragg {

class SerialWorker {
 public:
  struct Job {
    std::function<void()> run;
    std::function<void(std::exception_ptr error)> finish;
    std::function<void(const std::string& why)> cancel;
  };

  SerialWorker();
  // Stops with drain = false and "the worker was destroyed" if stop() was not called.
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues a job. Returns false (and does not take the job) once stop() was called.
  bool submit(Job job);
  // Stops accepting jobs. drain = true: the queued jobs still run, in order; false: they are
  // cancelled with `why`. Then waits for the worker thread (unless called from it). Idempotent:
  // later calls only cancel what is still queued.
  void stop(bool drain, const std::string& why);
  // A job is running now.
  bool busy() const;
  // Jobs submitted and not finished or cancelled yet (queued + running).
  size_t pending() const;
  bool stopped() const;
  // True when called from the worker thread.
  bool on_worker_thread() const { return std::this_thread::get_id() == thread_id_; }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> queue;
    bool stopping = false;
    bool draining = false;
    bool running = false;
  };
  static void loop(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::mutex join_mu_;  // one thread joins
  std::thread thread_;
  std::thread::id thread_id_;
};

}  // namespace stragg
