// The steps of a LoweredSchedule in flight (no torch here): the executor's progress engine.
//
// The schedule IR's semantics are lockstep: in a step every send reads the data as it was at the
// start of the step and receives are applied at its end. Running the steps strictly one after
// another honours that, but couples unrelated transfers: a rank cannot start the send of step
// d+1 on one link until the receive of step d on another link has finished, even when that send
// reads data the receive does not touch (OptCC's straggler sends its raw contribution every
// window, whatever it receives). On a network whose links differ, that coupling leaves the slow
// link idle while a fast one finishes, and every jitter of one transfer delays all others.
//
// A StepWindow keeps up to `lookahead` consecutive steps posted. An op of a later step may run
// as soon as the data it touches is ready, i.e. it waits only for the unfinished ops of earlier
// steps it conflicts with:
//   * a send waits for earlier receives into an overlapping range (it must read their result);
//   * a receive waits for earlier sends reading an overlapping range (they must read the old
//     data) and for earlier receives into it (reductions keep the schedule's order);
// plus FIFO per peer and direction (messages between two ranks keep the schedule's order, so
// headers still match step for step). Within a step the existing rules stay: receives that
// overlap a send of the same step follow it (RecvOp::limit) or are staged and applied when the
// step's ops are all done. The result is bitwise the same as lockstep execution: every byte is
// reduced and copied by the same operations in the same order; only independent transfers
// overlap. lookahead = 1 is the lockstep executor.
//
// An Executor keeps one StepWindow and start()s it for every run: the posted steps live in
// `lookahead` slots whose op, sink and dependency lists keep their capacity from run to run, so
// once calls of a shape have run, the next one allocates nothing here (small calls would
// otherwise pay a dozen allocations each).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/lowered_schedule.h"
#include "runtime/step_sink.h"
#include "transport/transport.h"

namespace stragg {

struct CollectiveSpec;
struct ExecutorStats;

class StepWindow {
 public:
  StepWindow(Transport& transport, size_t lookahead, ExecutorStats& stats);
  StepWindow(const StepWindow&) = delete;
  StepWindow& operator=(const StepWindow&) = delete;

  // Begins running `plan` on `buf` (spec.numel elements of spec.dtype); plan and spec must
  // outlive the run. Whatever a previous run left posted is dropped.
  void start(const LoweredSchedule& plan, const CollectiveSpec& spec, uint8_t* buf);
  // Runs whose buffer has at least this many bytes write their copying receives with
  // non-temporal stores (runtime/streaming_copy.h); 0: never. Takes effect at the next start().
  void set_streaming_bytes(size_t bytes) { streaming_bytes_ = bytes; }

  // Posts steps up to the lookahead and progresses every op that may run. True if anything
  // moved (bytes, a step completed or was posted). Throws stragg::Error from the transport or a
  // rejected header.
  bool progress();
  bool done() const { return retired_ == plan_->steps.size(); }
  // Peers this rank waits for: those of the unfinished ops of the posted steps that wait for no
  // earlier op of this rank, sorted, once each (into `out`, whose capacity is reused).
  void awaited(std::vector<int>& out) const;
  // Index of the earliest step not completed yet (== number of steps when done).
  size_t current_step() const { return retired_; }
  // When the last pre-arrival step completed (time_point{} if none did).
  std::chrono::steady_clock::time_point pre_arrival_end() const { return pre_arrival_end_; }
  // Pre-arrival steps completed so far in this run.
  size_t pre_arrival_steps_done() const { return pre_arrival_done_; }

 private:
  struct Dep {
    size_t step;  // absolute step index
    bool send;
    size_t index;  // within the step's sends / recvs
  };
  // A posted step. Reused: post() refills the lists of the slot it takes (capacity kept).
  struct Active {
    size_t index = 0;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    std::vector<StepSink> sinks;  // recvs[i].sink points to sinks[i]
    std::vector<std::vector<Dep>> send_deps, recv_deps;
    bool complete = false;  // every op done, staged receives applied
  };

  // Steps kept posted in this run: the window's, or more where the plan asks (LoweredSchedule).
  size_t run_lookahead() const { return run_lookahead_; }
  void post(size_t step_index);
  void add_deps(Active& a);
  bool dep_satisfied(const Dep& d) const;
  bool ready(std::vector<Dep>& deps) const;
  bool peer_busy(size_t step_index, bool send, size_t index) const;
  bool progress_step(Active& a);
  const Active* find(size_t step_index) const;
  // The i-th posted step (i < posted_), in step order.
  Active& slot(size_t i) { return slots_[(head_ + i) % slots_.size()]; }
  const Active& slot(size_t i) const { return slots_[(head_ + i) % slots_.size()]; }

  Transport& t_;
  const size_t lookahead_;
  size_t run_lookahead_;
  const bool limits_;
  ExecutorStats& stats_;
  const LoweredSchedule* plan_ = nullptr;
  const CollectiveSpec* spec_ = nullptr;
  uint8_t* buf_ = nullptr;
  size_t elem_ = 0;
  size_t streaming_bytes_ = 0;
  bool stream_copies_ = false;  // this run's
  std::vector<Active> slots_;  // run_lookahead_ of them, a ring: step retired_ + i in slot(i)
  size_t head_ = 0;            // slot of step retired_
  size_t posted_ = 0;          // steps [retired_, retired_ + posted_) are posted
  size_t retired_ = 0;
  std::chrono::steady_clock::time_point pre_arrival_end_{};
  size_t pre_arrival_done_ = 0;
};

}  // namespace stragg
