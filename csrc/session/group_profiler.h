// The profiling side of a session (no torch here): the straggler profiler's per-call batches and
// their exchange, the link probes (AdapCC §IV-B) and the measured check of what they make the
// planner do (plan/plan_check.h).
//
// Everything that talks to the peers is a collective run by the session's worker thread at the
// same point of every rank's call sequence (after a call, or at the start of the next one), and
// every decision is taken at an exchange from exchanged numbers, so every rank holds the same
// statistics and takes the same decisions. Readers on other threads (stragg.profiler.summary,
// backend_stats) take a lock.
//
// Costs. An exchange is one small all_reduce every K calls (STRAGG_PROFILE_EVERY; one more after
// call 4, so the calls' own rate replaces the default link model early); when the
// calls are so short that it (its analysis included) would cost more than 0.25% of their time, K
// doubles (up to 4096, and while K calls take at most 50 ms: the profiler's reaction time).
// Link probes run as a campaign of slices right after calls (session/link_prober.h), within a
// budget: STRAGG_PROBE_BUDGET (5%) of the job's time until the first campaign has finished, 40%
// of that after, and at most a quarter of a call's time per call, so no step of a job grows by
// more than that. The periodic campaigns (every STRAGG_PROBE_EVERY exchanges) also wait until the
// last campaign's cost is 0.5% of the job's time since it: on short calls they come rarely.
//
// Its parts, one file each: the batch and its exchange (group_exchange.cc), the link-probe
// campaign and its budget (group_link_probes.cc), the link model and its install into the
// planner (group_link_model.cc), the plan check's side (group_plan_check.cc), the read-outs
// (group_profiler_readouts.cc); the numbers that tune them: group_profiler_tuning.h.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "plan/link_model.h"
#include "plan/link_probe.h"
#include "plan/plan_check.h"
#include "plan/planner.h"
#include "plan/settings.h"
#include "plan/straggler_profiler.h"
#include "runtime/executor.h"
#include "session/call_record.h"
#include "session/link_prober.h"

namespace stragg {

// What the probes cost and did, for stragg.profiler.summary().
struct ProbeStats {
  uint64_t campaigns = 0;     // finished (explicit measure_links() included)
  uint64_t slices = 0;        // slices run between calls
  double seconds = 0;         // this rank's time in probes (slices, explicit probes)
  size_t transfer_bytes = 0;  // of the latest campaign
  int exchange_every = 0;     // calls per profiler exchange now
  double exchange_s = 0;      // this rank's time in exchanges (their all_reduce and analysis)
};

class GroupProfiler {
 public:
  // `host_of`: the host index of every rank (group_setup). Only links between hosts can be
  // degraded: on one host (shared memory) differences between probed links are scheduling
  // noise, not degraded links, and are not reported as such; in a group that spans hosts with
  // several ranks on some (the mixed transport), the links within a host are left out of the
  // degradation analysis and of the reference model, which then describe the network.
  GroupProfiler(int rank, int n, const Settings& settings, Planner& planner, std::string group,
                std::vector<int> host_of);

  // Worker thread, after a successful executor all_reduce: feeds the profiler; every K calls
  // exchanges the batch (one small all_reduce) and takes the decisions; runs the probe slices
  // scheduled for this call. On failure it switches profiling off (the caller logs; the group
  // is aborted by the executor anyway).
  void after_call(Executor& ex, const InternalSpec& spec, const CallRecord& record,
                  std::chrono::milliseconds timeout);
  // Worker thread, collective: measures alpha/beta of every link now and installs the model in
  // the planner. A probe that newly finds a rank slightly slow (below kSureFactor) is confirmed
  // by a second one (needs_confirmation / average_links, plan/link_probe.h).
  void probe_links(Executor& ex, const InternalSpec& spec, std::chrono::milliseconds timeout);

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // The straggler the session runs StragglAR for (-1: none): the profiler's persistent
  // straggler unless the plan check undid it, and its median delay (seconds).
  int straggler() const { return straggler_.load(); }
  // Worker thread: the mode the next call runs (a trial's arm, else the plan check's verdict),
  // and what the planner is to use for it.
  PlanMode next_call_mode(CallMode* planner_mode) const;
  double straggler_delay_s() const { return straggler_delay_s_.load(); }
  ProfilerSummary summary() const;
  const ProfilerSettings& settings() const { return settings_; }
  // The cost model in use and where it came from ("default", "calls": the calls' own rate until
  // a probe, or "measured").
  LinkModel link_model(std::string* source) const;
  // n*n per-link models from the last probe (links[i*n + j]: i -> j; alpha < 0: not measured).
  std::vector<LinkModel> link_matrix() const;
  // Per-rank send/receive speed, slowdown factors and degraded ranks from the last probe.
  LinkAnalysis link_analysis() const;
  // The window's per-call straggler delays (identical on every rank).
  std::vector<double> recent_delays() const;
  std::vector<PlanCheckRecord> plan_checks() const;
  PlanMode plan_mode() const;
  ProbeStats probe_stats() const;

