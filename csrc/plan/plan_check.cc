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

// Per arm, the median time after the last arrival of each call size, weighted by how often the
// size occurs in the trial; -1 for an arm without a measured call. Sizes that some measured arm
// lacks are left out (so every arm is scored on the same sizes); if none is common, each arm's
// median over its calls.
std::vector<double> arm_scores(const std::vector<CheckedCall>& calls, size_t arms,
                               std::vector<size_t>* counts) {
  std::map<int64_t, std::vector<std::vector<double>>> by_size;
  counts->assign(arms, 0);
  for (const CheckedCall& c : calls) {
    if (c.arm < 0 || static_cast<size_t>(c.arm) >= arms || !(c.critical_s > 0) ||
        !std::isfinite(c.critical_s)) {
      continue;
    }
    auto& slot = by_size[c.bytes];
    slot.resize(arms);
    slot[static_cast<size_t>(c.arm)].push_back(c.critical_s);
    ++(*counts)[static_cast<size_t>(c.arm)];
  }
  std::vector<double> score(arms, -1);
  std::vector<double> weighted(arms, 0);
  double weight = 0;
  for (const auto& [bytes, per_arm] : by_size) {
    bool common = true;
    size_t total = 0;
    for (size_t a = 0; a < arms; ++a) {
      if ((*counts)[a] > 0 && per_arm[a].empty()) common = false;
      total += per_arm[a].size();
    }
    if (!common) continue;
    weight += static_cast<double>(total);
    for (size_t a = 0; a < arms; ++a) {
      if (!per_arm[a].empty()) weighted[a] += static_cast<double>(total) * median_of(per_arm[a]);
    }
  }
  for (size_t a = 0; a < arms; ++a) {
    if ((*counts)[a] == 0) continue;
    if (weight > 0) {
      score[a] = weighted[a] / weight;
    } else {
      std::vector<double> all;
      for (const auto& [bytes, per_arm] : by_size) {
        all.insert(all.end(), per_arm[a].begin(), per_arm[a].end());
      }
      score[a] = median_of(all);
    }
  }
  return score;
}

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
  // Generalised Thue-Morse: the sum of i's base-m digits, modulo m.
  size_t sum = 0;
  for (size_t x = i; x > 0; x /= m) sum += x % m;
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

void PlanCheck::start_trial(const PlanMode& proposed) {
  arms_.clear();
  auto add = [&](const PlanMode& m) {
    if (arms_.size() >= kMaxArms) return;
    for (const PlanMode& a : arms_) {
      if (a.same_as(m)) return;
    }
    arms_.push_back(m);
  };
  add(proposed);
  add(current_);
  add(baseline_);
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

void PlanCheck::learn_corrections(const std::vector<CheckedCall>& calls) {
  std::map<PlanFamily, std::vector<double>> ratios;
  for (const CheckedCall& c : calls) {
    if (c.arm < 0 || !(c.critical_s > 0) || !(c.predicted_s > 0) || !std::isfinite(c.critical_s)) {
      continue;
    }
    ratios[c.family].push_back(c.critical_s / c.predicted_s);
  }
  for (const auto& [family, r] : ratios) {
    if (r.size() < 2) continue;
    const double ratio = median_of(r);
    corrections_[family] = ratio;
    if (std::fabs(ratio - 1.0) > kReportedError && !reported_[family]) {
      reported_[family] = true;
      new_errors_.push_back({family, ratio, r.size()});
    }
  }
}

void PlanCheck::end_trial(const std::vector<CheckedCall>& calls, uint64_t exchange,
                          uint64_t first_call) {
  const std::vector<PlanMode> arms = std::move(arms_);
  arms_.clear();
  std::vector<size_t> counts;
  const std::vector<double> score = arm_scores(calls, arms.size(), &counts);
  learn_corrections(calls);
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
    rec.arms.push_back({arms[a].describe(), score[a], counts[a]});
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
    if (recheck && !current_.same_as(baseline_)) start_trial(current_);
    return current_;
  }
  if (want.same_as(baseline_)) {
    current_ = want;  // what every other mode is measured against: no trial
    return current_;
  }
  start_trial(want);
  return current_;
}

const PlanMode& PlanCheck::apply_now(const PlanMode& proposed, uint64_t exchange) {
  arms_.clear();
  current_ = filtered(proposed, exchange);
  return current_;
}

}  // namespace stragg
