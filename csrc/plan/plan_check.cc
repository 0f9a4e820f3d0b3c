#include "plan/plan_check.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace stragg {
namespace {

std::vector<int> ranks_of(const std::vector<Slowdown>& d) {
  std::vector<int> r;
  for (const Slowdown& s : d) r.push_back(s.rank);
  std::sort(r.begin(), r.end());
  return r;
}

std::vector<int> straggler_ranks(int s) { return s < 0 ? std::vector<int>{} : std::vector<int>{s}; }

}  // namespace

std::string PlanMode::describe() const {
  if (plain()) return "plain";
  std::ostringstream m;
  if (straggler >= 0) m << "straggler " << straggler;
  if (!degraded.empty()) {
    m << (straggler >= 0 ? ", " : "") << "degraded ";
    for (size_t i = 0; i < degraded.size(); ++i) {
      m << (i ? ", " : "") << degraded[i].rank << " (l = " << std::setprecision(3)
        << degraded[i].factor << ")";
    }
  }
  return m.str();
}

void PlanCheck::fail(Veto& v, std::vector<int> ranks, uint64_t exchange) {
  v.failures = v.ranks == ranks ? v.failures + 1 : 1;
  v.ranks = std::move(ranks);
  const uint64_t backoff = std::min(kMaxBackoff, kFirstBackoff << std::min(v.failures - 1, 4));
  v.until = exchange + backoff;
}

void PlanCheck::end_trial(double period_s, uint64_t exchange, uint64_t first_call) {
  trial_ = false;
  if (!(period_s > 0)) return;  // nothing measured: keep it, the next move is checked again
  PlanCheckRecord rec;
  rec.call = first_call;
  PlanMode changed;
  if (trial_straggler_) changed.straggler = current_.straggler;
  if (trial_degraded_) changed.degraded = current_.degraded;
  rec.change = changed.describe();
  rec.period_s = period_s;
  rec.baseline_s = baseline_s_;
  rec.kept = period_s <= baseline_s_ * (1 + kTolerance);
  if (rec.kept) {
    if (trial_straggler_) straggler_veto_.failures = 0;
    if (trial_degraded_) degraded_veto_.failures = 0;
  } else {
    if (trial_straggler_) fail(straggler_veto_, straggler_ranks(current_.straggler), exchange);
    if (trial_degraded_) fail(degraded_veto_, ranks_of(current_.degraded), exchange);
    current_ = before_;
  }
  records_.push_back(std::move(rec));
  ++total_;
  if (records_.size() > kMaxRecords) records_.pop_front();
}

const PlanMode& PlanCheck::update(const PlanMode& proposed, double period_s, uint64_t exchange,
                                  uint64_t first_call) {
  if (trial_) end_trial(period_s, exchange, first_call);
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
  const bool straggler_moves = want.straggler != current_.straggler;
  const bool degraded_moves = ranks_of(want.degraded) != ranks_of(current_.degraded);
  if (straggler_moves || degraded_moves) {
    // A move to another non-plain mode is checked against the mode it leaves; a move back to
    // the plain plan needs no check (it is what the others are checked against).
    if (!want.plain() && period_s > 0) {
      trial_ = true;
      before_ = current_;
      baseline_s_ = period_s;
      trial_straggler_ = straggler_moves && want.straggler >= 0;
      trial_degraded_ = degraded_moves && !want.degraded.empty();
      if (!trial_straggler_ && !trial_degraded_) trial_ = false;  // only a component left
    }
  }
  current_ = want;  // factors of unchanged degraded ranks follow the latest probe
  return current_;
}

}  // namespace stragg
