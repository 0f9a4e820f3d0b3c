// The plan check's side of a group's profiler (session/group_profiler.h): which mode each call
// runs (a trial's arm or the verdict), the batch's calls as the check reads them, and the
// verdict at an exchange, its corrections given to the planner (plan/plan_check.h).
#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

#include "common/log.h"
#include "plan/median.h"
#include "session/group_profiler.h"

namespace stragg {

PlanMode GroupProfiler::next_call_mode(CallMode* planner_mode) const {
  PlanMode m = mode_;  // written on this thread only
  if (check_.in_trial() && calls_ >= trial_first_call_ &&
      calls_ - trial_first_call_ < check_.trial_length()) {
    m = check_.arm_mode(check_.arm_of(static_cast<size_t>(calls_ - trial_first_call_)));
  }
  if (planner_mode != nullptr) {
    planner_mode->degraded = m.degraded;
    planner_mode->flat = m.flat;
    // The baseline is what stragg ran before it knew hosts: flat plans, the one-level model.
    const bool baseline = plan_check_ && m.same_as(check_.baseline());
    planner_mode->corrected = !baseline;
    planner_mode->one_level = baseline && m.flat;
  }
  return m;
}

std::vector<CheckedCall> GroupProfiler::checked_calls(const std::vector<double>& costs, int k,
                                                      const std::vector<int64_t>& bytes) const {
  std::vector<CheckedCall> out(static_cast<size_t>(k));
  const bool trial = check_.in_trial();
  std::vector<double> ranks;
  for (int i = 0; i < k; ++i) {
    CheckedCall& c = out[static_cast<size_t>(i)];
    const uint64_t call = batch_first_call_ + static_cast<uint64_t>(i);
    if (trial && call >= trial_first_call_ && call - trial_first_call_ < check_.trial_length()) {
      const size_t j = static_cast<size_t>(call - trial_first_call_);
      c.arm = check_.arm_of(j);
      c.after_same_arm = j > 0 && check_.arm_of(j - 1) == c.arm;
    }
    c.bytes = bytes[static_cast<size_t>(i)];
    // Every rank's cost of the call agreed as their median (they take about the same time per
    // step; a rank that a probe or the OS held up does not decide).
    ranks.clear();
    for (int r = 0; r < n_; ++r) {
      const double t = costs[static_cast<size_t>(r) * k + i];
      if (t >= 0) ranks.push_back(t);
    }
    c.cost_s = ranks.empty() ? -1 : median_of(ranks);
    c.predicted_s = batch_predicted_[static_cast<size_t>(i)];
    c.family = batch_families_[static_cast<size_t>(i)];
  }
  return out;
}

void GroupProfiler::check_plan(const PlanMode& proposed, const std::vector<CheckedCall>& calls,
                               uint64_t exchanges) {
  PlanMode mode;
  PlanCheckRecord latest;
  bool checked = false;
  std::vector<ModelError> errors;
  std::map<PlanFamily, double> corrections;
  const uint64_t trials_before = check_.trials_begun();
  {
    std::lock_guard<std::mutex> guard(mu_);
    const uint64_t before = check_.total();
    mode = plan_check_ ? check_.update(proposed, calls, exchanges, calls_) : proposed;
    checked = check_.total() != before;
    if (checked) latest = check_.records().back();
    errors = check_.new_model_errors();
    corrections = check_.corrections();
  }
  if (check_.trials_begun() != trials_before) trial_first_call_ = calls_;  // a new trial begins
  if (plan_check_ && corrections != planner_.corrections()) {
    // A plan of the running mode that the new corrections change has not been measured: it is
    // tried against the baseline (at the batch's most frequent size).
    std::map<int64_t, int> sizes;
    for (const CheckedCall& c : calls) ++sizes[c.bytes];
    const auto typical = std::max_element(
        sizes.begin(), sizes.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    CallMode cm;
    cm.degraded = mode.degraded;
    cm.flat = mode.flat;
    const int s = planner_.profiled() ? mode.straggler : -1;
    const size_t b = typical == sizes.end() ? 0 : static_cast<size_t>(typical->first);
    const PlanChoice before = planner_.choose(b, s, straggler_delay_s(), true, cm);
    planner_.set_corrections(corrections);
    const PlanChoice after = planner_.choose(b, s, straggler_delay_s(), true, cm);
    if (!check_.in_trial() && !mode.same_as(check_.baseline()) && !(before == after)) {
      std::lock_guard<std::mutex> guard(mu_);
      check_.recheck();
    }
  }
  apply(mode);
  const std::string who = "stragg: rank " + std::to_string(rank_) + " of group '" + group_ + "': ";
  if (checked) {
    const PlanCheckRecord& c = latest;
    std::ostringstream m;
    m << who << "plan check: " << c.change << (c.kept ? " kept" : " undone") << ", " << c.chosen
      << " runs from call " << c.call << " (cost per call:";
    for (size_t a = 0; a < c.arms.size(); ++a) {
      m << (a ? ";" : "") << " " << c.arms[a].mode << " " << std::setprecision(4)
        << c.arms[a].score_s * 1e3 << " ms over " << c.arms[a].calls << " calls";
    }
    m << ")";
    log_info(m.str());
  }
  for (const ModelError& e : errors) {
    std::ostringstream m;
    m << who << "cost model: " << e.family.describe() << " took " << std::setprecision(3)
      << e.ratio << "x its predicted time over " << e.calls
      << " measured calls; its predictions are scaled by that from now on";
    log_info(m.str());
  }
}

}  // namespace stragg
