// Chooses the all_reduce schedule per call and lowers it for one rank (no torch here).
//
// Policy (Settings::algo / Settings::straggler, see README "Choosing the algorithm"):
//  * An explicit algorithm (ring, rhd, direct, bcast, stragglar, optcc) always runs; the
//    straggler-aware ones use the configured straggler (or the last rank when none is set).
//  * Auto with a straggler for the call (configured, agreed per call in dynamic mode, or the
//    persistent straggler the profiler picked) runs StragglAR for it, when n >= 3.
//  * Auto without a straggler runs the fastest of Ring / RHD under the alpha-beta cost model
//    (core::simulate on the actual schedule, so non-power-of-2 overheads count); an alternative
//    to Ring must be predicted `switch_margin` faster, so model noise does not flip large
//    messages away from Ring. Decisions depend only on (n, bytes, link model), which are the same
//    on every rank, so all ranks choose alike.
//  * Where an algorithm cannot serve n (StragglAR at n <= 2, StragglAR at a size without a fast
//    construction) the planner falls back to Ring and says so in notes().
// Every schedule, Ring included, comes from csrc/core (built, verified, then lowered by
// plan/lower.h); schedules and lowered plans are cached.
#pragma once

#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/algorithm.h"
#include "core/ir.h"
#include "plan/link_model.h"
#include "plan/settings.h"
#include "runtime/plan.h"

namespace stragg {

struct PlannerConfig {
  Algorithm algo = Algorithm::Auto;
  Straggler straggler = Straggler::none();
  std::vector<Slowdown> slowdowns;  // OptCC's degraded ranks (empty: the straggler at l = 2)
  size_t max_staging_bytes = 1 << 20;
  LinkModel link;  // cost model of Auto (replaced by measured values through set_link_model)
  double switch_margin = 0.05;

  // The planner's part of the user's settings.
  static PlannerConfig from(const Settings& s);
};

// What one call runs.
struct PlanChoice {
  Algorithm algorithm = Algorithm::Ring;
  int straggler = -1;  // the straggler the schedule is built around, -1: none
  bool operator==(const PlanChoice& o) const {
    return algorithm == o.algorithm && straggler == o.straggler;
  }
};

class Planner {
 public:
  // Validates the configuration for a group of n ranks and builds + verifies the fixed schedule
  // if there is one. Throws stragg::Error naming the problem.
  Planner(int n, PlannerConfig config);

  // The fixed algorithm, or Algorithm::Auto when it is chosen per call.
  Algorithm algorithm() const { return algorithm_; }
  const Straggler& straggler() const { return config_.straggler; }
  bool dynamic() const { return config_.straggler.kind == Straggler::Kind::Dynamic; }
  bool profiled() const { return config_.straggler.kind == Straggler::Kind::Profiled; }
  int size() const { return n_; }
  const PlannerConfig& config() const { return config_; }
  // Fallbacks taken at construction (e.g. "StragglAR needs at least 3 ranks: Ring").
  const std::vector<std::string>& notes() const { return notes_; }

  // The algorithm for a call of `bytes` whose straggler is `call_straggler` (the configured one,
  // the agreed one in dynamic mode, the profiler's in profiled mode; -1: none).
  PlanChoice choose(size_t bytes, int call_straggler) const;
  // The steps `rank` runs for `numel` elements of `elem_size` bytes under `choice` (cached).
  // `ordered_recvs`: the transport honours RecvOp::limit (fewer staged receives).
  std::shared_ptr<const RankPlan> plan(int rank, const PlanChoice& choice, size_t numel,
                                       size_t elem_size, bool ordered_recvs = false) const;

  // Cost model used by choose() (every rank must set the same values). Throws for alpha < 0 or
  // beta < 0.
  void set_link_model(const LinkModel& link);
  LinkModel link_model() const;
  // Predicted all_reduce time of `algorithm` for `bytes` under the current model (no straggler).
  double predict(Algorithm algorithm, size_t bytes) const;

 private:
  std::shared_ptr<const core::Schedule> schedule_for(Algorithm algorithm, int straggler) const;
  Algorithm auto_base(size_t bytes) const;

  using PlanKey = std::tuple<Algorithm, int, int, size_t, size_t, bool>;

  int n_;
  PlannerConfig config_;
  Algorithm algorithm_ = Algorithm::Auto;
  std::vector<std::string> notes_;
  bool stragglar_ok_ = true;  // StragglAR usable for this n (auto falls back to Ring otherwise)
  mutable std::mutex mu_;
  mutable std::map<std::pair<Algorithm, int>, std::shared_ptr<const core::Schedule>> schedules_;
  mutable std::map<size_t, Algorithm> auto_choice_;  // bytes -> base algorithm
  // Lowered plans, most recently used first (bounded: a DDP job uses a handful of sizes).
  mutable std::list<std::pair<PlanKey, std::shared_ptr<const RankPlan>>> plans_;
};

// The Ring all_reduce of core::ring_allreduce lowered for `rank` (what internal collectives, the
// profiler exchange and the link-probe exchange, run; every rank holds bitwise identical results).
std::shared_ptr<const RankPlan> ring_allreduce_plan(int rank, int n, size_t numel);

}  // namespace stragg
