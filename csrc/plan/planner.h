// Chooses the all_reduce schedule per call and lowers it for one rank (no torch here).
//
// Policy (Settings::algo / Settings::straggler, see docs/algorithms.md):
//  * An explicit algorithm (ring, rhd, direct, bcast, stragglar, optcc, rd, stragglar_direct)
//    always runs; the straggler-aware ones use the configured straggler (or the last rank when
//    none is set).
//  * Auto with a straggler for the call (configured, or agreed per call in dynamic mode) runs
//    StragglAR for it, when n >= 3. For the persistent straggler the profiler picked it runs
//    StragglAR where the cost model, with the straggler's typical delay, predicts it faster than
//    the algorithm below (not for small calls, whose recursive doubling needs fewer rounds); over
//    a network (pipeline_bytes > 0, CPU executor) StragglAR-direct is weighed too, and the
//    fastest of the three runs.
//  * Auto without a straggler runs the fastest of Ring / RHD (and, for small host calls, the
//    recursive doubling of core/rd.cc, PlannerConfig::rd_max_bytes) under the alpha-beta cost model
//    (core::simulate on the actual schedule, so non-power-of-2 overheads count); an alternative
//    to Ring must be predicted `switch_margin` faster, so model noise does not flip large
//    messages away from Ring. Decisions depend only on (n, bytes, link model), which are the same
//    on every rank, so all ranks choose alike.
//  * Where an algorithm cannot serve n (StragglAR at n <= 2, StragglAR at a size without a fast
//    construction) the planner falls back to Ring and says so in notes().
// Every schedule, Ring included, comes from csrc/core (built, verified, then lowered by
// plan/lower.h); schedules and lowered schedules are cached.
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
#include "runtime/lowered_schedule.h"

namespace stragg {

struct PlannerConfig {
  Algorithm algo = Algorithm::Auto;
  Straggler straggler = Straggler::none();
  std::vector<Slowdown> slowdowns;  // OptCC's degraded ranks (empty: the straggler at l = 2)
  int optcc_segments = 0;           // OptCC's k (0: Auto picks by the cost model; fixed: 8)
  size_t max_staging_bytes = 1 << 20;
  // Chunks larger than this are forwarded in segments of about this size where the schedule
  // needs no staging (lower_schedule's pipeline_bytes; 0: never). Set for network transports.
  size_t pipeline_bytes = 0;
  LinkModel link;  // cost model of Auto (replaced by measured values through set_link_model)
  double switch_margin = 0.05;
  // Auto considers recursive doubling for calls up to this size (0: never).
  size_t rd_max_bytes = 256 * 1024;

  // The planner's part of the user's settings.
  static PlannerConfig from(const Settings& s);
};

// What one call runs.
struct PlanChoice {
  Algorithm algorithm = Algorithm::Ring;
  int straggler = -1;          // StragglAR / Bcast: the rank the schedule waits for, -1: none
  std::vector<Slowdown> slow;  // OptCC: the degraded ranks and their factors l
  int segments = 0;            // OptCC: pipelined segments k (0: the generator's default)
  double predicted_s = 0;      // the cost model's time for this call (0: not predicted)
  bool operator==(const PlanChoice& o) const {
    return algorithm == o.algorithm && straggler == o.straggler && slow == o.slow &&
           segments == o.segments;
  }
  // "optcc(3=2,k=16)", "stragglar(2)", "ring", for logs and records.
  std::string describe() const;
};

// What the cost model knows about the network: healthy links, and the ranks whose links are
// slower by a factor (measured by the link probes, or forced with STRAGG_SLOWDOWN).
struct NetworkModel {
  LinkModel link;
  std::vector<Slowdown> degraded;  // by rank, factors >= 1
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
  // the agreed one in dynamic mode, the profiler's in profiled mode; -1: none), expected to arrive
  // `delay_s` after the others. Without degraded links Auto runs StragglAR for a call straggler
  // (for the profiler's persistent straggler only where the cost model, with that delay,
  // predicts it faster than what the call would run without one: not for small calls, whose
  // recursive doubling needs fewer rounds), else the fastest of Ring/RHD (and Rd); with degraded
  // links it simulates every candidate (Ring, RHD, OptCC at several segment counts, StragglAR and,
  // over a network, StragglAR-direct for a call straggler) on the network model, with
  // the straggler's delay, and runs the fastest (Ring unless another is switch_margin faster;
  // OptCC, judged by its fastest segment count, needs no margin over Ring and then runs the most
  // segments predicted within 2% of that count).
  // `host`: the call runs on the CPU executor; false (the GPU executor, which reduces in one
  // operand order only) never gets recursive doubling (Rd: Auto skips it, explicit rd runs RHD).
  PlanChoice choose(size_t bytes, int call_straggler, double delay_s = 0, bool host = true) const;
  // The steps `rank` runs for `numel` elements of `elem_size` bytes under `choice` (cached).
  // `ordered_recvs`: the transport honours RecvOp::limit (fewer staged receives).
  std::shared_ptr<const LoweredSchedule> lower(int rank, const PlanChoice& choice, size_t numel,
                                               size_t elem_size, bool ordered_recvs = false) const;

