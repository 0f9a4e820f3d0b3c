// Chooses the all_reduce schedule for a group and lowers it per call (no torch here).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/ir.h"
#include "runtime/plan.h"

namespace stragg {

// Algorithms users can ask for (STRAGG_ALGO). "auto" is Ring, or StragglAR when a straggler
// rank is configured (STRAGG_STRAGGLER); the cost-model-driven choice arrives with the planner
// issue.
const std::vector<std::string>& planner_algorithms();

// PlannerConfig::straggler values besides a rank.
constexpr int kNoStraggler = -1;
constexpr int kDynamicStraggler = -2;  // the last rank to arrive, agreed per call

struct PlannerConfig {
  std::string algo = "auto";  // one of planner_algorithms()
  int straggler = kNoStraggler;  // configured straggler rank, or kNoStraggler / kDynamicStraggler
  double slowdown = 2.0;      // OptCC: link slowdown factor of the straggler
  size_t max_staging_bytes = 1 << 20;
};

class Planner {
 public:
  // Validates the configuration for a group of n ranks and builds + verifies the schedule
  // (cached for the group's lifetime). Throws stragg::Error naming the problem.
  Planner(int n, PlannerConfig config);

  // Name of the algorithm actually run (e.g. "ring", "stragglar").
  const std::string& algorithm() const { return algorithm_; }
  int straggler() const { return config_.straggler; }
  bool dynamic() const { return config_.straggler == kDynamicStraggler; }
  // The steps `rank` runs for `numel` elements of `elem_size` bytes. In dynamic mode,
  // `agreed_straggler` is the rank all ranks agreed is late (kNoStraggler: plain Ring).
  // `ordered_recvs`: the transport honours RecvOp::limit (fewer staged receives).
  RankPlan plan(int rank, size_t numel, size_t elem_size, int agreed_straggler = kNoStraggler,
                bool ordered_recvs = false) const;

 private:
  std::shared_ptr<const core::Schedule> build(int straggler) const;

  int n_;
  PlannerConfig config_;
  std::string algorithm_;
  std::shared_ptr<const core::Schedule> schedule_;  // null: built-in pipelined Ring
  mutable std::mutex dynamic_mu_;
  mutable std::map<int, std::shared_ptr<const core::Schedule>> dynamic_schedules_;
};

}  // namespace stragg
