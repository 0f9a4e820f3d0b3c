// The planner's moves checked against measured calls (no torch here).
//
// The profiler (a persistent straggler), the link probes (degraded ranks) and the host layout
// (host-level plans) move a group away from the plan it ran, on the strength of a cost model.
// The model can be wrong for a network (it describes lock-step rounds; a pipelined TCP Ring
// beats that, a flat StragglAR-direct over hosts with several ranks pays for every host mate on
// the NIC). So every move is a trial run on the same calls as what it would replace: the calls
// of the trial batch are dealt out among its arms (the proposed mode, the mode running now, the
// baseline unless the mode running now beat it lately, and, when a straggler and degraded ranks
// arrive together, each of them alone) in blocks of 3 calls (2 with more than two arms), the
// blocks in a generalised Thue-Morse order (no period: a job's repeating pattern of bucket
// sizes meets every arm in every position, and every arm follows every other as often). A
// call's cost is the time from the end of the call before it to its own end on each rank (the
// job's compute, the wait for the last rank and the all_reduce; time in exchanges and probes
// left out), agreed as the median over ranks; only calls that follow a call of the same arm
// count (the first of a block carries the previous arm's effect on when ranks arrive). Per arm,
// the median cost per call size, weighted by how often the size occurs, is its score, with its
// standard error from the calls' spread. The proposal runs from then on when it is the fastest
// arm or within kTolerance of it; another arm when the proposal is slower by more than
// kTolerance and two standard errors; in between the trial runs a second round, after which one
// standard error decides (a difference within the calls' noise keeps the cost model's choice).
// What the proposal added and the
// winner lacks is not proposed again for a while (4 exchanges, doubling with every failed trial
// of the same change, at most 64); while a set of degraded ranks is vetoed, those of its ranks
// that ran before it keep running (a failed {5, 6, 12} goes back to {5}, not to Ring). A move to
// the baseline needs no trial.
//
// The baseline is the flat plan without straggler or degraded rank (what STRAGG_HOST_LEVEL=off,
// STRAGG_STRAGGLER=none would run): every other mode is measured against it.
//
// Each trial also measures the cost model: with one arm whose model is taken as right (the
// baseline, or the running mode's plan once corrected), the part of a call's cost that is not
// the all_reduce after the last arrival (compute, the late rank's delay) is its cost minus its
// prediction; every other arm's measured all_reduce time over its prediction becomes its plan
// family's correction (Planner::set_corrections) for the modes other than the baseline. Every
// input is exchanged, so every rank takes the same decisions.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "plan/link_model.h"
#include "plan/plan_family.h"

namespace stragg {

// What the session applies: the straggler StragglAR runs for (-1: none), the degraded ranks
// OptCC may run for, and whether host-level plans are off.
struct PlanMode {
  int straggler = -1;
  std::vector<Slowdown> degraded;
  bool flat = false;
  bool plain() const { return straggler < 0 && degraded.empty(); }
  // Same straggler, same degraded ranks (factors aside), same flat flag.
  bool same_as(const PlanMode& o) const;
  // "straggler 7", "degraded 5 (l = 2)", "straggler 7, degraded 5 (l = 2)", "plain", with
  // ", flat" (or "flat") when host-level plans are off.
  std::string describe() const;
};

// One call of a batch, from exchanged numbers (the same on every rank).
struct CheckedCall {
  int arm = -1;             // the trial arm it ran (-1: not in a trial)
  bool after_same_arm = false;  // the call before it ran the same arm
  int64_t bytes = 0;
  double cost_s = -1;       // from the previous call's end to its end, median over ranks (< 0: unknown)
  double predicted_s = 0;   // the cost model's time after the last arrival (0: not predicted)
  PlanFamily family;        // what ran
};

struct TrialArm {
  std::string mode;    // PlanMode::describe()
  double score_s = 0;  // cost per call (from the previous call's end; -1: not measured)
  double error_s = 0;  // its standard error
  size_t calls = 0;
};

struct PlanCheckRecord {
  uint64_t call = 0;      // first call after the trial
  std::string change;     // what was tried, e.g. "straggler 7"
  bool kept = false;      // the proposed mode won
  std::string chosen;     // the mode that runs from `call` on
  std::vector<TrialArm> arms;  // arm 0 is the proposed mode, arm 1 the one it would replace
  double period_s = 0;    // the proposed arm's score
  double baseline_s = 0;  // the replaced mode's score
  size_t rounds = 1;
};

// A family whose correction moved past kReportedError (logged once per family).
struct ModelError {
  PlanFamily family;
  double ratio = 1;  // measured / predicted
  size_t calls = 0;
};

class PlanCheck {
 public:
  static constexpr uint64_t kFirstBackoff = 4;   // exchanges a failed change is not tried again
  static constexpr uint64_t kMaxBackoff = 64;
  static constexpr size_t kMaxRecords = 256;
  // Calls per arm and consecutive calls of one arm: 6 in blocks of 3 in a trial of two arms;
  // with more arms 4 in blocks of 2, so that a trial of four still ends within 16 calls.
  static constexpr size_t kCallsPerArm = 6;
  static constexpr size_t kBlock = 3;
  static constexpr size_t kCallsPerArmOfMany = 4;
  static constexpr size_t kBlockOfMany = 2;
  static constexpr size_t kMaxArms = 4;
  // The baseline is an arm unless the running mode beat it within this many exchanges.
  static constexpr uint64_t kBaselineFresh = 16;
  // Rounds a trial may take when one round cannot tell the proposal from a faster arm.
  static constexpr size_t kMaxRounds = 2;
  // A proposal within this share of the fastest arm wins (per-call noise of a steady job).
  static constexpr double kTolerance = 0.02;
  // A family's model is corrected (and that reported once) when its measured/predicted ratio is
  // off by more.
  static constexpr double kReportedError = 0.15;