  // Cost model used by choose() (every rank must set the same values). Throws for alpha < 0 or
  // beta < 0. Degraded ranks given in the configuration (STRAGG_SLOWDOWN) override measured ones.
  void set_link_model(const LinkModel& link);
  void set_network(const NetworkModel& network);
  LinkModel link_model() const;
  NetworkModel network() const;  // what choose() uses (forced degraded ranks included)
  // Predicted all_reduce time of `choice` for `bytes` under the current model (core::simulate,
  // lockstep, degraded ranks as slowdowns), with `late_rank` (if >= 0) arriving `delay_s` late.
  double predict(const PlanChoice& choice, size_t bytes, int late_rank = -1,
                 double delay_s = 0) const;
  double predict(Algorithm algorithm, size_t bytes) const;
  // The one-shot all_reduce (Executor::run_oneshot) of `bytes` per rank: one synchronisation
  // (alpha) and every rank reading the n - 1 other inputs (beta each).
  double predict_oneshot(size_t bytes) const;

  // OptCC segment counts Auto considers.
  static const std::vector<int>& optcc_segment_candidates();
  // Whether Auto offers StragglAR-direct for a straggler: only over a network (its steps' n-1
  // concurrent messages serialise on shared memory with few cores, which the flat model does
  // not see). The straggler profiler weighs it then.
  bool direct_candidate() const { return n_ >= 3 && config_.pipeline_bytes > 0; }

 private:
  std::shared_ptr<const core::Schedule> schedule_for(const PlanChoice& choice) const;
  // StragglAR-direct for `straggler` with the segment count fastest_segments picks, with the
  // straggler `delay_s` late; predicted_s = -1 if no count builds.
  PlanChoice direct_for_straggler(size_t bytes, int straggler, double delay_s) const;
  PlanChoice auto_base(size_t bytes, bool allow_rd) const;
  PlanChoice auto_degraded(size_t bytes, int call_straggler, double delay_s,
                           const NetworkModel& net) const;
  // Auto with the profiler's persistent straggler on healthy links: StragglAR for it, or
  // auto_base where that is predicted faster with the straggler `delay_s` late (cached).
  PlanChoice auto_profiled(size_t bytes, int straggler, double delay_s, bool host) const;
  static double delay_bucket(double delay_s);
  PlanChoice fixed_choice(int call_straggler, const NetworkModel& net) const;
  // `base` (OptCC, StragglAR-direct) with the segment count the cost model predicts fastest for
  // `bytes` (cached).
  PlanChoice best_segments(size_t bytes, const PlanChoice& base) const;
  // The most segments predicted within kSegmentTolerance of the fastest count for `bytes` (with
  // `late_rank` arriving `delay_s` late), predicted_s set; predicted_s = -1 when no count builds.
  // `fastest_s`: the fastest count's time (what OptCC is compared with the others by).
  PlanChoice fastest_segments(size_t bytes, const PlanChoice& base, int late_rank,
                              double delay_s, double* fastest_s = nullptr) const;

  using ScheduleKey = std::tuple<Algorithm, int, std::vector<std::pair<int, double>>, int>;
  static ScheduleKey schedule_key(const PlanChoice& choice);
  using LoweredKey = std::tuple<ScheduleKey, int, size_t, size_t, bool>;
  using AutoKey = std::tuple<size_t, int, double>;

  int n_;
  PlannerConfig config_;
  Algorithm algorithm_ = Algorithm::Auto;
  std::vector<std::string> notes_;
  bool stragglar_ok_ = true;  // StragglAR usable for this n (auto falls back to Ring otherwise)
  mutable std::mutex mu_;
  NetworkModel measured_;  // from set_network / set_link_model
  mutable std::map<ScheduleKey, std::shared_ptr<const core::Schedule>> schedules_;
  // (bytes, Rd allowed) -> Ring, RHD or Rd, predicted
  mutable std::map<std::pair<size_t, bool>, PlanChoice> auto_choice_;
  mutable std::map<AutoKey, PlanChoice> degraded_choice_;  // with degraded links
  mutable std::map<AutoKey, PlanChoice> profiled_choice_;  // persistent straggler, healthy links
  // Lowered schedules, most recently used first (bounded: a DDP job uses a handful of sizes).
  mutable std::list<std::pair<LoweredKey, std::shared_ptr<const LoweredSchedule>>> lowered_;
};

// The Ring all_reduce of core::ring_allreduce lowered for `rank` (what internal collectives, the
// profiler exchange and the link-probe exchange, run; every rank holds bitwise identical results).
std::shared_ptr<const LoweredSchedule> ring_allreduce_schedule(int rank, int n, size_t numel);
// The recursive doubling all_reduce of core::rd_allreduce lowered for `rank`: what the small
// internal collectives run (the profiler's exchanges, the GPU path's header check): log2(n)
// rounds instead of Ring's 2(n-1); identical results on every rank too.
std::shared_ptr<const LoweredSchedule> small_allreduce_schedule(int rank, int n, size_t numel);

}  // namespace stragg
