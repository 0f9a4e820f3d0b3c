// Online detection of a persistent straggler (StragglAR App. C) and the decision whether running
// StragglAR for it pays off under the alpha-beta cost model (no torch here).
//
// Measurement (per all_reduce call, per rank, no clock synchronisation needed): each rank times
// its own call from the moment it was ready until it finished. Everybody finishes at about the
// same time, so the rank with the SHORTEST duration arrived last (it waited for nobody), and the
// gap between the shortest and the second-shortest duration estimates how late it was, the
// straggler delay d. Every K = ProfilerSettings::exchange_every calls the backend exchanges
// these durations so every rank holds the same n x K matrix and calls add_batch with identical
// input; everything below is deterministic (no randomness, fixed iteration order, ties go to the
// lowest rank), so all ranks reach identical decisions without further agreement.
//
// Decision rule:
//  1. Per call: last rank = argmin duration (ties: lowest rank), d = second smallest - smallest.
//     The call is significant iff d >= noise_floor_s; otherwise "nobody was late". A call with a
//     negative (or non-finite) duration on any rank is skipped entirely.
//  2. Cost of a call of b bytes, measured from the (n-1)-th arrival (closed_form, alpha/beta
//     from the LinkModel): Ring takes d + ring(); StragglAR for straggler s, when s was the late
//     rank, takes max(d, stragglar_reduce_scatter()) + stragglar_best(); when s was not late
//     (another rank was, or nobody) StragglAR loses the critical delay c =
//     stragglar_critical_delay() against Ring. Gain of s = mean over ALL window calls of
//     (Ring - StragglAR) per call. Where the planner may run StragglAR-direct for s instead
//     (set_direct_variant: over a network), it is modelled alike (stragglar_direct_call_gain) and
//     the gain of s is the larger of the two means: the planner runs the faster schedule.
//  3. Candidate = rank with the most significant last-counts in the window (ties: lowest rank);
//     share(r) = count(r) / significant calls in the window, or 0 when fewer than window/4 calls
//     of the window are significant. A rank qualifies for adoption iff share >= adopt_share and
//     gain > min_gain_s; the current straggler should go iff share < drop_share or gain <=
//     min_gain_s. In between it keeps its status (no flapping).
//  4. Hysteresis: the current straggler is dropped after `patience` consecutive batches saying
//     it should go; a candidate is adopted after `patience` consecutive batches in which that
//     same rank qualified (if it qualified while another rank was still current, it replaces
//     that rank in the batch where the latter is dropped). n <= 2: never adopt.
//  5. Each change is recorded as a ProfilerDecision whose call is first_call + k (the first call
//     that uses it) with a reason naming share, gain and delay, and which of them decided: an
//     adoption names both (both qualified) and the schedule the gain is for (StragglAR, with its
//     critical delay, or stragglar_direct); a drop says "for its share", "for its gain" or both.
//
// A batch that contributes no valid call (k == 0 or every call skipped) updates nothing, and in
// particular does not advance the hysteresis. With settings.enabled == false, add_batch still
// keeps the statistics (summary()) but never adopts a straggler.
//
// Memory is bounded: the window (`window` calls), the most recent kRecentCalls samples and the
// most recent kMaxDecisions decisions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "plan/link_model.h"
#include "plan/plan_check.h"
#include "plan/recent_buffer.h"

