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

struct PlannerConfig {
  std::string algo = "auto";  // one of planner_algorithms()
  int straggler = -1;         // configured straggler rank, -1 = none
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
  // The steps `rank` runs for `numel` elements of `elem_size` bytes.
  RankPlan plan(int rank, size_t numel, size_t elem_size) const;

 private:
  int n_;
  PlannerConfig config_;
  std::string algorithm_;
  std::shared_ptr<const core::Schedule> schedule_;  // null: built-in pipelined Ring
};

}  // namespace stragg
