// Auto's choice of a call's plan (planner.h): the candidates a call may run, their predicted
// times (the cost model, two-level where ranks share hosts, scaled by the plan check's measured
// corrections) and the rules that pick one.
//
// Candidates, by what the call has (rules kept from the flat planner; host-level variants are
// offered where Planner::host_level_possible() and the call's mode is not flat):
//  * nothing late, no degraded rank: Ring, RHD, recursive doubling (host calls up to
//    rd_max_bytes), host-level Ring and RHD; an alternative to Ring must be switch_margin faster.
//  * the profiler's straggler, no degraded rank: the above's choice, StragglAR, StragglAR-direct
//    (over a network), host-level StragglAR-direct and Ring with the late rank's mates working
//    before it arrives; predicted with the straggler's delay, the fastest runs (no margin).
//  * degraded ranks: Ring, RHD, OptCC (judged by its fastest segment count, no margin over Ring:
//    a degraded host slows Ring by more than the model's l), StragglAR and StragglAR-direct for a
//    late rank, and each one's host-level variant; alternatives but OptCC need switch_margin.
// STRAGG_HOST_LEVEL=on drops the flat candidates (host-level Ring is then the reference).
// Direct is no candidate: the flat alpha-beta model charges its n-1 concurrent messages a single
// alpha, which overstates it wherever the messages of one round are serialised (shared memory on
// a few cores). Recursive doubling sends the whole buffer every round, and its swapped reduces go
// through a bounce buffer, so beyond small sizes RHD/Ring move less memory.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "plan/planner.h"

namespace stragg {
namespace {

constexpr size_t kAutoChoiceCacheLimit = 4096;

std::vector<std::pair<int, double>> key_of(const std::vector<Slowdown>& d) {
  std::vector<std::pair<int, double>> out;
  for (const Slowdown& s : d) out.emplace_back(s.rank, s.factor);
  return out;
}

PlanChoice plan(Algorithm a, bool by_host, int straggler = -1) {
  PlanChoice c;
  c.algorithm = a;
  c.by_host = by_host;
  c.straggler = straggler;
  return c;
}

}  // namespace

// Delays are bucketed (x1.25) so that a cache keyed by them holds a few entries per size.
double Planner::delay_bucket(double delay_s) {
  return delay_s > 0 ? std::pow(1.25, std::round(std::log(delay_s) / std::log(1.25))) : 0.0;
}

double Planner::corrected(const PlanChoice& c, double raw_s, double delay_s) const {
  double f = 1.0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A family not measured yet takes the largest measured correction: the corrections never
    // make an unmeasured plan look better than the measured ones.
    auto it = corrections_.find(c.family());
    if (it != corrections_.end()) {
      f = it->second;
    } else if (!corrections_.empty()) {
      f = 0;
      for (const auto& [family, g] : corrections_) f = std::max(f, g);
    }
  }
  const double post = std::max(0.0, raw_s - delay_s);
  return raw_s - post + f * post;
}

double Planner::rate(PlanChoice& c, const AutoQuery& q) const {
  const bool late = q.straggler >= 0 && q.delay_s > 0;
  const int late_rank = late ? q.straggler : -1;
  const double delay = late ? q.delay_s : 0.0;
  double judged = -1;
  const bool one_level = q.mode.one_level;
  try {
    if (c.algorithm == Algorithm::Optcc || c.algorithm == Algorithm::StragglarDirect) {
      double fastest = -1;
      PlanChoice best = fastest_segments(q.bytes, c, late_rank, delay, &fastest, one_level);
      if (best.predicted_s < 0) return -1;
      const bool by_fastest = c.algorithm == Algorithm::Optcc;
      c = best;
      judged = by_fastest ? fastest : c.predicted_s;
    } else {
      c.predicted_s = simulate_choice(c, q.bytes, late_rank, delay, one_level);
      judged = c.predicted_s;
    }
  } catch (const Error&) {
    return -1;  // a generator that cannot serve this configuration is no candidate
  }
  c.post_arrival_s = std::max(0.0, c.predicted_s - delay);
  if (q.mode.corrected) {
    c.predicted_s = corrected(c, c.predicted_s, delay);
    judged = corrected(c, judged, delay);
  }
  return judged;
}

