#include "plan/plan_check.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "plan/median.h"

namespace stragg {
namespace {

std::vector<int> ranks_of(const std::vector<Slowdown>& d) {
  std::vector<int> r;
  for (const Slowdown& s : d) r.push_back(s.rank);
  std::sort(r.begin(), r.end());
  return r;
}

std::vector<int> straggler_ranks(int s) { return s < 0 ? std::vector<int>{} : std::vector<int>{s}; }

const std::vector<int> kHostLevel = {1};  // the host-level veto's key

}  // namespace

bool PlanMode::same_as(const PlanMode& o) const {
  return straggler == o.straggler && ranks_of(degraded) == ranks_of(o.degraded) && flat == o.flat;
}

std::string PlanMode::describe() const {
  std::ostringstream m;
  if (straggler >= 0) m << "straggler " << straggler;
  if (!degraded.empty()) {
    m << (straggler >= 0 ? ", " : "") << "degraded ";
    for (size_t i = 0; i < degraded.size(); ++i) {
      m << (i ? ", " : "") << degraded[i].rank << " (l = " << std::setprecision(3)
        << degraded[i].factor << ")";
    }
  }
  if (plain()) return flat ? "flat" : "plain";
  if (flat) m << ", flat";
  return m.str();
}

PlanCheck::PlanCheck(bool flat_baseline) {
  baseline_.flat = flat_baseline;
  current_ = baseline_;
}

int PlanCheck::arm_of(size_t i) const {
  const size_t m = arms_.size();
  if (m <= 1) return 0;
  // Blocks of kBlock calls (kBlockOfMany with more than two arms); the blocks in generalised
  // Thue-Morse order: the sum of the block index's base-m digits, modulo m.
  size_t sum = 0;
  for (size_t x = i / (m > 2 ? kBlockOfMany : kBlock); x > 0; x /= m) sum += x % m;
  return static_cast<int>(sum % m);
}

void PlanCheck::fail(Veto& v, std::vector<int> ranks, uint64_t exchange) {
  v.failures = v.ranks == ranks ? v.failures + 1 : 1;
  v.ranks = std::move(ranks);
  const uint64_t backoff = std::min(kMaxBackoff, kFirstBackoff << std::min(v.failures - 1, 4));
  v.until = exchange + backoff;
}

PlanMode PlanCheck::filtered(const PlanMode& proposed, uint64_t exchange) const {
  PlanMode want = proposed;
  if (want.straggler >= 0 && straggler_veto_.holds(straggler_ranks(want.straggler), exchange)) {
    want.straggler = -1;
  }
  if (!want.degraded.empty() && degraded_veto_.holds(ranks_of(want.degraded), exchange)) {
    // A vetoed set keeps the degraded ranks that run now and are still proposed (at their
    // latest factors): a failed trial of {5, 6, 12} goes back to {5}, which passed its own.
    const std::vector<int> now = ranks_of(current_.degraded);
    std::vector<Slowdown> kept;
    for (const Slowdown& d : want.degraded) {
      if (std::binary_search(now.begin(), now.end(), d.rank)) kept.push_back(d);
    }
    want.degraded = std::move(kept);
  }
  if (baseline_.flat && !want.flat && host_veto_.holds(kHostLevel, exchange)) want.flat = true;
  return want;
}

void PlanCheck::start_trial(const PlanMode& proposed, uint64_t exchange) {
  arms_.clear();
  baseline_arm_ = -1;
  auto add = [&](const PlanMode& m) {
    if (arms_.size() >= kMaxArms) return;
    for (const PlanMode& a : arms_) {
      if (a.same_as(m)) return;
    }
    if (m.same_as(baseline_)) baseline_arm_ = static_cast<int>(arms_.size());
    arms_.push_back(m);
  };
  add(proposed);
  add(current_);
  // The baseline, unless the running mode beat it lately (the proposal is measured against
  // that mode, which was measured against the baseline).
  const bool fresh = beat_baseline_ && exchange < baseline_checked_ + kBaselineFresh;
  if (!fresh) add(baseline_);
  if (proposed.straggler >= 0 && !proposed.degraded.empty()) {
    // Which detector fired first does not decide: each alone is measured too.
    PlanMode s = proposed, d = proposed;
    s.degraded.clear();
    d.straggler = -1;
    add(d);
    add(s);
  }
  if (arms_.size() < 2) arms_.clear();
}

namespace {

// Per arm: costs and predictions of each call size (calls after one of the same arm; an arm
// without such a call at some size takes all its calls of that size).
struct Samples {
  std::vector<double> after_same, all, predicted;
  std::map<PlanFamily, size_t> families;
};

}  // namespace

void PlanCheck::learn_corrections(const std::vector<ArmStats>& stats,
                                  const std::vector<double>& score) {
  // The most frequent call size of the trial, measured in every arm that ran.
  std::map<int64_t, size_t> sizes;
  for (const ArmStats& a : stats) {
    for (const auto& [bytes, n] : a.calls) sizes[bytes] += n;
  }
  int64_t size = -1;
  size_t most = 0;
  for (const auto& [bytes, n] : sizes) {
    bool everywhere = true;
    for (size_t a = 0; a < stats.size(); ++a) {
      everywhere = everywhere && (score[a] < 0 || stats[a].cost.count(bytes));
    }
    if (everywhere && n > most) size = bytes, most = n;
  }
  if (size < 0) return;
  // The reference: the baseline (its model is what the others are corrected against), else the
  // running mode's plan once its family has a correction.
  int ref = baseline_arm_;
  double ref_factor = 1.0;
  if (ref < 0 || score[static_cast<size_t>(ref)] < 0) {
    ref = -1;
    if (stats.size() > 1 && score[1] > 0) {
      auto it = corrections_.find(stats[1].family.at(size));
      if (it != corrections_.end()) ref = 1, ref_factor = it->second;
    }
  }
  if (ref < 0) return;
  const ArmStats& r = stats[static_cast<size_t>(ref)];
  if (!(r.predicted.at(size) > 0)) return;
  // What is not the all_reduce after the last arrival: compute, the late rank's delay, ...
  const double rest = r.cost.at(size) - ref_factor * r.predicted.at(size);
  if (ref == baseline_arm_) corrections_[r.family.at(size)] = 1.0;
  for (size_t a = 0; a < stats.size(); ++a) {
    if (static_cast<int>(a) == ref || score[a] < 0) continue;
    const double p = stats[a].predicted.at(size);
    if (!(p > 0)) continue;
    const PlanFamily f = stats[a].family.at(size);
    const double ratio = std::clamp((stats[a].cost.at(size) - rest) / p, 0.25, 4.0);
    corrections_[f] = ratio;
    if (std::fabs(ratio - 1.0) > kReportedError && !reported_[f]) {
      reported_[f] = true;
      new_errors_.push_back({f, ratio, stats[a].calls.at(size)});
    }
  }
}

void PlanCheck::end_trial(const std::vector<CheckedCall>& calls, uint64_t exchange,
                          uint64_t first_call) {
  const std::vector<PlanMode> arms = std::move(arms_);
  arms_.clear();
  // Samples per arm and size.
  std::vector<std::map<int64_t, Samples>> samples(arms.size());
  for (const CheckedCall& c : calls) {
    if (c.arm < 0 || static_cast<size_t>(c.arm) >= arms.size() || !(c.cost_s > 0) ||
        !std::isfinite(c.cost_s)) {
      continue;
    }
    Samples& s = samples[static_cast<size_t>(c.arm)][c.bytes];
    (c.after_same_arm ? s.after_same : s.all).push_back(c.cost_s);
    if (c.predicted_s > 0) s.predicted.push_back(c.predicted_s);
    ++s.families[c.family];
  }
  std::vector<ArmStats> stats(arms.size());
  for (size_t a = 0; a < arms.size(); ++a) {
    for (auto& [bytes, s] : samples[a]) {
      std::vector<double> costs = s.after_same.empty() ? s.all : s.after_same;
      stats[a].cost[bytes] = median_of(costs);
      stats[a].predicted[bytes] = median_of(s.predicted);
      stats[a].calls[bytes] = s.after_same.size() + s.all.size();
      stats[a].total += stats[a].calls[bytes];
      auto top = std::max_element(s.families.begin(), s.families.end(),
                                  [](const auto& x, const auto& y) { return x.second < y.second; });
      stats[a].family[bytes] = top->first;
    }
  }
  // Scores over the sizes every measured arm ran (each weighted by its calls).
  std::vector<double> score(arms.size(), -1);
  {
    std::map<int64_t, size_t> weight;
    for (const auto& st : stats) {
      for (const auto& [bytes, n] : st.calls) weight[bytes] += n;
    }
    std::vector<double> sum(arms.size(), 0);
    double total = 0;
    for (const auto& [bytes, w] : weight) {
      bool common = true;
      for (const auto& st : stats) common = common && (st.total == 0 || st.cost.count(bytes));
      if (!common) continue;
      total += static_cast<double>(w);
      for (size_t a = 0; a < arms.size(); ++a) {
        if (stats[a].total > 0) sum[a] += static_cast<double>(w) * stats[a].cost.at(bytes);
      }
    }
    for (size_t a = 0; a < arms.size(); ++a) {
      if (stats[a].total > 0 && total > 0) score[a] = sum[a] / total;
    }
  }
  learn_corrections(stats, score);
  if (!(score[0] > 0)) return;  // the proposal never ran (the batch was cut): nothing learnt
  size_t best = 0;
  for (size_t a = 1; a < arms.size(); ++a) {
    if (score[a] > 0 && score[a] < score[best]) best = a;
  }
  if (score[0] <= score[best] * (1 + kTolerance)) best = 0;
  const PlanMode& proposed = arms[0];
  const PlanMode& winner = arms[best];
  PlanCheckRecord rec;
  rec.call = first_call;
  rec.change = proposed.describe();
  rec.kept = best == 0;
  rec.chosen = winner.describe();
  for (size_t a = 0; a < arms.size(); ++a) {
    rec.arms.push_back({arms[a].describe(), score[a], stats[a].total});
  }
  rec.period_s = score[0];
  rec.baseline_s = arms.size() > 1 ? score[1] : score[0];
  // What the proposal added and the winner lacks is vetoed; what the winner kept has passed.
  if (proposed.straggler >= 0) {
    if (winner.straggler != proposed.straggler) {
      fail(straggler_veto_, straggler_ranks(proposed.straggler), exchange);
    } else {
      straggler_veto_.failures = 0;
    }
  }
  if (!proposed.degraded.empty()) {
    if (ranks_of(winner.degraded) != ranks_of(proposed.degraded)) {
      fail(degraded_veto_, ranks_of(proposed.degraded), exchange);
    } else {
      degraded_veto_.failures = 0;
    }
  }
  if (baseline_.flat && !proposed.flat) {
    if (winner.flat) {
      fail(host_veto_, kHostLevel, exchange);
    } else {
      host_veto_.failures = 0;
    }
  }
  if (baseline_arm_ >= 0 && score[static_cast<size_t>(baseline_arm_)] > 0) {
    beat_baseline_ = score[best] <= score[static_cast<size_t>(baseline_arm_)] * (1 + kTolerance);
    baseline_checked_ = exchange;
  }
  current_ = winner;
  records_.push_back(std::move(rec));
  ++total_;
  if (records_.size() > kMaxRecords) records_.pop_front();
}

const PlanMode& PlanCheck::update(const PlanMode& proposed, const std::vector<CheckedCall>& calls,
                                  uint64_t exchange, uint64_t first_call) {
  new_errors_.clear();
  if (in_trial()) end_trial(calls, exchange, first_call);
  const PlanMode want = filtered(proposed, exchange);
  const bool recheck = recheck_;
  recheck_ = false;
  if (want.same_as(current_)) {
    current_.degraded = want.degraded;  // factors follow the latest probe
    if (recheck && !current_.same_as(baseline_)) {
      beat_baseline_ = false;  // the running mode's plan changed: measured against the baseline
      start_trial(current_, exchange);
    }
    return current_;
  }
  if (want.same_as(baseline_)) {
    current_ = want;  // what every other mode is measured against: no trial
    beat_baseline_ = false;
    return current_;
  }
  start_trial(want, exchange);
  return current_;
}

const PlanMode& PlanCheck::apply_now(const PlanMode& proposed, uint64_t exchange) {
  arms_.clear();
  current_ = filtered(proposed, exchange);
  return current_;
}

}  // namespace stragg
