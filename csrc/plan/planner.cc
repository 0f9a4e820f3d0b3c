#include "plan/planner.h"

#include <algorithm>
#include <sstream>

#include "core/generators.h"
#include "core/simulator.h"
#include "core/verifier.h"
#include "plan/lower.h"
#include "runtime/error.h"
#include "runtime/ring_plan.h"

namespace stragg {
namespace {

bool needs_straggler(const std::string& algo) {
  return algo == "stragglar" || algo == "bcast" || algo == "optcc";
}

// Candidates of "auto" without a straggler. Direct is not one: the flat alpha-beta model charges
// its n-1 concurrent messages a single alpha, which overstates it wherever the messages of one
// round are serialised (shared memory on a few cores: measured slower than RHD at 4 KiB).
const std::vector<std::string>& auto_candidates() {
  static const std::vector<std::string> c = {"ring", "rhd"};
  return c;
}

constexpr size_t kAutoChoiceCacheLimit = 4096;

}  // namespace

const std::vector<std::string>& planner_algorithms() {
  static const std::vector<std::string> names = {"auto",   "ring",      "rhd",  "direct",
                                                 "bcast", "stragglar", "optcc"};
  return names;
}

Planner::Planner(int n, PlannerConfig config) : n_(n), config_(std::move(config)) {
  const auto& names = planner_algorithms();
  if (std::find(names.begin(), names.end(), config_.algo) == names.end()) {
    std::string all;
    for (const auto& a : names) all += (all.empty() ? "" : ", ") + a;
    throw Error("stragg: unknown STRAGG_ALGO '" + config_.algo + "' (expected one of " + all + ")");
  }
  if (config_.straggler >= n_ || config_.straggler < kProfiledStraggler) {
    throw Error("stragg: STRAGG_STRAGGLER=" + std::to_string(config_.straggler) +
                " is not a rank of this group of " + std::to_string(n_));
  }
  if (!(config_.alpha_s >= 0) || !(config_.beta_s_per_byte >= 0)) {
    throw Error("stragg: the cost model needs alpha >= 0 and beta >= 0");
  }
  if (config_.straggler == kDynamicStraggler && config_.algo != "auto" &&
      config_.algo != "stragglar") {
    throw Error("stragg: STRAGG_STRAGGLER=dynamic works with STRAGG_ALGO=auto or stragglar, not '" +
                config_.algo + "'");
  }
  // The profiler only steers "auto"; with an explicit algorithm it just observes.
  if (config_.straggler == kProfiledStraggler && config_.algo != "auto") {
    config_.straggler = kNoStraggler;
  }
  stragglar_ok_ = n_ >= 3 && core::stragglar_builds_fast(n_);
  if (n_ >= 3 && !stragglar_ok_) {
    notes_.push_back("no fast StragglAR schedule for " + std::to_string(n_) +
                     " ranks (no stored or constructed design): building one would take minutes, "
                     "so straggler-aware calls run Ring");
  }
  algorithm_ = config_.algo;
  if (n_ <= 1) {
    algorithm_ = "ring";
    return;
  }
  if (algorithm_ == "auto") {
    const bool has_straggler = config_.straggler != kNoStraggler;
    if (has_straggler && n_ <= 2) {
      notes_.push_back("StragglAR needs at least 3 ranks; this group of " + std::to_string(n_) +
                       " runs the cost model's choice without a straggler");
    } else if (config_.straggler >= 0 && stragglar_ok_) {
      algorithm_ = "stragglar";
    }
  }
  if (algorithm_ == "stragglar" && !stragglar_ok_) {
    notes_.push_back(n_ <= 2 ? "StragglAR needs at least 3 ranks: Ring runs instead"
                             : "StragglAR falls back to Ring for this group size");
    algorithm_ = "ring";
  }
  if (algorithm_ == "auto" || algorithm_ == "ring") return;
  if (needs_straggler(algorithm_) && config_.straggler < 0 && !dynamic()) {
    config_.straggler = n_ - 1;
  }
  // Build (and verify) the fixed schedule now so a bad configuration fails at setup.
  schedule_for(algorithm_, dynamic() ? n_ - 1 : config_.straggler);
}

std::shared_ptr<const core::Schedule> Planner::schedule_for(const std::string& algorithm,
                                                            int straggler) const {
  const int s = needs_straggler(algorithm) ? straggler : kNoStraggler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = schedules_.find({algorithm, s});
    if (it != schedules_.end()) return it->second;
  }
  std::ostringstream params;
  params << "{";
  if (s >= 0) {
    params << "\"straggler\": " << s;
    if (algorithm == "optcc") params << ", \"slowdown\": " << config_.slowdown;
  }
  params << "}";
  std::shared_ptr<const core::Schedule> built;
  try {
    auto sched = std::make_shared<core::Schedule>(core::build(algorithm, n_, params.str()));
    core::verify_or_throw(*sched);
    built = std::move(sched);
  } catch (const std::exception& e) {
    throw Error("stragg: cannot build the '" + algorithm + "' schedule for " + std::to_string(n_) +
                " ranks: " + e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = schedules_[{algorithm, s}];
  if (!slot) slot = std::move(built);
  return slot;
}

void Planner::set_link_model(double alpha_s, double beta_s_per_byte) {
  if (!(alpha_s >= 0) || !(beta_s_per_byte >= 0)) {
    throw Error("stragg: the cost model needs alpha >= 0 and beta >= 0");
  }
  std::lock_guard<std::mutex> lock(mu_);
  config_.alpha_s = alpha_s;
  config_.beta_s_per_byte = beta_s_per_byte;
  auto_choice_.clear();
}

double Planner::predict(const std::string& algorithm, size_t bytes) const {
  if (n_ <= 1) return 0.0;
  auto s = schedule_for(algorithm, n_ - 1);
  core::SimOptions opt;
  opt.nbytes = static_cast<double>(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    opt.alpha = config_.alpha_s;
    opt.beta = config_.beta_s_per_byte;
  }
  return core::simulate(*s, opt).time;
}

std::string Planner::auto_base(size_t bytes) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = auto_choice_.find(bytes);
    if (it != auto_choice_.end()) return it->second;
  }
  const double ring = predict("ring", bytes);
  std::string best = "ring";
  double best_time = ring * (1.0 - config_.switch_margin);
  for (const auto& algo : auto_candidates()) {
    if (algo == "ring") continue;
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
  if (n_ <= 1) {
    c.algorithm = "ring";
    return c;
  }
  if (config_.algo == "auto") {
    if (call_straggler >= 0 && call_straggler < n_ && stragglar_ok_) {
      c.algorithm = "stragglar";
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
      c.algorithm = "ring";
    }
    return c;
  }
  if (needs_straggler(c.algorithm)) c.straggler = config_.straggler;
  return c;
}

RankPlan Planner::plan(int rank, const PlanChoice& choice, size_t numel, size_t elem_size,
                       bool ordered_recvs) const {
  if (choice.algorithm == "ring" || n_ <= 1) return ring_allreduce_plan(rank, n_, numel);
  auto s = schedule_for(choice.algorithm, choice.straggler);
  return lower_schedule(*s, rank, numel, elem_size, config_.max_staging_bytes, ordered_recvs);
}

}  // namespace stragg
