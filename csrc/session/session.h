// The coordinator of one process group (no torch here): everything between the torch adapter
// (csrc/backend) and the executor. A Session
//  * sets the group up (group_setup.h: hello exchange, settings that must match, transport),
//  * owns the worker thread that runs the calls in issue order (serial_worker.h),
//  * asks the planner which schedule a call runs (plan/planner.h), agreeing per call on the
//    straggler in dynamic mode (wait-or-proceed window: plan/wait_or_proceed.h),
//  * runs the schedule on the executor over the transport (runtime/executor.h),
//  * feeds the profiler and runs its exchanges and link probes (group_profiler.h),
//  * keeps the per-call records and counters users read (stragg.recent_calls, backend_stats).
// Tests drive it over in-process transports with threads as ranks (tests/cpp/test_session.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/rendezvous.h"
#include "plan/planner.h"
#include "plan/settings.h"
#include "runtime/dtype.h"
#include "runtime/executor.h"
#include "session/call_record.h"
#include "session/call_tracer.h"
#include "session/group_profiler.h"
#include "session/serial_worker.h"
#include "transport/transport.h"

namespace stragg {

struct SessionOptions {
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // setup; calls' default
  std::string group_name;
  Settings settings;
  std::string store_host;  // host of the rendezvous store: its route picks the TCP address
  // Dynamic straggler without a shared-memory board (TCP): where arrivals meet (the adapter
  // builds one on the c10d store). Null: dynamic mode needs the transport's board.
  std::function<std::unique_ptr<ArrivalBoard>()> make_store_board;
};

// How all_reduce runs: in-process (one rank), on stragg's executor over a transport, or
// delegated to the inner backend (AllreduceCall::delegate).
enum class AllreducePath { Local, Executor, Delegate };

// One all_reduce, in place on `data` (contiguous, `numel` elements of `dtype`).
struct AllreduceCall {
  const char* name = "all_reduce";
  void* data = nullptr;
  size_t numel = 0;
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;
  bool premul = false;  // PREMUL_SUM: scale by premul_factor first
  double premul_factor = 1.0;
  bool average = false;  // AVG: divide by the group size after the SUM
  std::chrono::milliseconds timeout{0};
  // Delegate path only: reduces `data` in place on another backend with op/dtype (premul and
  // average are applied around it by the session).
  std::function<void()> delegate;
  // Worker thread, exactly once: nullptr when `data` holds the result, else the error (a
  // stragg::Error naming rank, call and cause). Also called, with the cancellation error, if the
  // session stops before the call runs.
  std::function<void(std::exception_ptr)> done;
  // Told where the call is (call_tracer.h); null: nobody traces it (no cost).
  std::shared_ptr<CallTracer> tracer;
};

// A call whose data moves elsewhere (the CUDA path: GPU executor over NCCL / CUDA IPC) but
// that runs in this session's issue order, so it sees the same planner and profiler state on
// every rank. Before `run`, the ranks all-gather the call's header over the CPU transport (when
// the group has one): a different numel, dtype or op raises on every rank naming the mismatch.
struct ExternalCall {
  const char* name = "all_reduce";
  size_t numel = 0;
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;
  std::chrono::milliseconds timeout{0};
  // Worker thread: carry the call out (e.g. enqueue it on a GPU stream) with the planner's
  // choice (nullptr when the group has no CPU transport to agree on: the caller chooses);
  // `seq` is the call's number on this group (shared with CPU calls).
  std::function<void(const PlanChoice* choice, uint64_t seq)> run;
  // Worker thread, exactly once: the error of the header exchange or of `run` (nullptr: none),
  // or the cancellation error if the session stops first.
  std::function<void(std::exception_ptr)> done;
};

class Session {
 public:
  // Collective over the group: setup (throws stragg::Error / TimeoutError / SettingsError naming
  // the problem; nothing is left behind).
  Session(Rendezvous& rdv, SessionOptions options);
  // Drains the calls still queued (each bounded by its timeout), then stops.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return opt_.rank; }
  int size() const { return opt_.size; }
  AllreducePath path() const { return path_; }
  bool same_host() const { return same_host_; }
  const Settings& settings() const { return opt_.settings; }
  // "local", "shm", "tcp" or "gloo" (delegated).
  std::string transport_name() const;
  // What the group runs: the fixed algorithm or "auto" ("gloo" when delegated, "local" alone).
  std::string algorithm_name() const;
  Straggler straggler() const;

  // Queues a call; returns its sequence number (0, 1, ... on this group). Throws stragg::Error
  // at once if the session was shut down or aborted (by any rank), with the original cause.
  uint64_t submit(AllreduceCall call);
  // Queues an external call (see ExternalCall); returns its sequence number.
  uint64_t submit_external(ExternalCall call);
  // Collective, queued like a call: runs a link probe; done(error) on the worker thread.
  void measure_links(std::function<void(std::exception_ptr)> done);
  // dist.barrier: a one-element all_reduce on the executor, queued behind every call issued
  // before it (so it also waits for those), run on the calling thread when nothing is queued
  // (like a small call). Not an all_reduce for the records, the counters or the profiler; a
  // stall or failure names it "barrier after call #4" (the user's last all_reduce).
  // done(error) exactly once, on the thread that ran it (or cancelled it). Throws stragg::Error
  // at once if the session no longer takes calls or delegates all_reduce (path() == Delegate).
  void barrier(std::chrono::milliseconds timeout, std::function<void(std::exception_ptr)> done);