  // `flat_baseline`: host-level plans are possible and chosen by the model, so the baseline is
  // the flat plan (else the plain one).
  explicit PlanCheck(bool flat_baseline = false);

  const PlanMode& baseline() const { return baseline_; }
  // At every exchange, in the same order on every rank: `proposed` is what the profiler, the
  // link probes and the host layout want now, `calls` the batch that just ended (a trial's calls
  // carry their arm), `exchange` the exchange's number, `first_call` the first call of the next
  // batch. Returns the mode the next batch runs outside a trial's arms.
  const PlanMode& update(const PlanMode& proposed, const std::vector<CheckedCall>& calls,
                         uint64_t exchange, uint64_t first_call);
  // `proposed` applies at once, without a trial (an explicit link probe the user waits for);
  // vetoes still hold.
  const PlanMode& apply_now(const PlanMode& proposed, uint64_t exchange);
  // A trial of the mode running now against the baseline at the next update (its plan changed
  // under new corrections without being measured).
  void recheck() { recheck_ = true; }
  const PlanMode& current() const { return current_; }

  // The trial the next batch runs, if any: how many calls a round takes (the batch ends there),
  // how many its rounds so far take (the round the next batch runs included), the arm of its
  // i-th call (counted from the trial's first) and each arm's mode.
  bool in_trial() const { return !arms_.empty(); }
  size_t trial_calls() const {
    return arms_.size() * (arms_.size() > 2 ? kCallsPerArmOfMany : kCallsPerArm);
  }
  size_t trial_length() const { return round_ * trial_calls(); }
  uint64_t trials_begun() const { return trials_begun_; }  // changes when a trial begins
  int arm_of(size_t i) const;
  const PlanMode& arm_mode(int arm) const { return arms_.at(static_cast<size_t>(arm)); }
  const std::vector<PlanMode>& arms() const { return arms_; }

  // Measured/predicted ratios per family (from trials: 1 for a family within kReportedError of
  // its prediction; cleared by reset_corrections when the link model changes), and the families
  // whose error newly passed kReportedError at the last update.
  const std::map<PlanFamily, double>& corrections() const { return corrections_; }
  void reset_corrections() { corrections_.clear(); }
  const std::vector<ModelError>& new_model_errors() const { return new_errors_; }

  // Recent checks, oldest first, and how many there were in all.
  std::vector<PlanCheckRecord> records() const { return {records_.begin(), records_.end()}; }
  uint64_t total() const { return total_; }

 private:
  struct Veto {
    std::vector<int> ranks;  // the straggler, the degraded ranks, or {1} for host-level plans
    uint64_t until = 0;      // exchange from which it may be tried again
    int failures = 0;        // consecutive failed trials of these ranks
    bool holds(const std::vector<int>& r, uint64_t exchange) const {
      return r == ranks && exchange < until;
    }
  };

  PlanMode filtered(const PlanMode& proposed, uint64_t exchange) const;
  // Per arm and call size: the median cost (of calls after the same arm, else of all), how
  // many calls it is of, the median prediction, the family that ran most, and all calls.
  struct ArmStats {
    std::map<int64_t, double> cost, predicted;
    std::map<int64_t, size_t> samples;
    std::map<int64_t, PlanFamily> family;
    std::map<int64_t, size_t> calls;
    size_t total = 0;
  };
  void start_trial(const PlanMode& proposed, uint64_t exchange);
  // After a round: decides (true) or asks for another round (false).
  bool end_round(uint64_t exchange, uint64_t first_call);
  void learn_corrections(const std::vector<ArmStats>& stats, const std::vector<double>& score);
  static void fail(Veto& v, std::vector<int> ranks, uint64_t exchange);

  PlanMode baseline_;
  PlanMode current_;
  bool recheck_ = false;
  std::vector<PlanMode> arms_;  // the trial of the next batch (arm 0: proposed, 1: current)
  size_t round_ = 0;            // rounds begun
  uint64_t trials_begun_ = 0;
  std::vector<CheckedCall> trial_record_;  // the trial's calls so far
  int baseline_arm_ = -1;       // the baseline's arm in it (-1: none)
  bool beat_baseline_ = false;  // the running mode was measured no slower than the baseline
  uint64_t baseline_checked_ = 0;  // ... at this exchange
  Veto straggler_veto_, degraded_veto_, host_veto_;
  std::map<PlanFamily, double> corrections_;
  std::map<PlanFamily, bool> reported_;
  std::vector<ModelError> new_errors_;
  std::deque<PlanCheckRecord> records_;
  uint64_t total_ = 0;
};

}  // namespace stragg