 private:
  using Clock = std::chrono::steady_clock;

  // The batch's numbers every rank agrees on after an exchange: the time per call (the median
  // of the ranks'; 0: unknown) and the exchange's cost (the last rank's time in the previous one).
  struct AgreedBatch {
    double period = 0;
    double exchange_s = 1e300;
  };

  // group_exchange.cc: the exchange and its parts, in order: this rank's row of the batch's
  // all-gather, the rows read back (every rank's durations and call costs into
  // exchange_durations_ / exchange_costs_; the slice time), K adapted to what exchanges cost,
  // the log line of a new straggler verdict.
  void exchange(Executor& ex, const InternalSpec& spec, std::chrono::milliseconds timeout);
  void fill_exchange_row(int k);
  AgreedBatch read_exchange_rows(int k);
  void adapt_exchange_every(double batch_period, int k, double exchange_s);
  void log_straggler_verdict() const;

  // group_link_probes.cc: runs this call's probe slices.
  void run_probe_slices(Executor& ex, const InternalSpec& spec, std::chrono::milliseconds timeout);
  // At an exchange, under mu_, before the profiler counts it: whether a campaign is due (first,
  // periodic, on drift); `batch_time`: the batch's agreed time (0: unknown).
  void want_probes(bool drift, double batch_time);
  // After an exchange: while the first campaign waits for budget, the next batch is short.
  void hurry_first_campaign();
  // After an exchange: have the calls' times drifted from the cost model since the last probe?
  // (identical on every rank: it reads the exchanged durations)
  bool drifted(const std::vector<double>& durations, int k);
  // The seconds per byte the batch's flat Ring / RHD calls of 64 KiB or more showed (0: none).
  double calls_beta(const std::vector<double>& durations, int k, const std::vector<int64_t>& bytes,
                    const std::vector<CheckedCall>& calls) const;
  // The batch's calls as the plan check reads them (from the exchanged n x k call costs;
  // group_plan_check.cc, with next_call_mode and check_plan).
  std::vector<CheckedCall> checked_calls(const std::vector<double>& costs, int k,
                                         const std::vector<int64_t>& bytes) const;
  // The plan check's verdict at an exchange (logged), its corrections given to the planner.
  void check_plan(const PlanMode& proposed, const std::vector<CheckedCall>& calls,
                  uint64_t exchanges);
  // Probe scheduling at an exchange from the batch's exchanged numbers (calls_beta_s: calls_beta()).
  void schedule_probes(double calls_beta_s, int k, double period_s);
  // A finished probe's matrix: confirms a small new factor with a second probe, else keeps it
  // for install() at the next exchange. While confirming, a new rank at kSureFactor or above is
  // installed already (sure_degraded, plan/link_probe.h).
  void campaign_finished(std::vector<LinkModel> matrix);
  // True (and logged) if `matrix` changes the degraded ranks in a way one probe's noise could
  // explain (needs_confirmation), so that a second probe confirms it first; groups across hosts
  // only. The same on every rank (they hold the same matrix). `sure` (if given) receives what
  // may act before the second probe.
  bool needs_second_probe(const std::vector<LinkModel>& matrix,
                          std::vector<Slowdown>* sure = nullptr);
  // group_link_model.cc. Until a probe has measured the links, the calls' rate (calls_beta(),
  // if > 0) becomes the planner's link model.
  void use_calls_rate(double calls_beta_s);
  // A finished campaign's matrix (pending_), if any, is installed.
  void install_pending();
  // The analysis of `matrix` becomes the measured link model (readers see it at once), with
  // `verdict` (if given) as its degraded ranks.
  void install(const std::vector<LinkModel>& matrix, const std::vector<Slowdown>* verdict = nullptr);
  // The plan check's verdict becomes what the session and the planner use.
  void apply(const PlanMode& mode);
  std::vector<LinkModel> network_links(const std::vector<LinkModel>& matrix) const;
  LinkAnalysis analyze(const std::vector<LinkModel>& matrix) const;  // of its network links
  std::vector<Slowdown> degraded_now() const;  // the installed analysis's degraded ranks
  // A probe and its confirming probe: the degraded ranks both agree on (confirmed_degraded).
  std::vector<Slowdown> confirmed_verdict(const std::vector<LinkModel>& first,
                                          const std::vector<LinkModel>& second) const;
  bool several_hosts() const;  // the group spans hosts (only then can links be degraded)