  // Counters (allreduce_calls, allreduce_bytes, failed_calls, barrier_calls, busy_us, wait_us,
  // pre_arrival_us, agreement_us, dynamic_straggler_calls, dynamic_plain_calls, last_straggler,
  // rank, size, transport options).
  std::map<std::string, int64_t> stats() const;
  // The last calls, oldest first (at most kCallHistory).
  std::vector<CallRecord> recent_calls() const;
  static constexpr size_t kCallHistory = 1024;

  // Profiler state (identical on every rank after each exchange); *enabled = false if profiling
  // is off or all_reduce does not run on the executor.
  ProfilerSummary profiler_summary(bool* enabled) const;
  const ProfilerSettings& profiler_settings() const { return profiler_settings_; }
  LinkModel link_model(std::string* source) const;
  std::vector<LinkModel> link_matrix() const;
  // Per-rank link speeds and degraded ranks from the last link probe.
  LinkAnalysis link_analysis() const;
  // The dynamic straggler's wait-or-proceed window for a call of `bytes`.
  std::chrono::microseconds dynamic_window_for(size_t bytes) const;

  // Like ProcessGroupNCCL's: shutdown() stops accepting calls and runs the queued ones to
  // completion (each bounded by its timeout); abort() fails the running call and cancels the
  // queued ones with `why`, and tells every peer the group is unusable, so their calls raise at
  // once. Both idempotent; after either, every call raises.
  void shutdown(const std::string& why);
  void abort(const std::string& why);
  // The reason the group was aborted (by any rank, by an executor failure or abort()), if it was.
  std::optional<std::string> abort_reason() const;
  // Why the group cannot be used any more: "aborted: <the first reason>" or "shut down";
  // empty while it is usable. What the adapter names when any op on the group is refused.
  std::optional<std::string> failure() const;
  // Peers whose process or connection is gone (Transport::gone_peers; empty without a
  // transport). For shrink_group's agreement, after shutdown() or abort().
  std::vector<int> gone_peers() const;

 private:
  // Queueing and running calls (session_run.cc).
  uint64_t enqueue(SerialWorker::Job job, const char* name,
                   std::function<void(std::exception_ptr)> done);
  void run_call(AllreduceCall& call, CallRecord& record);
  void run_on_executor(AllreduceCall& call, CallRecord& record);
  void run_external(ExternalCall& call, uint64_t seq);
  void check_external_header(const ExternalCall& call, uint64_t seq);
  void run_barrier(std::chrono::milliseconds timeout);
  CollectiveSpec next_spec(const char* name, DType dtype, size_t numel, bool internal);

  // What a call runs (session_decide.cc), the same on every rank.
  struct CallDecision {
    bool oneshot = false;                             // the one-shot all_reduce (no schedule)
    std::shared_ptr<const LoweredSchedule> schedule;  // else the planner's choice for this rank
  };
  // Fills the record's algorithm, schedule name, straggler, window and prediction.
  CallDecision decide_call(const CollectiveSpec& spec, AllreduceCall& call, CallRecord& record);
  PlanChoice decide_external(const ExternalCall& call) const;
  int call_straggler(const CollectiveSpec& spec, size_t bytes, AllreduceCall& call,
                     CallRecord& record);
  bool oneshot_fits(const PlanChoice& choice, size_t bytes) const;

  // The record and the counters of a finished call (session_record.cc).
  void finish_call(AllreduceCall& call, CallRecord& record, std::exception_ptr error);

  std::string prefix() const;
  // Throws stragg::Error "stragg: rank R: <op> on a process group that was <state>".
  [[noreturn]] void refuse(const char* op, const std::string& state) const;

  SessionOptions opt_;
  ProfilerSettings profiler_settings_;
  AllreducePath path_ = AllreducePath::Local;
  bool same_host_ = true;
  std::vector<int> host_of_;  // host index of every rank (group_setup)
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Planner> planner_;
  std::unique_ptr<GroupProfiler> profiler_;
  std::unique_ptr<ArrivalBoard> store_board_;
  std::unique_ptr<SerialWorker> worker_;

  mutable std::mutex submit_mu_;
  uint64_t next_seq_ = 0;
  std::string stop_reason_;  // "shut down" / "aborted" once stopped
  std::string local_abort_;  // this rank's abort reason (also the only one without a transport)

  // Worker-thread state.
  uint64_t wire_seq_ = 0;    // collectives on the wire (user calls and internal ones)
  uint64_t oneshot_calls_ = 0;  // one-shot all_reduces so far (OneshotArea's index)
  uint64_t agreements_ = 0;  // dynamic straggler agreements so far (the arrival board's key)
  int64_t current_call_ = -1;  // the user call running (or last run): errors name it
  PlanChoice last_choice_;     // the last call's choice and its description (records)
  std::string last_schedule_name_;

  std::atomic<int64_t> allreduce_calls_{0};
  std::atomic<int64_t> allreduce_bytes_{0};
  std::atomic<int64_t> failed_calls_{0};
  std::atomic<int64_t> barrier_calls_{0};
  std::atomic<int64_t> dynamic_straggler_calls_{0};  // agreed on a straggler: StragglAR ran
  std::atomic<int64_t> dynamic_plain_calls_{0};      // everybody in time: plain Ring ran
  std::atomic<int64_t> last_straggler_{-1};
  mutable std::mutex history_mu_;
  std::deque<CallRecord> history_;
  ExecutorStats executor_totals_;  // copy of the executor's counters after each call
};

}  // namespace stragg
