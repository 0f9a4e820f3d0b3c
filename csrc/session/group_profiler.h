// The profiling side of a session (no torch here): the straggler profiler's per-call batches
// and their exchange, and the link probes (AdapCC §IV-B) with the link matrix they measure.
// Everything that talks to the peers is a collective run by the session's worker thread at the
// same point of every rank's call sequence (after a call, or at the start of the next one), so
// every rank holds the same statistics and takes the same decisions. Readers on other threads
// (stragg.profiler.summary, backend_stats) take a lock.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plan/link_model.h"
#include "plan/link_probe.h"
#include "plan/planner.h"
#include "plan/settings.h"
#include "plan/straggler_profiler.h"
#include "runtime/executor.h"
#include "session/call_record.h"

namespace stragg {

// Spec of the next internal collective on the wire (it takes a sequence number).
using InternalSpec = std::function<CollectiveSpec(const char* name, DType dtype, size_t numel)>;

class GroupProfiler {
 public:
  // `host_of`: the host index of every rank (group_setup). Only links between hosts can be
  // degraded: on one host (shared memory) differences between probed links are scheduling
  // noise, not degraded links, and are not reported as such; in a group that spans hosts with
  // several ranks on some (the mixed transport), the links within a host are left out of the
  // degradation analysis and of the reference model, which then describe the network.
  GroupProfiler(int rank, int n, const Settings& settings, Planner& planner, std::string group,
                std::vector<int> host_of);

  // Worker thread, at the start of a call: runs a periodic link probe that is due.
  void before_call(Executor& ex, const InternalSpec& spec, std::chrono::milliseconds timeout);
  // Worker thread, after a successful executor all_reduce: feeds the profiler; every K calls
  // exchanges the batch (one small all_reduce) and updates the straggler decision. On failure
  // it switches profiling off (the caller logs; the group is aborted by the executor anyway).
  void after_call(Executor& ex, const InternalSpec& spec, const CallRecord& record,
                  std::chrono::milliseconds timeout);
  // Worker thread, collective: measures alpha/beta of every link and installs the combined model
  // in the planner. A probe that newly finds a rank slightly slow (below kSureFactor) is
  // confirmed by a second one (needs_confirmation / average_links, plan/link_probe.h).
  void probe_links(Executor& ex, const InternalSpec& spec, std::chrono::milliseconds timeout);

  bool enabled() const;
  // The profiler's persistent straggler (-1: none) and its median delay (seconds).
  int straggler() const { return straggler_.load(); }
  double straggler_delay_s() const { return straggler_delay_s_.load(); }
  ProfilerSummary summary() const;
  const ProfilerSettings& settings() const { return settings_; }
  // The cost model in use and where it came from ("default" or "measured").
  LinkModel link_model(std::string* source) const;
  // n*n per-link models from the last probe (links[i*n + j]: i -> j; alpha < 0: not measured).
  std::vector<LinkModel> link_matrix() const;
  // Per-rank send/receive speed, slowdown factors and degraded ranks from the last probe.
  LinkAnalysis link_analysis() const;
  // The window's per-call straggler delays (identical on every rank).
  std::vector<double> recent_delays() const;

 private:
  void exchange(Executor& ex, const InternalSpec& spec, std::chrono::milliseconds timeout);
  // After an exchange: have the calls' times drifted from the cost model since the last probe?
  // (identical on every rank: it reads the exchanged durations)
  bool drifted(const std::vector<double>& all, int k);
  void install(const std::vector<LinkModel>& matrix);
  std::vector<LinkModel> measure_own_row(Executor& ex, const InternalSpec& spec,
                                         std::chrono::milliseconds timeout, size_t bytes_each,
                                         int repetitions);
  // Probes every directed link with messages of `bytes_each` and all-gathers the n x n matrix.
  std::vector<LinkModel> probe_matrix(Executor& ex, const InternalSpec& spec,
                                      std::chrono::milliseconds timeout, size_t bytes_each,
                                      int repetitions);
  std::vector<LinkModel> network_links(const std::vector<LinkModel>& matrix) const;
  bool several_hosts() const;  // the group spans hosts (only then can links be degraded)

  const int rank_;
  const int n_;
  const ProfilerSettings settings_;
  const int probe_every_;
  const std::vector<int> host_of_;
  Planner& planner_;
  const std::string group_;

  // Worker-thread state.
  uint64_t calls_ = 0;  // completed executor all_reduces (the profiler's call index)
  bool probe_pending_ = false;  // a probe runs at the start of the next call
  bool probe_due_ = false;      // a probe is wanted once it is affordable (kProbeCostRatio)
  double calls_since_probe_s_ = 0;  // the calls' time since the last probe (slowest rank's)
  double probe_cost_s_ = 0;         // the last probe's duration (slowest rank's)
  std::vector<double> batch_durations_;
  std::vector<int64_t> batch_bytes_;
  std::vector<double> batch_predicted_;
  double drift_baseline_ = 0;  // model/measured ratio of the first batch after a probe (0: unset)
  uint64_t last_drift_probe_ = 0;  // exchange that last triggered a probe for drift
  uint64_t batch_first_call_ = 0;

  mutable std::mutex mu_;  // guards what readers see
  std::unique_ptr<StragglerProfiler> profiler_;
  std::atomic<int> straggler_{-1};
  std::atomic<double> straggler_delay_s_{0};
  LinkModel link_;
  std::string link_source_ = "default";
  std::vector<LinkModel> link_matrix_;
  LinkAnalysis analysis_;
  std::vector<double> recent_delays_;
};

}  // namespace stragg
