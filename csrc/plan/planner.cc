#include "plan/planner.h"

#include <algorithm>
#include <sstream>

#include "core/generators.h"
#include "core/verifier.h"
#include "plan/lower.h"
#include "runtime/error.h"
#include "runtime/ring_plan.h"

namespace stragg {

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
  if (config_.straggler == kDynamicStraggler) {
    if (config_.algo != "auto" && config_.algo != "stragglar") {
      throw Error("stragg: STRAGG_STRAGGLER=dynamic works with STRAGG_ALGO=auto or stragglar, not '" +
                  config_.algo + "'");
    }
    algorithm_ = n_ > 2 ? "stragglar" : "ring";
    return;
  }
  if (config_.straggler >= n_ || config_.straggler < kNoStraggler) {
    throw Error("stragg: STRAGG_STRAGGLER=" + std::to_string(config_.straggler) +
                " is not a rank of this group of " + std::to_string(n_));
  }
  algorithm_ = config_.algo;
  if (algorithm_ == "auto") algorithm_ = config_.straggler >= 0 && n_ > 2 ? "stragglar" : "ring";
  // Ring runs on the built-in pipelined plan; so does every algorithm at n <= 1.
  if (algorithm_ == "ring" || n_ <= 1) return;

  const bool needs_straggler =
      algorithm_ == "stragglar" || algorithm_ == "bcast" || algorithm_ == "optcc";
  if (needs_straggler && config_.straggler < 0) config_.straggler = n_ - 1;
  schedule_ = build(needs_straggler ? config_.straggler : kNoStraggler);
}

std::shared_ptr<const core::Schedule> Planner::build(int straggler) const {
  std::ostringstream params;
  params << "{";
  if (straggler >= 0) {
    params << "\"straggler\": " << straggler;
    if (algorithm_ == "optcc") params << ", \"slowdown\": " << config_.slowdown;
  }
  params << "}";
  try {
    auto s = std::make_shared<core::Schedule>(core::build(algorithm_, n_, params.str()));
    core::verify_or_throw(*s);
    return s;
  } catch (const std::exception& e) {
    throw Error("stragg: cannot build the '" + algorithm_ + "' schedule for " + std::to_string(n_) +
                " ranks: " + e.what());
  }
}

RankPlan Planner::plan(int rank, size_t numel, size_t elem_size, int agreed_straggler,
                       bool ordered_recvs) const {
  if (dynamic()) {
    if (agreed_straggler < 0 || n_ <= 2) return ring_allreduce_plan(rank, n_, numel);
    std::shared_ptr<const core::Schedule> s;
    {
      std::lock_guard<std::mutex> lock(dynamic_mu_);
      auto& slot = dynamic_schedules_[agreed_straggler];
      if (!slot) slot = build(agreed_straggler);
      s = slot;
    }
    return lower_schedule(*s, rank, numel, elem_size, config_.max_staging_bytes, ordered_recvs);
  }
  if (!schedule_) return ring_allreduce_plan(rank, n_, numel);
  return lower_schedule(*schedule_, rank, numel, elem_size, config_.max_staging_bytes,
                        ordered_recvs);
}

}  // namespace stragg
