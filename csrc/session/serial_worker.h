// One thread that runs jobs in the order they were submitted (no torch here). Both all_reduce
// paths use it: the CPU session (csrc/session/session.h) and the CUDA path
// (csrc/backend/cuda_allreduce.cc), so issue order, failure reporting and shutdown work the same.
//
// A job is run(), then finish(error) with the exception run() threw (or nullptr), on the worker
// thread -- or, through claim_inline/run_claimed, on the submitting thread when the worker is idle
// and nothing is queued (small calls then skip two thread hand-offs). Either way jobs run one at a
// time, in submission order. A job still queued when the worker stops without draining gets
// cancel(why) instead, on the stopping thread. finish/cancel must not throw.
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
  // Inline execution, in two parts so that a caller can claim its place in the order under its
  // own lock and run the job after releasing it. claim_inline(): true if no job is running or
  // queued and the worker was not stopped; the calling thread then holds the worker's turn (jobs
  // submitted meanwhile wait behind it) and must call run_claimed(job) next, which runs the job
  // (run, then finish) on the calling thread and gives the turn back.
  bool claim_inline();
  void run_claimed(Job& job);
  // Stops accepting jobs. drain = true: the queued jobs still run, in order; false: they are
  // cancelled with `why`. Then waits for the worker thread (unless called from it or from a job
  // running inline). Idempotent: later calls only cancel what is still queued.
  void stop(bool drain, const std::string& why);
  // A job is running now.
  bool busy() const;
  // Jobs submitted and not finished or cancelled yet (queued + running).
  size_t pending() const;
  bool stopped() const;
  // True when called from the worker thread, or from a thread running a job inline.
  bool on_worker_thread() const;

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Job> queue;
    bool stopping = false;
    bool draining = false;
    bool running = false;
    std::thread::id inline_thread;  // the thread running a job inline (none: default id)
  };
  static void loop(const std::shared_ptr<State>& state);
  static void run_job(Job& job);

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::mutex join_mu_;  // one thread joins
  std::thread thread_;
  std::thread::id thread_id_;
};

}  // namespace stragg
