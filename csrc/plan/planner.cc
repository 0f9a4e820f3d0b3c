#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "common/error.h"
#include "core/generators.h"
#include "core/simulator.h"
#include "core/verifier.h"
#include "plan/lower.h"

namespace stragg {
namespace {

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


std::vector<std::pair<int, double>> slow_key(const std::vector<Slowdown>& slow) {
  std::vector<std::pair<int, double>> out;
  for (const auto& s : slow) out.emplace_back(s.rank, s.factor);
  return out;
}

}  // namespace

std::string PlanChoice::describe() const {
  std::ostringstream out;
  if (by_host) out << "host:";
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
  c.host_level = s.host_level;
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
  check_link(config_.local_link);
  measured_.link = config_.link;
  local_link_ = config_.local_link;
  set_up_hosts();
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
  if (host_level_only_) {
    try {
      schedule_for(fixed_choice(dynamic() ? n_ - 1 : st.rank, network()));
    } catch (const Error& e) {
      notes_.push_back(std::string("no host-level plan of ") + algorithm_name(algorithm_) +
                       " for these hosts (" + e.what() + "): flat plans run");
      host_level_only_ = false;
    }
  }
  schedule_for(fixed_choice(dynamic() ? n_ - 1 : st.rank, network()));
}

Planner::ScheduleKey Planner::schedule_key(const PlanChoice& choice) {
  const Algorithm algo = choice.algorithm;
  const bool segmented = algo == Algorithm::Optcc || algo == Algorithm::StragglarDirect;
  // A host-level plan with a late rank is built around it whatever its cross-host algorithm.
  const bool keyed = algorithm_has_one_straggler(algo) || choice.by_host;
  return {algo, keyed ? choice.straggler : -1,
          slow_key(algo == Algorithm::Optcc ? choice.slow : std::vector<Slowdown>{}),
          segmented ? choice.segments : 0, choice.by_host};
}

void Planner::set_up_hosts() {
  const std::vector<int>& h = config_.host_of;
  if (h.empty()) return;
  if (static_cast<int>(h.size()) != n_) {
    throw Error("stragg: planner: host_of names " + std::to_string(h.size()) + " ranks, the group has " +
                std::to_string(n_));
  }
  std::vector<std::vector<int>> hosts;
  try {
    hosts = core::host_ranks(h);
  } catch (const core::ScheduleError& e) {
    throw Error(std::string("stragg: planner: ") + e.what());
  }
  bool mates = false, uniform = true;
  for (const auto& ranks : hosts) {
    mates = mates || ranks.size() > 1;
    uniform = uniform && ranks.size() == hosts[0].size();
  }
  two_level_ = hosts.size() > 1 && mates;
  if (!two_level_) return;
  if (!uniform) {
    std::ostringstream m;
    m << "hosts hold different numbers of ranks (";
    for (size_t i = 0; i < hosts.size(); ++i) m << (i ? ", " : "") << hosts[i].size();
    m << " ranks): host-level plans need the same number on every host, flat plans run";
    if (config_.host_level != HostLevelPolicy::Off) notes_.push_back(m.str());
    return;
  }
  host_level_ok_ = config_.host_level != HostLevelPolicy::Off;
  host_level_only_ = config_.host_level == HostLevelPolicy::On;
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
  if (s >= 0 && !choice.by_host) params.stragglers = {s};
  if (choice.by_host) {
    // OptCC across hosts runs for the slow ranks' hosts (a host at its slowest rank's factor).
    std::map<int, double> hosts;
    for (const Slowdown& d : slow) {
      double& f = hosts[config_.host_of[d.rank]];
      f = std::max(f, d.factor);
    }
    for (const auto& [h, f] : hosts) {
      params.stragglers.push_back(h);
      params.slowdowns.push_back(f);
    }
  } else {
    for (const Slowdown& d : slow) {
      params.stragglers.push_back(d.rank);
      params.slowdowns.push_back(d.factor);
    }
  }
  if (k > 0) params.segments = k;
  std::shared_ptr<const core::Schedule> built;
  try {
    std::shared_ptr<core::Schedule> sched;
    if (choice.by_host) {
      core::HostLevelOptions o;
      o.cross = algo;
      o.cross_params = params;
      o.late_rank = s;
      sched = std::make_shared<core::Schedule>(core::host_level(config_.host_of, o));
    } else {
      sched = std::make_shared<core::Schedule>(core::build(algo, n_, params));
    }
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
  for (auto& s : measured_.degraded) s.factor = quantise_factor(s.factor);
  measured_.degraded.erase(
      std::remove_if(measured_.degraded.begin(), measured_.degraded.end(),
                     [](const Slowdown& s) { return s.factor <= 1.0; }),
      measured_.degraded.end());
  config_.link = network.link;
  auto_choice_.clear();
  segments_choice_.clear();
}

void Planner::set_local_link(const LinkModel& link) {
  check_link(link);
  std::lock_guard<std::mutex> lock(mu_);
  local_link_ = link;
  auto_choice_.clear();
  segments_choice_.clear();
}

LinkModel Planner::local_link() const {
  std::lock_guard<std::mutex> lock(mu_);
  return local_link_;
}

void Planner::set_corrections(const std::map<PlanFamily, double>& corrections) {
  for (const auto& [family, f] : corrections) {
    if (!(f > 0) || !std::isfinite(f)) {
      throw Error("stragg: planner: correction of " + family.describe() + " must be > 0, got " +
                  std::to_string(f));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (corrections == corrections_) return;
  corrections_ = corrections;
  auto_choice_.clear();
}

std::map<PlanFamily, double> Planner::corrections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return corrections_;
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
  return simulate_choice(choice, bytes, late_rank, delay_s, false);
}

double Planner::simulate_choice(const PlanChoice& choice, size_t bytes, int late_rank,
                                double delay_s, bool one_level) const {
  if (n_ <= 1) return 0.0;
  auto s = schedule_for(choice);
  const NetworkModel net = network();
  core::SimOptions opt;
  opt.nbytes = static_cast<double>(bytes);
  opt.alpha = net.link.alpha_s;
  opt.beta = net.link.beta_s_per_byte;
  if (two_level_ && !one_level) {
    const LinkModel local = local_link();
    opt.host_of = config_.host_of;
    opt.local_alpha = local.alpha_s;
    opt.local_beta = local.beta_s_per_byte;
  }
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

PlanChoice Planner::fixed_choice(int call_straggler, const NetworkModel& net) const {
  PlanChoice c;
  c.algorithm = algorithm_;
  c.by_host = host_level_only_;
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
  CallMode mode;
  mode.degraded = network().degraded;
  return choose(bytes, call_straggler, delay_s, host, mode);
}

PlanChoice Planner::choose(size_t bytes, int call_straggler, double delay_s, bool host,
                           const CallMode& mode) const {
  PlanChoice c;
  if (n_ <= 1) return c;
  if (config_.algo == Algorithm::Auto) {
    AutoQuery q;
    q.bytes = bytes;
    q.straggler = call_straggler >= 0 && call_straggler < n_ ? call_straggler : -1;
    q.delay_s = delay_s;
    q.host = host;
    q.profiled = profiled();
    q.mode = mode;
    if (!config_.slowdowns.empty()) q.mode.degraded = config_.slowdowns;
    if (q.mode.degraded.empty() && q.straggler >= 0) {
      if (!stragglar_ok_) {
        q.straggler = -1;  // no StragglAR for this n: the base plans
      } else if (!q.profiled) {
        // A configured or agreed straggler: StragglAR for it (the user or the arrivals said so).
        c.algorithm = Algorithm::Stragglar;
        c.straggler = q.straggler;
        return c;
      }
    }
    return auto_choice(q);
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

PlanChoice Planner::best_segments(size_t bytes, const PlanChoice& base) const {
  // Keys below -1 are the explicit algorithm's entries: -2 OptCC, -3 - s StragglAR-direct for s.
  const AutoKey key{bytes, base.algorithm == Algorithm::Optcc ? -2 : -3 - base.straggler, 0.0,
                    base.by_host ? 1 : 0, {}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_choice_.find(key);
    if (it != segments_choice_.end() && it->second.slow == base.slow) return it->second;
  }
  PlanChoice best = fastest_segments(bytes, base, -1, 0.0);
  if (best.predicted_s < 0) best = base;  // keep the generator's default
  std::lock_guard<std::mutex> lock(mu_);
  if (segments_choice_.size() >= kAutoChoiceCacheLimit) segments_choice_.clear();
  segments_choice_[key] = best;
  return best;
}

PlanChoice Planner::fastest_segments(size_t bytes, const PlanChoice& base, int late_rank,
                                     double delay_s, double* fastest_s, bool one_level) const {
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
      c.predicted_s = simulate_choice(c, bytes, late_rank, delay_s, one_level);
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
    LoweredSchedule plan = lower_schedule(*s, rank, numel, elem_size, config_.max_staging_bytes,
                                          ordered_recvs, config_.pipeline_bytes);
    plan.tag = schedule_tag(key_choice.algorithm, key_choice.by_host);
    lowered = std::make_shared<const LoweredSchedule>(std::move(plan));
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
