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
//  * Hosts with several ranks (PlannerConfig::host_of: at least two hosts, some with several
//    ranks): the cost model is two-level (core::SimOptions::host_of: the ranks of a host share
//    its NIC, host mates talk over shared memory at local_link), and Auto also weighs the
//    host-level composition of each candidate (core/host_level.cc: PlanChoice::by_host, "host:"
//    in its description) against the flat ones. STRAGG_HOST_LEVEL=off keeps to flat plans, on
//    to host-level ones (an explicit algorithm then runs host-level too). Hosts with different
//    numbers of ranks get flat plans (said in notes()).
//  * Measured corrections (set_corrections, from the plan check's measurements): a candidate's
//    predicted time after the last arrival is scaled by its family's measured/model ratio.
// Every schedule, Ring included, comes from csrc/core (built, verified, then lowered by
// plan/lower.h); schedules and lowered schedules are cached.
#pragma once

#include <algorithm>
#include <cmath>
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
#include "plan/plan_family.h"
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
  // Host index of every rank (group setup; empty: unknown, every rank its own host).
  std::vector<int> host_of;
  HostLevelPolicy host_level = HostLevelPolicy::Auto;
  // Host mates' links (shared memory) in the two-level model.
  LinkModel local_link{kDefaultLocalAlphaS, 1.0 / kDefaultBandwidthBytesPerS};

  // The planner's part of the user's settings.
  static PlannerConfig from(const Settings& s);
};

// What one call runs.
struct PlanChoice {
  Algorithm algorithm = Algorithm::Ring;
  int straggler = -1;          // StragglAR / Bcast: the rank the schedule waits for, -1: none
  std::vector<Slowdown> slow;  // OptCC: the degraded ranks and their factors l
  int segments = 0;            // OptCC: pipelined segments k (0: the generator's default)
  bool by_host = false;        // the host-level composition of `algorithm` (core/host_level.cc)
  double predicted_s = 0;      // the cost model's time for this call (0: not predicted)
  // The model's time from the last rank's arrival to the end, uncorrected (what the last
  // arrival's duration should be; the plan check measures its correction from it; 0: none).
  double post_arrival_s = 0;
  bool operator==(const PlanChoice& o) const {
    return algorithm == o.algorithm && straggler == o.straggler && slow == o.slow &&
           segments == o.segments && by_host == o.by_host;
  }
  // "optcc(3=2,k=16)", "stragglar(2)", "ring", "host:stragglar_direct(7,k=8)", for logs.
  std::string describe() const;
  PlanFamily family() const { return {algorithm, by_host}; }
};

// Measured factors are quantised (to 0.05) so that schedules and choices are cached per network
// state rather than per probe's noise; every rank quantises the same exchanged numbers alike.
inline double quantise_factor(double l) { return std::max(1.0, std::round(l * 20.0) / 20.0); }

// What the plan check lets one call use (besides its straggler): the degraded ranks OptCC may
// run for, and whether host-level plans are allowed.
struct CallMode {
  std::vector<Slowdown> degraded;
  bool flat = false;      // flat plans only
  bool corrected = true;  // predictions scaled by the measured corrections (set_corrections)
  // Predictions with the one-level model (every rank its own link, as before host levels): the
  // plan check's baseline, what stragg chose for a group of shared hosts before it knew them.
  bool one_level = false;
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
  // `mode`: the degraded ranks OptCC may run for and whether host-level plans may run (the plan
  // check's arm for this call); without it, the measured network's degraded ranks, host-level
  // allowed. Predictions always use the measured network (set_network).
  PlanChoice choose(size_t bytes, int call_straggler, double delay_s = 0, bool host = true) const;
  PlanChoice choose(size_t bytes, int call_straggler, double delay_s, bool host,
                    const CallMode& mode) const;
  // The steps `rank` runs for `numel` elements of `elem_size` bytes under `choice` (cached).
  // `ordered_recvs`: the transport honours RecvOp::limit (fewer staged receives).
  std::shared_ptr<const LoweredSchedule> lower(int rank, const PlanChoice& choice, size_t numel,
                                               size_t elem_size, bool ordered_recvs = false) const;