namespace stragg {


struct ProfilerSettings {
  bool enabled = true;
  int exchange_every = 16;   // K (the backend uses it); >= 1
  int window = 64;           // decisions use the most recent `window` calls; >= 1
  double adopt_share = 0.5;  // adopt rank s when it was last in >= this share of the window's significant calls
  double drop_share = 0.3;   // drop/replace the current straggler when its share falls below this
  int patience = 2;          // consecutive add_batch calls indicating a change before it is applied; >= 1
  double min_gain_s = 0.0;   // predicted mean gain per call must exceed this to adopt / keep
  double noise_floor_s = 100e-6;  // delays below this are "nobody was late" (insignificant) calls
};

// Throws stragg::Error naming the first bad field.
void validate_profiler_settings(const ProfilerSettings& settings);

struct ProfilerDecision {
  uint64_t call = 0;   // first call that uses the new straggler
  int straggler = -1;  // -1 = none
  std::string reason;
};

struct ProfilerSummary {
  int n = 0;
  uint64_t calls = 0;      // valid calls seen (skipped ones not counted)
  uint64_t exchanges = 0;  // add_batch calls
  uint64_t skipped_calls = 0;        // calls skipped because a duration was unknown
  uint64_t insignificant_calls = 0;  // valid calls with delay < noise_floor_s
  int straggler = -1;
  int candidate = -1;  // -1 when the window holds no significant call
  double candidate_share = 0;  // 0 while fewer than window/4 window calls are significant
  double median_delay_s = 0;    // median delay over window calls where the candidate was last (0 if none)
  double critical_delay_s = 0;  // StragglAR critical delay at the window's median bytes
  double predicted_gain_s = 0;  // predicted mean time saved per call by StragglAR for the candidate over Ring
  double straggler_share = 0;   // the same two numbers for the current straggler (0 if none)
  double straggler_gain_s = 0;
  std::vector<int64_t> last_counts;         // who-was-last histogram over all significant calls seen
  std::vector<int64_t> window_last_counts;  // over the window's significant calls
  std::vector<double> recent_delays_s;      // per valid call, most recent up to kRecentCalls
  std::vector<int> recent_last;             // aligned: the last rank (-1 if the call was insignificant)
  std::vector<ProfilerDecision> decisions;  // changes of straggler, in order (most recent kMaxDecisions)
  uint64_t decisions_total = 0;             // all changes ever recorded
  LinkModel link;                           // model used for the latest decision
  // Filled by the session (session/group_profiler.h), not by StragglerProfiler:
  int applied_straggler = -1;            // StragglAR runs for it (the plan check may undo one)
  std::vector<Slowdown> applied_degraded;  // the degraded ranks the planner uses
  std::string applied_mode;                // PlanMode::describe() of what runs
  // The cost model's measured corrections: (family, measured / predicted).
  std::vector<std::pair<std::string, double>> corrections;
  std::vector<PlanCheckRecord> plan_checks;
  uint64_t probe_campaigns = 0;  // link probes finished
  uint64_t probe_slices = 0;     // probe slices run between calls
  double probe_s = 0;            // this rank's time in link probes
  size_t probe_transfer_bytes = 0;
  int exchange_every = 0;        // calls per exchange now (grows for very short calls)
  double exchange_s = 0;         // this rank's time in exchanges (all_reduce and analysis)
};

// Predicted time saved by StragglAR (assuming straggler s) over Ring for one call of `bytes`
// bytes among n ranks in which the late rank arrived `delay_s` after the others; `s_was_late`
// says whether that late rank was s. Negative when StragglAR is slower. Rule 2 above.
double stragglar_call_gain(int n, double bytes, double delay_s, bool s_was_late,
                           const LinkModel& link);

// The same for StragglAR-direct (core/stragglar_direct.cc) in the simulator's lock-step model:
// the reduce-scatter among the n-1 early ranks, then k+1 rounds of alpha + bytes*beta/k after s
// arrives (k the best for the link); when s was not late it loses (reduce-scatter + rounds -
// Ring).
double stragglar_direct_call_gain(int n, double bytes, double delay_s, bool s_was_late,
                                  const LinkModel& link);

class StragglerProfiler {
 public:
  static constexpr size_t kRecentCalls = 4096;
  static constexpr size_t kMaxDecisions = 1024;

  // n >= 1 ranks; validates the settings (throws stragg::Error naming the bad one).
  StragglerProfiler(int n, ProfilerSettings settings);