  const int rank_;
  const int n_;
  const ProfilerSettings settings_;
  const int probe_every_;
  const bool plan_check_;
  const double probe_budget_;
  const std::vector<int> host_of_;
  Planner& planner_;
  const std::string group_;
  LinkProber prober_;
  PlanCheck check_;

  // Worker-thread state.
  uint64_t calls_ = 0;  // completed executor all_reduces (the profiler's call index)
  int every_;           // calls per exchange now
  uint64_t exchanges_done_ = 0;  // exchanges started
  bool early_exchange_ = false;  // the first came after kFirstBatchCalls calls, before call K
  // > 0: the batch ends at this size (a probe's matrix is pending, or the first campaign waits
  // for budget)
  int cut_batch_at_ = 0;
  bool costly_exchanges_ = false;  // the last exchange cost more than its share
  std::vector<double> batch_durations_;
  std::vector<int64_t> batch_bytes_;
  std::vector<double> batch_predicted_;
  std::vector<PlanFamily> batch_families_;
  // Per call: the time since the previous call's end without exchanges and probes (-1: the first).
  std::vector<double> batch_costs_;
  double pause_s_ = 0;  // time in exchanges and probes since the last call ended
  uint64_t trial_first_call_ = 0;  // the call index a trial began at
  uint64_t batch_first_call_ = 0;
  // Times between the ends of consecutive calls in this batch (the job's compute included),
  // without those an exchange or a probe fell into: their median is the batch's time per call.
  std::vector<double> batch_intervals_;
  Clock::time_point last_end_{};
  bool interval_spoiled_ = true;  // an exchange or probe ran since last_end_
  double batch_probe_s_ = 0;      // this rank's time in probe slices during this batch
  size_t batch_slices_ = 0;
  double last_exchange_s_ = 0;   // this rank's time in the previous exchange
  std::vector<double> exchange_rows_;       // an exchange's all_reduce buffer (n rows)
  std::vector<double> exchange_durations_;  // and the n x k durations it gathered
  std::vector<double> exchange_costs_;      // and the n x k call costs
  // Probe scheduling (identical on every rank).
  bool probe_due_ = false;
  bool periodic_probe_wanted_ = false;  // STRAGG_PROBE_EVERY exchanges passed; waits for its share
  double job_s_since_campaign_ = 0;     // the batches' agreed time since the last campaign began
  size_t campaign_slices_ = 0;          // slices of the last campaign begun
  size_t campaign_transfer_ = 0;        // and its transfer size
  double allowance_s_ = 0;    // probe time the budget allows now
  double slice_s_ = 0;        // a slice's time (slowest rank's), 0 until one ran
  size_t slices_allowed_ = 0;
  size_t slices_per_call_ = 1;
  bool confirming_ = false;
  std::vector<LinkModel> first_matrix_;              // of a probe being confirmed
  std::optional<std::vector<LinkModel>> pending_;    // installed at the next exchange
  std::optional<std::vector<Slowdown>> pending_verdict_;  // its degraded ranks (unset: its own)
  double drift_baseline_ = 0;  // model/measured ratio of the first batch after a probe (0: unset)
  uint64_t last_drift_probe_ = 0;  // exchange that last triggered a probe for drift

  std::atomic<bool> enabled_{false};  // profiler_ is set (read on every call without mu_)
  mutable std::mutex mu_;  // guards what readers see
  std::unique_ptr<StragglerProfiler> profiler_;
  std::atomic<int> straggler_{-1};
  std::atomic<double> straggler_delay_s_{0};
  LinkModel link_;
  std::string link_source_ = "default";
  std::vector<LinkModel> link_matrix_;
  LinkAnalysis analysis_;
  PlanMode mode_;
  std::vector<double> recent_delays_;
  ProbeStats probe_stats_;
};

}  // namespace stragg