std::vector<Planner::Candidate> Planner::candidates(const AutoQuery& q) const {
  const bool hosts = host_level_ok_ && !q.mode.flat && q.host;
  const bool flat = !hosts || !host_level_only_;
  const bool degraded = !q.mode.degraded.empty();
  const int s = q.straggler;
  const double m = config_.switch_margin;
  std::vector<Candidate> out;
  auto add = [&](PlanChoice c, double margin) {
    Candidate cand;
    cand.choice = std::move(c);
    cand.margin = margin;
    out.push_back(std::move(cand));
  };
  // The Rings first (the flat one the reference, the host-level one must beat it by the margin),
  // then the others, which must beat the Ring chosen by the margin too.
  if (flat) add(plan(Algorithm::Ring, false), 0);
  if (hosts) add(plan(Algorithm::Ring, true), flat ? m : 0);
  for (bool by_host : {false, true}) {
    if (by_host ? !hosts : !flat) continue;
    add(plan(Algorithm::Rhd, by_host), m);
    if (!by_host && !degraded && q.host && q.bytes <= config_.rd_max_bytes) {
      add(plan(Algorithm::Rd, false), m);
    }
  }
  if (degraded && n_ >= 3 && n_ - static_cast<int>(q.mode.degraded.size()) >= 1) {
    for (bool by_host : {false, true}) {
      if (by_host ? !hosts : !flat) continue;
      PlanChoice o = plan(Algorithm::Optcc, by_host);
      o.slow = q.mode.degraded;
      add(o, 0);
    }
  }
  if (s >= 0) {
    // Without degraded ranks the straggler's schedules need no margin (they are compared with the
    // base plan's time with the delay, as the straggler profiler's gain is).
    const double sm = degraded ? m : 0;
    if (flat && stragglar_ok_) add(plan(Algorithm::Stragglar, false, s), sm);
    if (flat && q.host && direct_candidate()) add(plan(Algorithm::StragglarDirect, false, s), sm);
    if (hosts) {
      add(plan(Algorithm::StragglarDirect, true, s), sm);
      add(plan(Algorithm::Ring, true, s), sm);
    }
  }
  return out;
}

PlanChoice Planner::auto_choice(const AutoQuery& query) const {
  AutoQuery q = query;
  q.delay_s = delay_bucket(q.delay_s);
  // Factors as the measured network holds them (quantised: one schedule per network state).
  for (Slowdown& d : q.mode.degraded) d.factor = quantise_factor(d.factor);
  const int flags = (q.host ? 1 : 0) | (q.mode.flat ? 2 : 0) | (q.mode.corrected ? 4 : 0) |
                    (q.mode.one_level ? 8 : 0);
  const AutoKey key{q.bytes, q.straggler, q.delay_s, flags, key_of(q.mode.degraded)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = auto_choice_.find(key);
    if (it != auto_choice_.end()) return it->second;
  }
  std::vector<Candidate> cands = candidates(q);
  // With a straggler and no degraded rank, the base plans are chosen among themselves without
  // its delay (it adds to each alike), and the straggler's schedules are then compared with the
  // base's time with it (ties go to them). Otherwise every candidate is predicted with the delay
  // and an alternative to the reference (the first candidate) must beat it by its margin; once
  // one has, the next must beat that one.
  const bool vs_base = q.straggler >= 0 && q.mode.degraded.empty();
  AutoQuery base_q = q;
  if (vs_base) {
    base_q.straggler = -1;
    base_q.delay_s = 0;
  }
  Candidate best;
  bool have = false;
  // Margins are taken against a Ring (flat or host-level): once another plan is ahead, the next
  // must just beat it.
  auto offer = [&](Candidate& c, double t) {
    if (!have) {
      best = c;
      best.time_s = t;
      have = true;
      return;
    }
    const bool vs_ring = best.choice.algorithm == Algorithm::Ring && best.choice.straggler < 0;
    if (t < (vs_ring ? best.time_s * (1.0 - c.margin) : best.time_s)) {
      best = c;
      best.time_s = t;
    }
  };
  for (Candidate& c : cands) {  // the base plans
    if (c.choice.straggler >= 0 || c.choice.algorithm == Algorithm::Optcc) continue;
    const double t = rate(c.choice, base_q);
    if (t >= 0) offer(c, t);
  }
  if (vs_base && have) {
    PlanChoice with_delay = best.choice;  // best keeps its delay-free prediction
    const double t = rate(with_delay, q);
    if (t >= 0) best.time_s = t;
  }
  for (Candidate& c : cands) {  // the straggler's schedules and OptCC
    if (c.choice.straggler < 0 && c.choice.algorithm != Algorithm::Optcc) continue;
    const double t = rate(c.choice, q);
    if (t < 0) continue;
    if (vs_base && have && c.choice.straggler >= 0) {
      if (t <= best.time_s) {
        best = c;
        best.time_s = t;
      }
      continue;
    }
    offer(c, t);
  }
  if (!have) best.choice = plan(Algorithm::Ring, false);  // nothing builds: the plain Ring
  std::lock_guard<std::mutex> lock(mu_);
  if (auto_choice_.size() >= kAutoChoiceCacheLimit) auto_choice_.clear();
  auto_choice_[key] = best.choice;
  return best.choice;
}

}  // namespace stragg