  // durations: n*k values, durations[r*k + i] = rank r's duration of call i of this batch
  // (seconds; a negative or non-finite value = unknown/failed call, the call is skipped).
  // bytes[i]: the call's buffer bytes. first_call: index of call 0 of the batch. link: the cost
  // model for this decision (alpha, beta finite and >= 0). Returns true if straggler() changed.
  // Throws stragg::Error on malformed input (sizes, negative bytes, bad link).
  bool add_batch(const std::vector<double>& durations, int k, const std::vector<int64_t>& bytes,
                 const LinkModel& link, uint64_t first_call);

  int straggler() const { return straggler_; }
  uint64_t exchanges() const { return exchanges_; }  // add_batch calls so far
  ProfilerSummary summary() const;
  // What the session needs after every exchange, without summary()'s cost-model evaluations:
  // summary().median_delay_s, and the last (up to) `count` of summary().recent_delays_s.
  double candidate_median_delay_s() const;
  std::vector<double> recent_delays(size_t count) const;
  const ProfilerSettings& settings() const { return settings_; }
  // Back to no straggler (records a decision with this reason if it changes) and clears the
  // hysteresis state.
  void reset_decision(const std::string& reason);
  // Whether the planner may run StragglAR-direct for the straggler (rule 2). Default: no.
  void set_direct_variant(bool on) { direct_variant_ = on; }

 private:
  struct CallSample {
    int last = -1;  // -1: insignificant
    double delay_s = 0;
    int64_t bytes = 0;
  };
  struct Evaluation {
    std::vector<int64_t> counts;  // window significant last-counts per rank
    int64_t significant = 0;
    int candidate = -1;
  };

  // add_batch's parts: validation (throws naming the bad input), recording the batch's valid
  // calls (returns how many), and rules 3-4 (true when the straggler changed).
  void check_batch(const std::vector<double>& durations, int k, const std::vector<int64_t>& bytes,
                   const LinkModel& link, uint64_t first_call) const;
  size_t record_calls(const std::vector<double>& durations, size_t ku,
                      const std::vector<int64_t>& bytes);
  bool update_straggler();
  Evaluation evaluate_counts() const;
  double share(const Evaluation& e, int rank) const;
  // Rule 2's gain of `rank`, and whether it is StragglAR-direct's (the larger of the two).
  struct Gain {
    double s = 0;
    bool direct = false;
  };
  Gain gain_of(int rank, const LinkModel& link) const;
  double gain(int rank, const LinkModel& link) const { return gain_of(rank, link).s; }
  double median_delay(int rank) const;
  double median_bytes() const;
  void record_decision(int straggler, const std::string& reason);
  // Decision texts (rule 5): the share against `threshold` ("adopt at 50.0%"), the gain and the
  // schedule it is for against min_gain_s; why `rank` qualifies (both), why it goes (the rule
  // that failed, then the other).
  std::string share_text(const Evaluation& e, int rank, const std::string& threshold) const;
  std::string gain_text(int rank) const;
  std::string adopt_reason(const Evaluation& e, int rank) const;
  std::string drop_reason(const Evaluation& e, int rank) const;

  int n_;
  ProfilerSettings settings_;
  int straggler_ = -1;
  bool direct_variant_ = false;

  RecentBuffer<CallSample> window_;
  RecentBuffer<CallSample> recent_;
  std::vector<int64_t> last_counts_;
  uint64_t calls_ = 0;
  uint64_t exchanges_ = 0;
  uint64_t skipped_ = 0;
  uint64_t insignificant_ = 0;
  uint64_t next_call_ = 0;  // first_call + k of the latest batch
  LinkModel link_;

  // Hysteresis.
  int leave_streak_ = 0;     // consecutive batches saying the current straggler should go
  int adopt_target_ = -1;    // rank that qualified in the latest batches
  int adopt_streak_ = 0;     // ... for this many consecutive batches

  std::deque<ProfilerDecision> decisions_;
  uint64_t decisions_total_ = 0;
};

}  // namespace stragg
