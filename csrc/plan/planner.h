// Chooses the all_reduce schedule per call and lowers it for one rank (no torch here).
//
// Policy (STRAGG_ALGO / STRAGG_STRAGGLER, see README "Choosing the algorithm"):
//  * An explicit algorithm (ring, rhd, direct, bcast, stragglar, optcc) always runs; the
//    straggler-aware ones use the configured straggler (or the last rank when none is set).
//  * "auto" with a straggler for the call (configured, agreed per call in dynamic mode, or the
//    persistent straggler the profiler picked) runs StragglAR for it, when n >= 3.
//  * "auto" without a straggler runs the fastest of Ring / RHD / Direct under the alpha-beta
//    cost model (core::simulate on the actual schedule, so non-power-of-2 overheads count); an
//    alternative to Ring must be predicted `switch_margin` faster, so model noise does not flip
//    large messages away from Ring. Decisions depend only on (n, bytes, link model), which are
//    the same on every rank, so all ranks choose alike.
//  * Where an algorithm cannot serve n (StragglAR at n <= 2, StragglAR at a large non-power-of-2
//    n without a stored design, whose schedule would take minutes to build) the planner falls
//    back to Ring and says so in notes() (logged at INFO by the backend).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/ir.h"
#include "runtime/plan.h"

namespace stragg {

// Algorithms users can ask for (STRAGG_ALGO).
const std::vector<std::string>& planner_algorithms();

// PlannerConfig::straggler values besides a rank.
constexpr int kNoStraggler = -1;
constexpr int kDynamicStraggler = -2;   // the last rank to arrive, agreed per call
constexpr int kProfiledStraggler = -3;  // the profiler's persistent straggler (STRAGG_STRAGGLER=auto)

struct PlannerConfig {
  std::string algo = "auto";  // one of planner_algorithms()
  int straggler = kNoStraggler;  // configured rank, or kNoStraggler / kDynamicStraggler / kProfiledStraggler
  double slowdown = 2.0;      // OptCC: link slowdown factor of the straggler
  size_t max_staging_bytes = 1 << 20;
  // Cost model of "auto" (replaced by measured values through set_link_model).
  double alpha_s = 60e-6;
  double beta_s_per_byte = 1.0 / 3e9;
  double switch_margin = 0.05;
};

// What one call runs.
struct PlanChoice {
  std::string algorithm;  // "ring", "rhd", "direct", "bcast", "stragglar", "optcc"
  int straggler = kNoStraggler;
};

class Planner {
 public:
  // Validates the configuration for a group of n ranks and builds + verifies the fixed schedule
  // if there is one. Throws stragg::Error naming the problem.
  Planner(int n, PlannerConfig config);

  // The configured policy, for logs: "auto", "ring", ...; and the resolved fixed algorithm, or
  // "auto" when it is chosen per call.
  const std::string& algorithm() const { return algorithm_; }
  int straggler() const { return config_.straggler; }
  bool dynamic() const { return config_.straggler == kDynamicStraggler; }
  bool profiled() const { return config_.straggler == kProfiledStraggler; }
  const PlannerConfig& config() const { return config_; }
  // Fallbacks taken at construction (e.g. "StragglAR needs at least 3 ranks: Ring").
  const std::vector<std::string>& notes() const { return notes_; }

  // The algorithm for a call of `bytes` whose straggler is `call_straggler` (the configured one,
  // the agreed one in dynamic mode, the profiler's in profiled mode; kNoStraggler: none).
  PlanChoice choose(size_t bytes, int call_straggler) const;
  // The steps `rank` runs for `numel` elements of `elem_size` bytes under `choice`.
  // `ordered_recvs`: the transport honours RecvOp::limit (fewer staged receives).
  RankPlan plan(int rank, const PlanChoice& choice, size_t numel, size_t elem_size,
                bool ordered_recvs = false) const;

  // Cost model used by choose() (call before the first call, or between calls on the thread that
  // calls choose(); every rank must set the same values).
  void set_link_model(double alpha_s, double beta_s_per_byte);
  // Predicted all_reduce time of `algorithm` for `bytes` under the current model (no straggler).
  double predict(const std::string& algorithm, size_t bytes) const;

 private:
  std::shared_ptr<const core::Schedule> schedule_for(const std::string& algorithm,
                                                     int straggler) const;
  std::string auto_base(size_t bytes) const;

  int n_;
  PlannerConfig config_;
  std::string algorithm_;
  std::vector<std::string> notes_;
  bool stragglar_ok_ = true;  // StragglAR usable for this n (auto falls back to Ring otherwise)
  mutable std::mutex mu_;
  mutable std::map<std::pair<std::string, int>, std::shared_ptr<const core::Schedule>> schedules_;
  mutable std::map<size_t, std::string> auto_choice_;  // bytes -> base algorithm
};

}  // namespace stragg
