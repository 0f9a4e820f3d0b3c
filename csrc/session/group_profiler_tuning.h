// The numbers that tune a group's profiler (session/group_profiler.h), in one place, and the
// small helpers its parts share: the exchange and its batch (group_exchange.cc), the link-probe
// campaign and its budget (group_link_probes.cc), the link model's install (group_link_model.cc).
// Private to those files.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "plan/link_model.h"
#include "plan/median.h"

namespace stragg {
namespace profiler_tuning {

// A rank is degraded when its links are this much slower than the median rank's (OptCC's l).
// A false positive costs a confirming probe (below) or, if it survives, little: the planner
// leaves Ring only for a predicted gain of 5% or more, and the plan check undoes a slower plan.
constexpr double kDegradedThreshold = 1.05;
// A newly degraded rank below this factor is confirmed by a second probe first (the links'
// mean readings of the two decide): one probe can read a healthy host above the threshold.
constexpr double kSureFactor = 1.25;
// Step times drifted when the measured/model ratio moves this far from the one after the last
// probe; drift re-probes at most once per this many exchanges.
constexpr double kDriftFactor = 1.5;
constexpr uint64_t kDriftProbeInterval = 4;
// Probe budget: STRAGG_PROBE_BUDGET of the job's time (the batches' wall time) until the first
// campaign has finished, this share of it after; at most this share of a call's time per call.
constexpr double kLaterProbeBudget = 0.4;
constexpr double kSliceShareOfCall = 0.25;
// Calls before the first exchange (at most STRAGG_PROFILE_EVERY).
constexpr int kFirstBatchCalls = 4;
// A campaign's transfers take about this long at the rate the calls show (64 KiB to 1 MiB).
constexpr double kProbeTransferS = 0.008;
constexpr size_t kMinProbeTransfer = 64 * 1024;
constexpr size_t kMaxProbeTransfer = 1 << 20;
// Exchanges cost at most this share of the calls' time: K doubles (up to kMaxEvery) after two
// batches in a row above it, while a batch stays within kMaxBatchS of the job's time, and comes
// back down once the calls are 8x longer or a batch takes over twice that. The profiler decides
// after a few batches (patience): the cap bounds its reaction time (a 4 KiB call of 6 us runs
// 4096 calls in 25 ms), and calls of milliseconds keep their K whatever the exchanges cost (a
// loaded machine inflates them).
constexpr double kExchangeShare = 0.0025;
constexpr int kMaxEvery = 4096;
constexpr double kMaxBatchS = 0.05;
// The batch's typical call time and its drift are medians of at most its last this many calls:
// enough to be stable, and at 4 KiB a median of 1024 costs 10-15 ns per call of the batch.
constexpr size_t kMedianCalls = 256;
// A periodic link probe waits until the last campaign's cost is at most this share of the job's
// time since it began (the budget above bounds how fast a campaign runs, this how often).
// A probe on drift waits likewise with STRAGG_PROBE_BUDGET as the share: calls whose time varies
// 1.5x around one link model (a profiled section, other load) would re-probe every few batches.
constexpr double kPeriodicProbeShare = 0.005;

// The median of v's last kMedianCalls values.
inline double median_of_tail(const std::vector<double>& v) {
  const size_t n = std::min(kMedianCalls, v.size());
  return median_of(std::vector<double>(v.end() - static_cast<std::ptrdiff_t>(n), v.end()));
}

inline double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// "degraded ranks 2 (l = 1.5), 5 (l = 2)", for the probes' log lines.
inline std::string degraded_text(const std::vector<Slowdown>& d) {
  if (d.empty()) return "no degraded rank";
  std::ostringstream m;
  m << "degraded rank" << (d.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < d.size(); ++i) {
    m << (i ? ", " : "") << d[i].rank << " (l = " << std::setprecision(3) << d[i].factor << ")";
  }
  return m.str();
}

}  // namespace profiler_tuning
}  // namespace stragg
