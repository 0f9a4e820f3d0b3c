// Runs a LoweredSchedule over a Transport (no torch here). Knows nothing about which algorithm it
// runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/lowered_schedule.h"
#include "runtime/stall.h"
#include "runtime/step_window.h"
#include "transport/transport.h"

namespace stragg {

struct ExecutorStats {
  uint64_t runs = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t bytes_streamed = 0;  // of bytes_received, copied in with non-temporal stores
  double busy_s = 0;         // wall time inside run()
  double wait_s = 0;         // of which blocked waiting for peers (nothing could move)
  double pre_arrival_s = 0;  // of which in pre-arrival steps (straggler not involved)
  double agreement_s = 0;    // wall time inside agree_on_straggler()
};

// Told, on the thread that runs a schedule, where the run is (Executor::run's `observer`): the
// session's tracer turns it into profiler ranges (session/call_tracer.h).
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  // This rank's last pre-arrival step completed (StragglAR: the ranks on time have
  // reduce-scattered among themselves; every later step involves the straggler). Called once,
  // only for plans that have pre-arrival steps on this rank.
  virtual void pre_arrival_done() = 0;
};

class Executor {
 public:
  // Steps of a plan kept in flight at once (see runtime/step_window.h; 1: lockstep).
  static constexpr size_t kDefaultLookahead = 8;

  explicit Executor(Transport& transport, size_t lookahead = kDefaultLookahead)
      : transport_(transport), window_(transport, lookahead, stats_) {}

  // Executes `plan` in place on `buf` (spec.numel elements of spec.dtype): up to the lookahead's
  // steps in flight, each op running once the data it touches is ready (runtime/step_window.h),
  // bitwise the same result as running the steps one by one. Throws stragg::Error
  // when peers disagree on the collective (message contains "mismatch" and the field), when a
  // peer dies or does not arrive before `timeout` (naming it), or when another rank aborted the
  // group. Any failure aborts the group for every rank (Transport::signal_abort), so the other
  // ranks raise promptly instead of hanging. One run at a time (the window is reused).
  // `observer` (may be null: nothing is checked) hears of the run's phases (RunObserver).
  void run(const LoweredSchedule& plan, const CollectiveSpec& spec, void* buf,
           std::chrono::milliseconds timeout, RunObserver* observer = nullptr);

  // The one-shot all_reduce (OneshotArea, transport.h) in place on `buf`: this rank's input goes
  // to its one-shot buffer, then it reduces all n inputs there in rank order (reduce_into, left
  // to right), so every rank holds bitwise the same result. `index`: the group's one-shot call
  // count (0, 1, ...), the same on every rank. The caller checks that the transport has an area
  // and that the input fits (else stragg::Error). Throws like run(): a peer whose call differs
  // (numel, dtype, op, sequence, or a peer that runs this collective as a schedule) raises
  // "mismatch" naming it.
  void run_oneshot(const CollectiveSpec& spec, void* buf, uint64_t index,
                   std::chrono::milliseconds timeout);

  // Dynamic straggler (StragglAR without a configured straggler): agrees with the other ranks,
  // through the transport's ArrivalBoard, on who is late for collective spec.seq. Returns -1
  // when every rank arrived within `window` of the (n-1)-th arrival (run the plain algorithm),
  // else the rank that arrived last. `board`: where the ranks meet (nullptr: the transport's).
  // `board_seq`: the agreement's number on the board (boards count agreements 0, 1, 2, ...;
  // default spec.seq, for groups whose every collective is an agreement).
  // Throws like run() on timeout, peer death or abort, and stragg::Error if there is no board.
  int agree_on_straggler(const CollectiveSpec& spec, std::chrono::microseconds window,
                         std::chrono::milliseconds timeout, ArrivalBoard* board = nullptr,
                         std::optional<uint64_t> board_seq = std::nullopt);

  // All_reduces of at least this many bytes write the data they receive by copying with
  // non-temporal stores, which skip reading the destination first (STRAGG_STREAMING_BYTES;
  // 0: never). Between runs only.
  void set_streaming_bytes(size_t bytes) { window_.set_streaming_bytes(bytes); }

  const ExecutorStats& stats() const { return stats_; }
  Transport& transport() { return transport_; }

 private:
  // Tells the peers where this rank is (Transport::publish_progress).
  void publish(const CollectiveSpec& spec, int32_t step, const std::vector<int>& awaiting);
  // Sets running_ for one run (throws if a run is in progress) and clears it however it ends.
  class RunGuard {
   public:
    RunGuard(Executor& ex, const CollectiveSpec& spec, const char* what);
    ~RunGuard() { flag_ = false; }
    RunGuard(const RunGuard&) = delete;
    RunGuard& operator=(const RunGuard&) = delete;

   private:
    bool& flag_;
  };
  // Nothing moved since `token` was taken at `now`: waits for the transport's next activity, at
  // most until the stall's deadline and 100 ms, and counts the time as waiting.
  void wait_for_peers(uint64_t token, const Stall& stall, std::chrono::steady_clock::time_point now);

  Transport& transport_;
  ExecutorStats stats_;
  StepWindow window_;  // reused by every run (its lists keep their capacity)
  bool running_ = false;
  // Reused by every run (no allocation per wait): the last published progress and the peers
  // awaited now.
  Progress progress_;
  std::vector<int> awaited_;
};

}  // namespace stragg
