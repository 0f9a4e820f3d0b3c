#include "plan/planner.h"

#include <algorithm>

#include "core/generators.h"
#include "core/simulator.h"
#include "core/verifier.h"
#include "plan/lower.h"
#include "runtime/error.h"

namespace stragg {
namespace {

// Candidates of Auto without a straggler. Direct is not one: the flat alpha-beta model charges
// its n-1 concurrent messages a single alpha, which overstates it wherever the messages of one
// round are serialised (shared memory on a few cores: measured slower than RHD at 4 KiB).
constexpr Algorithm kAutoCandidates[] = {Algorithm::Ring, Algorithm::Rhd};

constexpr size_t kAutoChoiceCacheLimit = 4096;
constexpr size_t kPlanCacheLimit = 64;

void check_link(const LinkModel& l) {
  if (!(l.alpha_s >= 0) || !(l.beta_s_per_byte >= 0)) {
    throw Error("stragg: the cost model needs alpha >= 0 and beta >= 0");
  }
}

}  // namespace

PlannerConfig PlannerConfig::from(const Settings& s) {
  PlannerConfig c;
  c.algo = s.algo;
  c.straggler = s.straggler;
  c.slowdowns = s.slowdowns;
  c.link = s.link_model();
  return c;
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
  schedule_for(algorithm_, dynamic() ? n_ - 1 : st.rank);
}

std::shared_ptr<const core::Schedule> Planner::schedule_for(Algorithm algorithm,
                                                            int straggler) const {
  const int s = algorithm_needs_straggler(algorithm) ? straggler : -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = schedules_.find({algorithm, s});
    if (it != schedules_.end()) return it->second;
  }
  core::BuildParams params;
  if (algorithm == Algorithm::Optcc && !config_.slowdowns.empty()) {
    for (const Slowdown& d : config_.slowdowns) {
      params.stragglers.push_back(d.rank);
      params.slowdowns.push_back(d.factor);
    }
  } else if (s >= 0) {
    params.stragglers = {s};
    if (algorithm == Algorithm::Optcc) params.slowdowns = {2.0};
  }
  std::shared_ptr<const core::Schedule> built;
  try {
    auto sched = std::make_shared<core::Schedule>(core::build(algorithm, n_, params));
    core::verify_or_throw(*sched);
    built = std::move(sched);
  } catch (const std::exception& e) {
    throw Error(std::string("stragg: cannot build the '") + algorithm_name(algorithm) +
                "' schedule for " + std::to_string(n_) + " ranks: " + e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = schedules_[{algorithm, s}];
  if (!slot) slot = std::move(built);
  return slot;
}

void Planner::set_link_model(const LinkModel& link) {
  check_link(link);
  std::lock_guard<std::mutex> lock(mu_);
  config_.link = link;
  auto_choice_.clear();
}

LinkModel Planner::link_model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_.link;
}

double Planner::predict(Algorithm algorithm, size_t bytes) const {
  if (n_ <= 1) return 0.0;
  auto s = schedule_for(algorithm, n_ - 1);
  core::SimOptions opt;
  opt.nbytes = static_cast<double>(bytes);
  const LinkModel link = link_model();
  opt.alpha = link.alpha_s;
  opt.beta = link.beta_s_per_byte;
  return core::simulate(*s, opt).time;
}

Algorithm Planner::auto_base(size_t bytes) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = auto_choice_.find(bytes);
    if (it != auto_choice_.end()) return it->second;
  }
  Algorithm best = Algorithm::Ring;
  double best_time = predict(Algorithm::Ring, bytes) * (1.0 - config_.switch_margin);
  for (Algorithm algo : kAutoCandidates) {
    if (algo == Algorithm::Ring) continue;
    const double t = predict(algo, bytes);
    if (t < best_time) {
      best = algo;
      best_time = t;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto_choice_.size() >= kAutoChoiceCacheLimit) auto_choice_.clear();
  auto_choice_[bytes] = best;
  return best;
}

PlanChoice Planner::choose(size_t bytes, int call_straggler) const {
  PlanChoice c;
  if (n_ <= 1) return c;
  if (config_.algo == Algorithm::Auto) {
    if (call_straggler >= 0 && call_straggler < n_ && stragglar_ok_) {
      c.algorithm = Algorithm::Stragglar;
      c.straggler = call_straggler;
    } else {
      c.algorithm = auto_base(bytes);
    }
    return c;
  }
  c.algorithm = algorithm_;
  if (dynamic()) {
    // STRAGG_ALGO=stragglar with a dynamic straggler: Ring when everybody was on time.
    if (call_straggler >= 0 && stragglar_ok_) {
      c.straggler = call_straggler;
    } else {
      c.algorithm = Algorithm::Ring;
    }
    return c;
  }
  if (algorithm_needs_straggler(c.algorithm)) c.straggler = config_.straggler.rank;
  return c;
}

std::shared_ptr<const RankPlan> Planner::plan(int rank, const PlanChoice& choice, size_t numel,
                                              size_t elem_size, bool ordered_recvs) const {
  const Algorithm algo = n_ <= 1 ? Algorithm::Ring : choice.algorithm;
  const PlanKey key{algo, choice.straggler, rank, numel, elem_size, ordered_recvs};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = plans_.begin(); it != plans_.end(); ++it) {
      if (it->first == key) {
        plans_.splice(plans_.begin(), plans_, it);  // most recently used first
        return plans_.front().second;
      }
    }
  }
  std::shared_ptr<const RankPlan> lowered;
  if (n_ <= 1) {
    lowered = std::make_shared<const RankPlan>();
  } else {
    auto s = schedule_for(algo, choice.straggler);
    lowered = std::make_shared<const RankPlan>(
        lower_schedule(*s, rank, numel, elem_size, config_.max_staging_bytes, ordered_recvs));
  }
  std::lock_guard<std::mutex> lock(mu_);
  plans_.emplace_front(key, lowered);
  if (plans_.size() > kPlanCacheLimit) plans_.pop_back();
  return lowered;
}

std::shared_ptr<const RankPlan> ring_allreduce_plan(int rank, int n, size_t numel) {
  if (n <= 1) return std::make_shared<const RankPlan>();
  // One Planner per group size (Ring needs no cost model): its caches hold the schedule and the
  // lowered plans of the internal collectives' few sizes.
  static std::mutex mu;
  static std::map<int, std::unique_ptr<Planner>> planners;
  Planner* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = planners[n];
    if (!slot) {
      PlannerConfig c;
      c.algo = Algorithm::Ring;
      slot = std::make_unique<Planner>(n, c);
    }
    p = slot.get();
  }
  PlanChoice ring;
  return p->plan(rank, ring, numel, 1);
}

}  // namespace stragg
