#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/error.h"
#include "core/generators.h"
#include "core/simulator.h"
#include "core/verifier.h"
#include "plan/lower.h"

namespace stragg {
namespace {

// Candidates of Auto without a straggler. Direct is not one: the flat alpha-beta model charges
// its n-1 concurrent messages a single alpha, which overstates it wherever the messages of one
// round are serialised (shared memory on a few cores).
constexpr Algorithm kAutoCandidates[] = {Algorithm::Ring, Algorithm::Rhd};
// Recursive doubling is a candidate of Auto without a straggler up to this size (host calls
// only: PlannerConfig::rd_max_bytes). It sends the whole buffer every round, and its swapped
// reduces go through a bounce buffer, so beyond small sizes RHD/Ring move less memory.

constexpr size_t kAutoChoiceCacheLimit = 4096;
constexpr size_t kLoweredCacheLimit = 64;
// A pipelined schedule (OptCC, StragglAR-direct) needs at least this many bytes per chunk to be
// worth a candidate (below, alpha rules).
constexpr double kMinSegmentChunkBytes = 4096;
// OptCC's (and StragglAR-direct's) segment count: among the counts predicted within this share
// of the fastest, the largest runs. The executor overlaps a segment's latency with the other
// segments' transfers, which the lockstep model does not credit, so more segments run faster
// and steadier than it predicts (docs/benchmarks.md, "Numbers behind constants").
constexpr double kSegmentTolerance = 0.02;

void check_link(const LinkModel& l) {
  if (!(l.alpha_s >= 0) || !(l.beta_s_per_byte >= 0)) {
    throw Error("stragg: the cost model needs alpha >= 0 and beta >= 0");
  }
}

// Measured factors are quantised (to 0.05) so that schedules and choices are cached per network
// state rather than per probe's noise; every rank quantises the same exchanged numbers alike.
double quantise(double l) { return std::max(1.0, std::round(l * 20.0) / 20.0); }

std::vector<std::pair<int, double>> slow_key(const std::vector<Slowdown>& slow) {
  std::vector<std::pair<int, double>> out;
  for (const auto& s : slow) out.emplace_back(s.rank, s.factor);
  return out;
}

}  // namespace

std::string PlanChoice::describe() const {
  std::ostringstream out;
  out << algorithm_name(algorithm);
  if (algorithm == Algorithm::StragglarDirect) {
    out << "(" << straggler;
    if (segments > 0) out << ",k=" << segments;
    out << ")";
  } else if (algorithm == Algorithm::Optcc) {
    out << "(";
    for (size_t i = 0; i < slow.size(); ++i) {
      out << (i ? "," : "") << slow[i].rank << "=" << slow[i].factor;
    }
    if (segments > 0) out << (slow.empty() ? "" : ",") << "k=" << segments;
    out << ")";
  } else if (straggler >= 0) {
    out << "(" << straggler << ")";
  }
  return out.str();
}

PlannerConfig PlannerConfig::from(const Settings& s) {
  PlannerConfig c;
  c.algo = s.algo;
  c.straggler = s.straggler;
  c.slowdowns = s.slowdowns;
  c.optcc_segments = s.optcc_segments;
  c.link = s.link_model();
  return c;
}

const std::vector<int>& Planner::optcc_segment_candidates() {
  static const std::vector<int> k = {1, 2, 4, 8, 16, 32, 64, 128};
  return k;
}

Planner::Planner(int n, PlannerConfig config) : n_(n), config_(std::move(config)) {
  Straggler& st = config_.straggler;
  if (st.is_rank() && (st.rank < 0 || st.rank >= n_)) {
    throw Error("stragg: STRAGG_STRAGGLER=" + std::to_string(st.rank) +
                " is not a rank of this group of " + std::to_string(n_));
  }
  for (const Slowdown& s : config_.slowdowns) {
    if (s.rank < 0 || s.rank >= n_) {
      throw Error("stragg: STRAGG_SLOWDOWN names rank " + std::to_string(s.rank) +
                  ", which is not a rank of this group of " + std::to_string(n_));
    }
  }
  check_link(config_.link);
  measured_.link = config_.link;
  if (dynamic() && config_.algo != Algorithm::Auto && config_.algo != Algorithm::Stragglar) {
    throw Error(std::string("stragg: STRAGG_STRAGGLER=dynamic works with STRAGG_ALGO=auto or "
                            "stragglar, not '") +
                algorithm_name(config_.algo) + "'");
  }
  // The profiler only steers Auto; with an explicit algorithm it just observes.
  if (profiled() && config_.algo != Algorithm::Auto) st = Straggler::none();
  stragglar_ok_ = n_ >= 3 && core::stragglar_builds_fast(n_);
  if (n_ >= 3 && !stragglar_ok_) {
    notes_.push_back("no fast StragglAR schedule for " + std::to_string(n_) +
                     " ranks (no stored or constructed design): building one would take minutes, "
                     "so straggler-aware calls run Ring");
  }
  algorithm_ = config_.algo;
  if (n_ <= 1) {
    algorithm_ = Algorithm::Ring;
    return;
  }
  if (algorithm_ == Algorithm::Auto) {
    const bool has_straggler = st.kind != Straggler::Kind::None;
    if (has_straggler && n_ <= 2) {
      notes_.push_back("StragglAR needs at least 3 ranks; this group of " + std::to_string(n_) +
                       " runs the cost model's choice without a straggler");
    } else if (st.is_rank() && stragglar_ok_) {
      algorithm_ = Algorithm::Stragglar;
    }
  }
  if (algorithm_ == Algorithm::Stragglar && !stragglar_ok_) {
    notes_.push_back(n_ <= 2 ? "StragglAR needs at least 3 ranks: Ring runs instead"
                             : "StragglAR falls back to Ring for this group size");
    algorithm_ = Algorithm::Ring;
  }
  if (algorithm_ == Algorithm::Auto) return;
  if (algorithm_needs_straggler(algorithm_) && !st.is_rank() && !dynamic()) {
    st = Straggler::of_rank(algorithm_ == Algorithm::Optcc && !config_.slowdowns.empty()
                                ? config_.slowdowns.front().rank
                                : n_ - 1);
  }
  // Build (and verify) the fixed schedule now so a bad configuration fails at setup.
  schedule_for(fixed_choice(dynamic() ? n_ - 1 : st.rank, network()));
}

Planner::ScheduleKey Planner::schedule_key(const PlanChoice& choice) {
  const Algorithm algo = choice.algorithm;
  const bool segmented = algo == Algorithm::Optcc || algo == Algorithm::StragglarDirect;
  return {algo, algorithm_has_one_straggler(algo) ? choice.straggler : -1,
          slow_key(algo == Algorithm::Optcc ? choice.slow : std::vector<Slowdown>{}),
          segmented ? choice.segments : 0};
}

std::shared_ptr<const core::Schedule> Planner::schedule_for(const PlanChoice& choice) const {
  const Algorithm algo = choice.algorithm;
  const ScheduleKey key = schedule_key(choice);
  const int s = std::get<1>(key);
  const std::vector<Slowdown> slow = algo == Algorithm::Optcc ? choice.slow : std::vector<Slowdown>{};
  const int k = std::get<3>(key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = schedules_.find(key);
    if (it != schedules_.end()) return it->second;
  }
  core::BuildParams params;
  if (s >= 0) params.stragglers = {s};
  for (const Slowdown& d : slow) {
    params.stragglers.push_back(d.rank);
    params.slowdowns.push_back(d.factor);
  }
  if (k > 0) params.segments = k;
  std::shared_ptr<const core::Schedule> built;
  try {
    auto sched = std::make_shared<core::Schedule>(core::build(algo, n_, params));
    core::verify_or_throw(*sched);
    built = std::move(sched);
  } catch (const std::exception& e) {
    throw Error("stragg: cannot build the '" + choice.describe() + "' schedule for " +
                std::to_string(n_) + " ranks: " + e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = schedules_[key];
  if (!slot) slot = std::move(built);
  return slot;
}

void Planner::set_link_model(const LinkModel& link) {
  NetworkModel net = network();
  net.link = link;
  net.degraded.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    net.degraded = measured_.degraded;
  }
  set_network(net);
}

void Planner::set_network(const NetworkModel& network) {
  check_link(network.link);
  for (const Slowdown& s : network.degraded) {
    if (s.rank < 0 || s.rank >= n_ || !(s.factor >= 1)) {
      throw Error("stragg: network model: bad degraded rank " + std::to_string(s.rank) +
                  " with factor " + std::to_string(s.factor));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  measured_ = network;
  for (auto& s : measured_.degraded) s.factor = quantise(s.factor);
  measured_.degraded.erase(
      std::remove_if(measured_.degraded.begin(), measured_.degraded.end(),
                     [](const Slowdown& s) { return s.factor <= 1.0; }),
      measured_.degraded.end());
  config_.link = network.link;
  auto_choice_.clear();
  degraded_choice_.clear();
  profiled_choice_.clear();
}

LinkModel Planner::link_model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_.link;
}

NetworkModel Planner::network() const {
  std::lock_guard<std::mutex> lock(mu_);
  NetworkModel net = measured_;
  if (!config_.slowdowns.empty()) net.degraded = config_.slowdowns;
  return net;
}

double Planner::predict(const PlanChoice& choice, size_t bytes, int late_rank,
                        double delay_s) const {
  if (n_ <= 1) return 0.0;
  auto s = schedule_for(choice);
  const NetworkModel net = network();
  core::SimOptions opt;
  opt.nbytes = static_cast<double>(bytes);
  opt.alpha = net.link.alpha_s;
  opt.beta = net.link.beta_s_per_byte;
  opt.slowdown.assign(n_, 1.0);
  for (const Slowdown& d : net.degraded) opt.slowdown[d.rank] = d.factor;
  if (late_rank >= 0 && late_rank < n_ && delay_s > 0) {
    opt.arrival.assign(n_, 0.0);
    opt.arrival[late_rank] = delay_s;
  }
  return core::simulate(*s, opt).time;
}

double Planner::predict(Algorithm algorithm, size_t bytes) const {
  PlanChoice c;
  c.algorithm = algorithm;
  if (algorithm == Algorithm::Optcc) {
    c.slow = network().degraded;
    if (c.slow.empty()) c.slow = {{n_ - 1, 2.0}};
  } else if (algorithm_needs_straggler(algorithm)) {
    c.straggler = n_ - 1;
  }
  return predict(c, bytes);
}

double Planner::predict_oneshot(size_t bytes) const {
  const LinkModel link = link_model();
  return link.alpha_s + static_cast<double>(n_ - 1) * static_cast<double>(bytes) * link.beta_s_per_byte;
}

PlanChoice Planner::auto_base(size_t bytes, bool allow_rd) const {
  allow_rd = allow_rd && bytes <= config_.rd_max_bytes;
  const std::pair<size_t, bool> key{bytes, allow_rd};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = auto_choice_.find(key);
    if (it != auto_choice_.end()) return it->second;
  }
  PlanChoice best;
  best.predicted_s = predict(Algorithm::Ring, bytes);
  double best_time = best.predicted_s * (1.0 - config_.switch_margin);
  std::vector<Algorithm> candidates(std::begin(kAutoCandidates), std::end(kAutoCandidates));
  if (allow_rd) candidates.push_back(Algorithm::Rd);
  for (Algorithm algo : candidates) {
    if (algo == Algorithm::Ring) continue;
    const double t = predict(algo, bytes);
    if (t < best_time) {
      best.algorithm = algo;
      best.predicted_s = t;
      best_time = t;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto_choice_.size() >= kAutoChoiceCacheLimit) auto_choice_.clear();
  auto_choice_[key] = best;
  return best;
}

// Delays are bucketed (x1.25) so that a cache keyed by them holds a few entries per size.
double Planner::delay_bucket(double delay_s) {
  return delay_s > 0 ? std::pow(1.25, std::round(std::log(delay_s) / std::log(1.25))) : 0.0;
}

PlanChoice Planner::auto_profiled(size_t bytes, int straggler, double delay_s, bool host) const {
  const double bucket = delay_bucket(delay_s);
  const AutoKey key{bytes, host ? straggler : -2 - straggler, bucket};  // GPU calls: keys < 0
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = profiled_choice_.find(key);
    if (it != profiled_choice_.end()) return it->second;
  }
  PlanChoice stragglar;
  stragglar.algorithm = Algorithm::Stragglar;
  stragglar.straggler = straggler;
  const PlanChoice base = auto_base(bytes, host);
  // Compared with the delay; what the call records is as without the straggler: the base's
  // delay-free prediction (the profiler's drift check compares it with the last arrival's
  // duration) and none for StragglAR, as before.
  PlanChoice best = base;
  double best_time = predict(base, bytes, straggler, bucket);
  const double stragglar_time = predict(stragglar, bytes, straggler, bucket);
  if (stragglar_time <= best_time) {
    best = stragglar;
    best_time = stragglar_time;
  }
  if (host && direct_candidate()) {
    PlanChoice direct = direct_for_straggler(bytes, straggler, bucket);
    if (direct.predicted_s >= 0 && direct.predicted_s < best_time) {
      direct.predicted_s = 0;  // as StragglAR: no delay-free prediction recorded
      best = direct;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (profiled_choice_.size() >= kAutoChoiceCacheLimit) profiled_choice_.clear();
  profiled_choice_[key] = best;
  return best;
}

PlanChoice Planner::auto_degraded(size_t bytes, int call_straggler, double delay_s,
                                  const NetworkModel& net) const {
  const double bucket = delay_bucket(delay_s);
  const AutoKey key{bytes, call_straggler, bucket};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = degraded_choice_.find(key);
    if (it != degraded_choice_.end()) return it->second;
  }
  std::vector<PlanChoice> candidates;
  for (Algorithm a : kAutoCandidates) {
    PlanChoice c;
    c.algorithm = a;
    candidates.push_back(c);
  }
  double optcc_fastest = -1;  // OptCC is judged by its fastest count, runs the most segments
  if (n_ >= 3 && n_ - static_cast<int>(net.degraded.size()) >= 1) {
    PlanChoice optcc;
    optcc.algorithm = Algorithm::Optcc;
    optcc.slow = net.degraded;
    optcc = fastest_segments(bytes, optcc, call_straggler, bucket, &optcc_fastest);
    if (optcc.predicted_s >= 0) candidates.push_back(optcc);
  }
  if (call_straggler >= 0 && call_straggler < n_ && stragglar_ok_) {
    PlanChoice c;
    c.algorithm = Algorithm::Stragglar;
    c.straggler = call_straggler;
    candidates.push_back(c);
  }
  if (call_straggler >= 0 && call_straggler < n_ && direct_candidate()) {
    PlanChoice c = direct_for_straggler(bytes, call_straggler, bucket);
    if (c.predicted_s >= 0) candidates.push_back(c);  // predicted with its fastest k
  }
  PlanChoice best = candidates.front();  // Ring
  const double ring = predict(best, bytes, call_straggler, bucket);
  best.predicted_s = ring;
  double best_time = ring * (1.0 - config_.switch_margin);
  for (size_t i = 1; i < candidates.size(); ++i) {
    PlanChoice c = candidates[i];
    double t = c.algorithm == Algorithm::Optcc ? optcc_fastest : c.predicted_s;
    if (c.algorithm != Algorithm::Optcc && c.algorithm != Algorithm::StragglarDirect) {
      try {
        t = c.predicted_s = predict(c, bytes, call_straggler, bucket);
      } catch (const Error&) {
        continue;  // a generator that cannot serve this configuration is no candidate
      }
    }
    // Against Ring, OptCC needs no margin: a degraded host slows Ring down by more than the
    // model's factor l, so the model already errs in Ring's favour here.
    const bool optcc_vs_ring = c.algorithm == Algorithm::Optcc && best.algorithm == Algorithm::Ring;
    if (t < (optcc_vs_ring ? ring : best_time)) {
      best = c;
      best_time = t;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (degraded_choice_.size() >= kAutoChoiceCacheLimit) degraded_choice_.clear();
  degraded_choice_[key] = best;
  return best;
}

PlanChoice Planner::fixed_choice(int call_straggler, const NetworkModel& net) const {
  PlanChoice c;
  c.algorithm = algorithm_;
  if (algorithm_ == Algorithm::Optcc) {
    c.slow = net.degraded;
    if (c.slow.empty()) c.slow = {{call_straggler >= 0 ? call_straggler : n_ - 1, 2.0}};
    c.segments = config_.optcc_segments;
    return c;
  }
  if (algorithm_needs_straggler(algorithm_)) c.straggler = call_straggler;
  return c;
}

PlanChoice Planner::choose(size_t bytes, int call_straggler, double delay_s, bool host) const {
  PlanChoice c;
  if (n_ <= 1) return c;
  if (config_.algo == Algorithm::Auto) {
    const NetworkModel net = network();
    if (!net.degraded.empty()) return auto_degraded(bytes, call_straggler, delay_s, net);
    if (call_straggler >= 0 && call_straggler < n_ && stragglar_ok_) {
      if (profiled()) return auto_profiled(bytes, call_straggler, delay_s, host);
      c.algorithm = Algorithm::Stragglar;
      c.straggler = call_straggler;
    } else {
      c = auto_base(bytes, host);
    }
    return c;
  }
  if (dynamic()) {
    // STRAGG_ALGO=stragglar with a dynamic straggler: Ring when everybody was on time.
    c.algorithm = Algorithm::Ring;
    if (call_straggler >= 0 && stragglar_ok_) {
      c.algorithm = algorithm_;
      c.straggler = call_straggler;
    }
    return c;
  }
  c = fixed_choice(config_.straggler.rank, network());
  if (c.algorithm == Algorithm::Rd && !host) c.algorithm = Algorithm::Rhd;  // see choose()
  if ((c.algorithm == Algorithm::Optcc || c.algorithm == Algorithm::StragglarDirect) &&
      c.segments == 0) {
    c = best_segments(bytes, c);
  }
  return c;
}

PlanChoice Planner::direct_for_straggler(size_t bytes, int straggler, double delay_s) const {
  PlanChoice c;
  c.algorithm = Algorithm::StragglarDirect;
  c.straggler = straggler;
  return fastest_segments(bytes, c, straggler, delay_s);
}

PlanChoice Planner::best_segments(size_t bytes, const PlanChoice& base) const {
  // Keys below -1 are the explicit algorithm's entries: -2 OptCC, -3 - s StragglAR-direct for s.
  const AutoKey key{bytes, base.algorithm == Algorithm::Optcc ? -2 : -3 - base.straggler, 0.0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = degraded_choice_.find(key);
    if (it != degraded_choice_.end() && it->second.slow == base.slow) return it->second;
  }
  PlanChoice best = fastest_segments(bytes, base, -1, 0.0);
  if (best.predicted_s < 0) best = base;  // keep the generator's default
  std::lock_guard<std::mutex> lock(mu_);
  if (degraded_choice_.size() >= kAutoChoiceCacheLimit) degraded_choice_.clear();
  degraded_choice_[key] = best;
  return best;
}

PlanChoice Planner::fastest_segments(size_t bytes, const PlanChoice& base, int late_rank,
                                     double delay_s, double* fastest_s) const {
  const bool optcc = base.algorithm == Algorithm::Optcc;
  // Ranks that split each segment: OptCC's healthy ranks, StragglAR-direct's early ones.
  const int owners = optcc ? std::max(1, n_ - static_cast<int>(base.slow.size())) : n_ - 1;
  const int forced = optcc ? config_.optcc_segments : 0;
  std::vector<int> ks = optcc_segment_candidates();
  if (forced > 0) ks = {forced};
  std::vector<PlanChoice> options;
  double fastest = -1;
  for (int k : ks) {
    if (k > 1 && forced == 0 &&
        static_cast<double>(bytes) / (k * owners) < kMinSegmentChunkBytes) {
      break;
    }
    PlanChoice c = base;
    c.segments = k;
    try {
      c.predicted_s = predict(c, bytes, late_rank, delay_s);
    } catch (const Error&) {
      continue;  // a generator that cannot serve this configuration is no candidate
    }
    if (fastest < 0 || c.predicted_s < fastest) fastest = c.predicted_s;
    options.push_back(c);
  }
  PlanChoice best = base;
  best.predicted_s = -1;
  for (const PlanChoice& c : options) {  // ascending k: the last one within the tolerance wins
    if (c.predicted_s <= fastest * (1.0 + kSegmentTolerance)) best = c;
  }
  if (fastest_s != nullptr) *fastest_s = fastest;
  return best;
}

std::shared_ptr<const LoweredSchedule> Planner::lower(int rank, const PlanChoice& choice,
                                                      size_t numel, size_t elem_size,
                                                      bool ordered_recvs) const {
  PlanChoice key_choice = choice;
  if (n_ <= 1) key_choice = PlanChoice{};
  const LoweredKey key{schedule_key(key_choice), rank, numel, elem_size, ordered_recvs};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = lowered_.begin(); it != lowered_.end(); ++it) {
      if (it->first == key) {
        lowered_.splice(lowered_.begin(), lowered_, it);  // most recently used first
        return lowered_.front().second;
      }
    }
  }
  std::shared_ptr<const LoweredSchedule> lowered;
  if (n_ <= 1) {
    lowered = std::make_shared<const LoweredSchedule>();
  } else {
    auto s = schedule_for(key_choice);
    lowered = std::make_shared<const LoweredSchedule>(
        lower_schedule(*s, rank, numel, elem_size, config_.max_staging_bytes, ordered_recvs,
                       config_.pipeline_bytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  lowered_.emplace_front(key, lowered);
  if (lowered_.size() > kLoweredCacheLimit) lowered_.pop_back();
  return lowered;
}

namespace {

std::shared_ptr<const LoweredSchedule> fixed_schedule(Algorithm algo, int rank, int n,
                                                      size_t numel) {
  if (n <= 1) return std::make_shared<const LoweredSchedule>();
  // One Planner per (algorithm, group size) (no cost model needed): its caches hold the schedule
  // and the lowered plans of the internal collectives' few sizes.
  static std::mutex mu;
  static std::map<std::pair<Algorithm, int>, std::unique_ptr<Planner>> planners;
  Planner* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = planners[{algo, n}];
    if (!slot) {
      PlannerConfig c;
      c.algo = algo;
      slot = std::make_unique<Planner>(n, c);
    }
    p = slot.get();
  }
  PlanChoice choice;
  choice.algorithm = algo;
  return p->lower(rank, choice, numel, 1);
}

}  // namespace

std::shared_ptr<const LoweredSchedule> ring_allreduce_schedule(int rank, int n, size_t numel) {
  return fixed_schedule(Algorithm::Ring, rank, n, numel);
}

std::shared_ptr<const LoweredSchedule> small_allreduce_schedule(int rank, int n, size_t numel) {
  return fixed_schedule(Algorithm::Rd, rank, n, numel);
}

}  // namespace stragg
