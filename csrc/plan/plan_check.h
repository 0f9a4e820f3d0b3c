// The planner's choice checked against measured times (no torch here).
//
// The profiler (a persistent straggler) and the link probes (degraded links) move a group away
// from the plan it ran, on the strength of a cost model. The model can be wrong for a network
// (it describes lock-step rounds; a pipelined TCP Ring beats that, StragglAR over TCP may not).
// So every such move is a trial: the batch of calls after it is timed (wall time per call on the
// ranks, the job's own compute included, probes and exchanges left out) against the batch
// before it. If the new plan made the job slower (by more than kTolerance), the move is undone
// and that straggler / that set of degraded ranks is not tried again for a while (4 exchanges,
// doubling with every failed trial of the same change, at most 64); while a set of degraded
// ranks is vetoed, those of its ranks that ran before it keep running (a failed {5, 6, 12} goes
// back to {5}, not to Ring). Moves back to the plain plan (no straggler, no degraded link) need
// no trial. Every input is exchanged, so every rank takes the same decisions.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "plan/link_model.h"

namespace stragg {

// What the session applies: the straggler StragglAR runs for (-1: none) and the degraded ranks
// the planner knows of (empty: none).
struct PlanMode {
  int straggler = -1;
  std::vector<Slowdown> degraded;
  bool plain() const { return straggler < 0 && degraded.empty(); }
  // "straggler 7", "degraded 5 (l = 2)", "straggler 7, degraded 5 (l = 2)" or "plain".
  std::string describe() const;
};

struct PlanCheckRecord {
  uint64_t call = 0;        // first call of the batch that decided
  std::string change;       // what was tried, e.g. "straggler 7"
  bool kept = false;        // false: undone
  double period_s = 0;      // time per call with it
  double baseline_s = 0;    // ... and before it
};

class PlanCheck {
 public:
  static constexpr uint64_t kFirstBackoff = 4;   // exchanges a failed change is not tried again
  static constexpr uint64_t kMaxBackoff = 64;
  static constexpr size_t kMaxRecords = 256;
  // A trial fails when the calls took more than this much longer with the move than before it
  // (time per call differs by about this much between batches of a steady job).
  static constexpr double kTolerance = 0.01;

  // At every exchange, in the same order on every rank: `proposed` is what the profiler and the
  // link probes want now, `period_s` the batch's time per call that just ended (<= 0: unknown),
  // `exchange` the exchange's number, `first_call` the first call of the next batch. Returns the
  // mode the next batch runs.
  const PlanMode& update(const PlanMode& proposed, double period_s, uint64_t exchange,
                         uint64_t first_call);
  const PlanMode& current() const { return current_; }
  bool in_trial() const { return trial_; }
  // Recent checks, oldest first, and how many there were in all.
  std::vector<PlanCheckRecord> records() const { return {records_.begin(), records_.end()}; }
  uint64_t total() const { return total_; }

 private:
  struct Veto {
    std::vector<int> ranks;  // the straggler, or the degraded ranks
    uint64_t until = 0;      // exchange from which it may be tried again
    int failures = 0;        // consecutive failed trials of these ranks
    bool holds(const std::vector<int>& r, uint64_t exchange) const {
      return r == ranks && exchange < until;
    }
  };

  void end_trial(double period_s, uint64_t exchange, uint64_t first_call);
  static void fail(Veto& v, std::vector<int> ranks, uint64_t exchange);

  PlanMode current_;
  bool trial_ = false;
  PlanMode before_;       // the mode the trial started from
  double baseline_s_ = 0;
  bool trial_straggler_ = false, trial_degraded_ = false;  // what the trial changed
  Veto straggler_veto_, degraded_veto_;
  std::deque<PlanCheckRecord> records_;
  uint64_t total_ = 0;
};

}  // namespace stragg
