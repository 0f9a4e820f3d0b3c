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
  round_ = arms_.empty() ? 0 : 1;
  if (!arms_.empty()) ++trials_begun_;
  trial_record_.clear();
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
    // Within kReportedError the model holds (noise of a few calls would otherwise move it).
    const bool off = std::fabs(ratio - 1.0) > kReportedError;
    corrections_[f] = off ? ratio : 1.0;
    if (off && !reported_[f]) {
      reported_[f] = true;
      new_errors_.push_back({f, ratio, stats[a].calls.at(size)});
    }
  }
}

bool PlanCheck::end_round(uint64_t exchange, uint64_t first_call) {
  const size_t m = arms_.size();
  // Samples per arm and size.
  std::vector<std::map<int64_t, Samples>> samples(m);
  for (const CheckedCall& c : trial_record_) {
    if (c.arm < 0 || static_cast<size_t>(c.arm) >= m || !(c.cost_s > 0) ||
        !std::isfinite(c.cost_s)) {
      continue;
    }
    Samples& sm = samples[static_cast<size_t>(c.arm)][c.bytes];
    (c.after_same_arm ? sm.after_same : sm.all).push_back(c.cost_s);
    if (c.predicted_s > 0) sm.predicted.push_back(c.predicted_s);
    ++sm.families[c.family];
  }
  std::vector<ArmStats> stats(m);
  std::vector<double> deviations;  // |cost - its group's median| / median, pooled
  for (size_t a = 0; a < m; ++a) {
    for (auto& [bytes, sm] : samples[a]) {
      const std::vector<double>& costs = sm.after_same.empty() ? sm.all : sm.after_same;
      const double med = median_of(costs);
      stats[a].cost[bytes] = med;
      stats[a].samples[bytes] = costs.size();
      stats[a].predicted[bytes] = median_of(sm.predicted);
      stats[a].calls[bytes] = sm.after_same.size() + sm.all.size();
      stats[a].total += stats[a].calls[bytes];
      auto top = std::max_element(sm.families.begin(), sm.families.end(),
                                  [](const auto& x, const auto& y) { return x.second < y.second; });
      stats[a].family[bytes] = top->first;
      if (costs.size() >= 2 && med > 0) {
        // A deviation from a median of the same n samples reads about sqrt((n-1)/n) too small.
        const double n = static_cast<double>(costs.size());
        for (double x : costs) deviations.push_back(std::fabs(x - med) / med * std::sqrt(n / (n - 1)));
      }
    }
  }
  // A call's relative noise (MAD-based, over every arm's calls), then each arm's score (over
  // the sizes every measured arm ran, each weighted by its calls) and its standard error.
  const double noise = 1.4826 * median_of(deviations);
  std::vector<double> score(m, -1), error(m, 0);
  {
    std::map<int64_t, size_t> weight;
    for (const auto& st : stats) {
      for (const auto& [bytes, n] : st.calls) weight[bytes] += n;
    }
    std::vector<double> sum(m, 0), var(m, 0);
    double total = 0;
    for (const auto& [bytes, w] : weight) {
      bool common = true;
      for (const auto& st : stats) common = common && (st.total == 0 || st.cost.count(bytes));
      if (!common) continue;
      total += static_cast<double>(w);
      for (size_t a = 0; a < m; ++a) {
        if (stats[a].total == 0) continue;
        const double c = stats[a].cost.at(bytes);
        sum[a] += static_cast<double>(w) * c;
        // The standard error of a median of n: 1.2533 sigma / sqrt(n).
        const double se = 1.2533 * noise * c / std::sqrt(static_cast<double>(stats[a].samples.at(bytes)));
        var[a] += static_cast<double>(w) * static_cast<double>(w) * se * se;
      }
    }
    for (size_t a = 0; a < m; ++a) {
      if (stats[a].total > 0 && total > 0) {
        score[a] = sum[a] / total;
        error[a] = std::sqrt(var[a]) / total;
      }
    }
  }
  size_t best = 0;
  for (size_t a = 1; a < m; ++a) {
    if (score[a] > 0 && (!(score[best] > 0) || score[a] < score[best])) best = a;
  }
  const bool last_round = round_ >= kMaxRounds;
  if (!(score[0] > 0)) {
    // The proposal never ran (the batch was cut): another round, else nothing learnt.
    if (!last_round) return false;
    arms_.clear();
    return true;
  }
  // The proposal wins when fastest or within kTolerance; another arm when the proposal is
  // slower by more than kTolerance and two standard errors (one after the last round).
  const double gap = score[0] - score[best];
  const double error_of_gap = std::sqrt(error[0] * error[0] + error[best] * error[best]);
  size_t winner = 0;
  if (best != 0 && gap > kTolerance * score[best]) {
    if (gap > 2 * error_of_gap) {
      winner = best;
    } else if (!last_round) {
      return false;  // within the calls' noise: another round
    } else if (gap > error_of_gap) {
      winner = best;
    }
  }
  learn_corrections(stats, score);
  const std::vector<PlanMode> arms = std::move(arms_);
  arms_.clear();
  const PlanMode& proposed = arms[0];
  const PlanMode& chosen = arms[winner];
  PlanCheckRecord rec;
  rec.call = first_call;
  rec.change = proposed.describe();
  rec.kept = winner == 0;
  rec.chosen = chosen.describe();
  for (size_t a = 0; a < m; ++a) {
    rec.arms.push_back({arms[a].describe(), score[a], error[a], stats[a].total});
  }
  rec.period_s = score[0];
  rec.baseline_s = m > 1 ? score[1] : score[0];
  rec.rounds = round_;
  // What the proposal added and the winner lacks is vetoed; what the winner kept has passed.
  if (proposed.straggler >= 0) {
    if (chosen.straggler != proposed.straggler) {
      fail(straggler_veto_, straggler_ranks(proposed.straggler), exchange);
    } else {
      straggler_veto_.failures = 0;
    }
  }
  if (!proposed.degraded.empty()) {
    if (ranks_of(chosen.degraded) != ranks_of(proposed.degraded)) {
      fail(degraded_veto_, ranks_of(proposed.degraded), exchange);
    } else {
      degraded_veto_.failures = 0;
    }
  }
  if (baseline_.flat && !proposed.flat) {
    if (chosen.flat) {
      fail(host_veto_, kHostLevel, exchange);
    } else {
      host_veto_.failures = 0;
    }
  }
  if (baseline_arm_ >= 0 && score[static_cast<size_t>(baseline_arm_)] > 0) {
    beat_baseline_ =
        score[winner] <= score[static_cast<size_t>(baseline_arm_)] * (1 + kTolerance);
    baseline_checked_ = exchange;
  }
  current_ = chosen;
  records_.push_back(std::move(rec));
  ++total_;
  if (records_.size() > kMaxRecords) records_.pop_front();
  return true;
}

const PlanMode& PlanCheck::update(const PlanMode& proposed, const std::vector<CheckedCall>& calls,
                                  uint64_t exchange, uint64_t first_call) {
  new_errors_.clear();
  if (in_trial()) {
    for (const CheckedCall& c : calls) {
      if (c.arm >= 0) trial_record_.push_back(c);
    }
    if (!end_round(exchange, first_call)) {
      ++round_;  // the same arms, the next round of calls
      return current_;
    }
  }
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
  round_ = 0;
  trial_record_.clear();
  current_ = filtered(proposed, exchange);
  return current_;
}

}  // namespace stragg