  // Cost model used by choose() (every rank must set the same values). Throws for alpha < 0 or
  // beta < 0. Degraded ranks given in the configuration (STRAGG_SLOWDOWN) override measured ones.
  void set_link_model(const LinkModel& link);
  void set_network(const NetworkModel& network);
  // Host mates' links in the two-level model (measured by the link probes).
  void set_local_link(const LinkModel& link);
  LinkModel link_model() const;
  LinkModel local_link() const;
  NetworkModel network() const;  // what choose() uses (forced degraded ranks included)
  // Measured/model ratios of the time after the last arrival, per family (empty: none). Every
  // rank must set the same values.
  void set_corrections(const std::map<PlanFamily, double>& corrections);
  std::map<PlanFamily, double> corrections() const;
  // Whether the cost model is two-level (ranks share hosts, several hosts), and whether Auto may
  // run host-level plans (hosts with the same number of ranks, STRAGG_HOST_LEVEL not off).
  bool two_level() const { return two_level_; }
  bool host_level_possible() const { return host_level_ok_; }
  const std::vector<int>& host_of() const { return config_.host_of; }
  // Predicted all_reduce time of `choice` for `bytes` under the current model (core::simulate,
  // lockstep, degraded ranks as slowdowns, two-level where ranks share hosts), with `late_rank`
  // (if >= 0) arriving `delay_s` late; no measured correction.
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
  // The host layout's consequences: two_level_, host_level_ok_, host_level_only_, notes.
  void set_up_hosts();
  std::shared_ptr<const core::Schedule> schedule_for(const PlanChoice& choice) const;
  // What Auto runs for a call (planner_auto.cc); cached per query.
  struct AutoQuery {
    size_t bytes = 0;
    int straggler = -1;  // the call's straggler (-1: none)
    double delay_s = 0;  // its expected delay (bucketed)
    bool host = true;    // the CPU executor
    bool profiled = false;  // the straggler is the profiler's (else configured or agreed)
    CallMode mode;
  };
  PlanChoice auto_choice(const AutoQuery& q) const;
  // The candidates of a query and their corrected predicted times (planner_auto.cc).
  struct Candidate {
    PlanChoice choice;
    double time_s = 0;   // predicted, corrected, from the on-time ranks' arrival
    double margin = 0;   // must beat the reference by this share
  };
  std::vector<Candidate> candidates(const AutoQuery& q) const;
  // `c` predicted for the query, with its family's correction: predicted_s / post_arrival_s set,
  // the corrected time returned (-1: the generator cannot build it).
  double rate(PlanChoice& c, const AutoQuery& q) const;
  double corrected(const PlanChoice& c, double raw_s, double delay_s) const;
  static double delay_bucket(double delay_s);
  PlanChoice fixed_choice(int call_straggler, const NetworkModel& net) const;
  // `base` (OptCC, StragglAR-direct) with the segment count the cost model predicts fastest for
  // `bytes` (cached).
  PlanChoice best_segments(size_t bytes, const PlanChoice& base) const;
  // The most segments predicted within kSegmentTolerance of the fastest count for `bytes` (with
  // `late_rank` arriving `delay_s` late), predicted_s set; predicted_s = -1 when no count builds.
  // `fastest_s`: the fastest count's time (what OptCC is compared with the others by).
  PlanChoice fastest_segments(size_t bytes, const PlanChoice& base, int late_rank,
                              double delay_s, double* fastest_s = nullptr,
                              bool one_level = false) const;
  // predict(), with the one-level model (every rank its own link) if `one_level`.
  double simulate_choice(const PlanChoice& choice, size_t bytes, int late_rank, double delay_s,
                         bool one_level) const;

  using ScheduleKey = std::tuple<Algorithm, int, std::vector<std::pair<int, double>>, int, bool>;
  static ScheduleKey schedule_key(const PlanChoice& choice);
  using LoweredKey = std::tuple<ScheduleKey, int, size_t, size_t, bool>;
  // (bytes, straggler, delay bucket, flags, degraded ranks of the mode)
  using AutoKey = std::tuple<size_t, int, double, int, std::vector<std::pair<int, double>>>;

  int n_;
  PlannerConfig config_;
  Algorithm algorithm_ = Algorithm::Auto;
  std::vector<std::string> notes_;
  bool stragglar_ok_ = true;  // StragglAR usable for this n (auto falls back to Ring otherwise)
  bool two_level_ = false;     // several hosts, some with several ranks
  bool host_level_ok_ = false;  // Auto may run host-level plans
  bool host_level_only_ = false;  // STRAGG_HOST_LEVEL=on and possible
  mutable std::mutex mu_;
  NetworkModel measured_;  // from set_network / set_link_model
  LinkModel local_link_;
  std::map<PlanFamily, double> corrections_;
  mutable std::map<ScheduleKey, std::shared_ptr<const core::Schedule>> schedules_;
  mutable std::map<AutoKey, PlanChoice> auto_choice_;  // Auto's choices
  mutable std::map<AutoKey, PlanChoice> segments_choice_;  // explicit OptCC / StragglAR-direct
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
