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
  if (config_.straggler >= n_) {
    throw Error("stragg: STRAGG_STRAGGLER=" + std::to_string(config_.straggler) +
                " is not a rank of this group of " + std::to_string(n_));
  }
  algorithm_ = config_.algo;
  if (algorithm_ == "auto") algorithm_ = config_.straggler >= 0 && n_ > 2 ? "stragglar" : "ring";
  // Ring runs on the built-in pipelined plan; so does every algorithm at n <= 1.
  if (algorithm_ == "ring" || n_ <= 1) return;

  const bool needs_straggler =
      algorithm_ == "stragglar" || algorithm_ == "bcast" || algorithm_ == "optcc";
  std::ostringstream params;
  params << "{";
  if (needs_straggler) {
    const int st = config_.straggler >= 0 ? config_.straggler : n_ - 1;
    config_.straggler = st;
    params << "\"straggler\": " << st;
    if (algorithm_ == "optcc") params << ", \"slowdown\": " << config_.slowdown;
  }
  params << "}";
  try {
    auto s = std::make_shared<core::Schedule>(core::build(algorithm_, n_, params.str()));
    core::verify_or_throw(*s);
    schedule_ = std::move(s);
  } catch (const std::exception& e) {
    throw Error("stragg: cannot build the '" + algorithm_ + "' schedule for " + std::to_string(n_) +
                " ranks: " + e.what());
  }
}

RankPlan Planner::plan(int rank, size_t numel, size_t elem_size) const {
  if (!schedule_) return ring_allreduce_plan(rank, n_, numel);
  return lower_schedule(*schedule_, rank, numel, elem_size, config_.max_staging_bytes);
}

}  // namespace stragg
