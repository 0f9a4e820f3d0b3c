#include "session/group_profiler.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "plan/link_probe.h"
#include "runtime/log.h"

namespace stragg {
namespace {

// Every directed link is timed with 8 messages of 128 KiB against one of 1 MiB (best of 5).
// 1 MiB transfers: on the emulated 5-host 300 Mbit/s cluster healthy hosts then read within
// 1.026 of each other and a host at l = 1.14 at 1.09-1.15 (0.5 MiB transfers: up to 1.055 and
// 1.05-1.16).
constexpr int kProbeMessages = 8;
constexpr size_t kProbeBytes = 128 * 1024;
constexpr int kProbeRepetitions = 5;
// A rank is degraded when its links are this much slower than the median rank's (OptCC's l).
// A false positive costs a confirming probe (below) or, if it survives, little: the planner
// leaves Ring only for a predicted gain of 5% or more.
constexpr double kDegradedThreshold = 1.05;
// A newly degraded rank below this factor is confirmed by a second probe first (the links'
// mean readings of the two decide): on the emulated 8-host cluster one probe read a healthy
// host at 1.12, and Auto, costing two slow hosts, kept Ring where OptCC was 14% faster.
constexpr double kSureFactor = 1.25;
// Step times drifted when the measured/model ratio moves this far from the one after the last
// probe; drift re-probes at most once per this many exchanges.
constexpr double kDriftFactor = 1.5;
constexpr uint64_t kDriftProbeInterval = 4;
// A due probe (periodic or for drift) waits until the calls since the last probe took this many
// times the last probe's duration, so probes cost at most ~2% of the calls' time: a probe takes
// milliseconds, which 1024 calls of a few KiB do not (they would pay ~20% for it).
constexpr double kProbeCostRatio = 50.0;

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string degraded_text(const std::vector<Slowdown>& d) {
  if (d.empty()) return "no degraded rank";
  std::ostringstream m;
  m << "degraded rank" << (d.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < d.size(); ++i) {
    m << (i ? ", " : "") << d[i].rank << " (l = " << std::setprecision(3) << d[i].factor << ")";
  }
  return m.str();
}

}  // namespace

GroupProfiler::GroupProfiler(int rank, int n, const Settings& settings, Planner& planner,
                             std::string group, std::vector<int> host_of)
    : rank_(rank),
      n_(n),
      settings_(settings.profiler_settings()),
      probe_every_(settings.probe_every),
      host_of_(std::move(host_of)),
      planner_(planner),
      group_(std::move(group)),
      link_(settings.link_model()) {
  if (settings_.enabled) profiler_ = std::make_unique<StragglerProfiler>(n, settings_);
}

bool GroupProfiler::enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return profiler_ != nullptr;
}

void GroupProfiler::before_call(Executor& ex, const InternalSpec& spec,
                                std::chrono::milliseconds timeout) {
  if (!probe_pending_) return;
  probe_pending_ = false;
  probe_links(ex, spec, timeout);
}

void GroupProfiler::after_call(Executor& ex, const InternalSpec& spec, const CallRecord& record,
                               std::chrono::milliseconds timeout) {
  if (!enabled()) return;
  const uint64_t call = calls_++;
  if (batch_durations_.empty()) batch_first_call_ = call;
  batch_durations_.push_back(record.agreement_s + record.run_s);
  batch_bytes_.push_back(record.bytes);
  batch_predicted_.push_back(record.predicted_s);
  if (static_cast<int>(batch_durations_.size()) < settings_.exchange_every) return;
  try {
    exchange(ex, spec, timeout);
  } catch (const std::exception& e) {
    log_warning("stragg: rank " + std::to_string(rank_) + ": profiler exchange failed, " +
                "profiling stops: " + e.what());
    std::lock_guard<std::mutex> lock(mu_);
    profiler_.reset();
    straggler_.store(-1);
  }
}

void GroupProfiler::exchange(Executor& ex, const InternalSpec& spec,
                             std::chrono::milliseconds timeout) {
  const int k = static_cast<int>(batch_durations_.size());
  // All-gather through a sum: every rank fills its own row, zeros elsewhere (x + 0 is exact).
  std::vector<double> all(static_cast<size_t>(n_) * k, 0.0);
  std::copy(batch_durations_.begin(), batch_durations_.end(), all.begin() + rank_ * k);
  ex.run(*small_allreduce_plan(rank_, n_, all.size()),
         spec("profiler exchange", DType::Float64, all.size()), all.data(), timeout);
  for (int i = 0; i < k; ++i) {  // the slowest rank's time of each call: the same on every rank
    double t = 0;
    for (int r = 0; r < n_; ++r) t = std::max(t, all[static_cast<size_t>(r) * k + i]);
    calls_since_probe_s_ += t;
  }
  const std::vector<int64_t> bytes = std::move(batch_bytes_);
  batch_durations_.clear();
  batch_bytes_.clear();
  const bool drift = drifted(all, k);
  batch_predicted_.clear();

  std::lock_guard<std::mutex> lock(mu_);
  // Link probes: after the first exchange, then periodically. They run at the start of the next
  // call (before_call), not now: now the users' threads are computing (the exchange runs behind
  // their backs) and would slow the probe's messages; inside a call every rank is waiting.
  if (probe_every_ > 0 && profiler_->exchanges() % probe_every_ == 0) probe_due_ = true;
  if (drift && profiler_->exchanges() >= last_drift_probe_ + kDriftProbeInterval) {
    last_drift_probe_ = profiler_->exchanges();
    probe_due_ = true;
  }
  // Both sides of the comparison were exchanged: every rank decides alike.
  if (probe_due_ && calls_since_probe_s_ >= kProbeCostRatio * probe_cost_s_) {
    probe_due_ = false;
    probe_pending_ = true;
  }
  const bool changed = profiler_->add_batch(all, k, bytes, link_, batch_first_call_);
  // Not summary(): it evaluates the cost model for its report, which small calls would pay for.
  recent_delays_ = profiler_->recent_delays(static_cast<size_t>(settings_.window));
  straggler_.store(profiler_->straggler());
  straggler_delay_s_.store(profiler_->candidate_median_delay_s());
  if (changed) {
    const ProfilerSummary sum = profiler_->summary();
    log_info("stragg: rank " + std::to_string(rank_) + " of group '" + group_ + "': profiler: " +
             (sum.decisions.empty() ? std::string("straggler changed")
                                    : sum.decisions.back().reason));
  }
}

bool GroupProfiler::drifted(const std::vector<double>& all, int k) {
  std::vector<double> ratios;
  ratios.reserve(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    if (!(batch_predicted_[i] > 0)) continue;
    // The rank that arrived last waited for nobody: its duration is the communication time.
    double t = all[i];
    for (int r = 1; r < n_; ++r) t = std::min(t, all[static_cast<size_t>(r) * k + i]);
    if (t > 0) ratios.push_back(t / batch_predicted_[i]);
  }
  if (ratios.empty()) return false;
  const double ratio = median_of(ratios);
  if (!(drift_baseline_ > 0)) {
    drift_baseline_ = ratio;
    return false;
  }
  if (ratio <= drift_baseline_ * kDriftFactor && ratio >= drift_baseline_ / kDriftFactor) {
    return false;
  }
  std::ostringstream m;
  m << "stragg: rank " << rank_ << " of group '" << group_ << "': step times drifted (measured/"
    << "model " << std::setprecision(3) << ratio << ", was " << drift_baseline_
    << " after the last link probe): re-probing the links";
  log_info(m.str());
  return true;
}

std::vector<LinkModel> GroupProfiler::measure_own_row(Executor& ex, const InternalSpec& spec,
                                                      std::chrono::milliseconds timeout,
                                                      size_t bytes_each, int repetitions) {
  using Clock = std::chrono::steady_clock;
  const size_t elems = std::max<size_t>(1, bytes_each / sizeof(float));
  std::vector<float> buf(2 * static_cast<size_t>(kProbeMessages) * elems, 1.0f);
  std::vector<LinkModel> mine(static_cast<size_t>(n_));
  for (auto& l : mine) l.alpha_s = l.beta_s_per_byte = -1;
  for (int round = 0; round < probe_rounds(n_); ++round) {
    for (int direction : {0, 1}) {
      const bool sender = probe_sends(n_, round, direction, rank_);
      // Minimum over the repetitions: noise (scheduling, other load) only ever adds time.
      double best[3] = {1e300, 1e300, 1e300};  // by ProbeShape
      for (int rep = 0; rep < repetitions; ++rep) {
        for (int shape = 0; shape < 3; ++shape) {
          const RankPlan plan = link_probe_plan(n_, rank_, round, direction, kProbeMessages, elems,
                                                static_cast<ProbeShape>(shape));
          const CollectiveSpec s = spec("link probe", DType::Float32, buf.size());
          const auto t0 = Clock::now();
          ex.run(plan, s, buf.data(), timeout);
          best[shape] = std::min(best[shape], std::chrono::duration<double>(Clock::now() - t0).count());
        }
      }
      if (!sender) continue;
      mine[probe_partner(n_, round, rank_)] =
          estimate_link(best[0], best[1], best[2], kProbeMessages, elems * sizeof(float));
    }
  }
  return mine;
}

void GroupProfiler::probe_links(Executor& ex, const InternalSpec& spec,
                                std::chrono::milliseconds timeout) {
  std::vector<LinkModel> matrix = probe_matrix(ex, spec, timeout, kProbeBytes, kProbeRepetitions);
  std::vector<Slowdown> current;
  {
    std::lock_guard<std::mutex> lock(mu_);
    current = analysis_.degraded;
  }
  // Every rank holds the same matrix and verdict: all decide alike to probe again.
  if (several_hosts()) {
    const LinkAnalysis first = analyze_links(network_links(matrix), n_, kDegradedThreshold);
    if (needs_confirmation(first, current, kSureFactor)) {
      log_info("stragg: rank " + std::to_string(rank_) + " of group '" + group_ +
               "': link probe: " + degraded_text(first.degraded) + "; probing again to confirm");
      const double first_cost = probe_cost_s_;
      matrix = average_links(matrix, probe_matrix(ex, spec, timeout, kProbeBytes,
                                                  kProbeRepetitions));
      probe_cost_s_ += first_cost;
    }
  }
  install(matrix);
  calls_since_probe_s_ = 0;
}

std::vector<LinkModel> GroupProfiler::probe_matrix(Executor& ex, const InternalSpec& spec,
                                                   std::chrono::milliseconds timeout,
                                                   size_t bytes_each, int repetitions) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<LinkModel> mine = measure_own_row(ex, spec, timeout, bytes_each, repetitions);
  // All-gather the rows (own row filled, zeros elsewhere): row i holds the links i -> j. The
  // unused diagonal slot (i -> i) carries how long rank i's measurement took.
  const size_t n = static_cast<size_t>(n_);
  std::vector<double> all(n * n * 2, 0.0);
  for (size_t j = 0; j < n; ++j) {
    all[(rank_ * n + j) * 2] = mine[j].alpha_s;
    all[(rank_ * n + j) * 2 + 1] = mine[j].beta_s_per_byte;
  }
  all[(rank_ * n + rank_) * 2] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ex.run(*small_allreduce_plan(rank_, n_, all.size()),
         spec("link probe exchange", DType::Float64, all.size()), all.data(), timeout);
  probe_cost_s_ = 0;
  for (size_t i = 0; i < n; ++i) probe_cost_s_ = std::max(probe_cost_s_, all[(i * n + i) * 2]);
  std::vector<LinkModel> matrix(n * n);
  for (size_t i = 0; i < n * n; ++i) {
    matrix[i].alpha_s = i / n == i % n ? -1 : all[i * 2];
    matrix[i].beta_s_per_byte = i / n == i % n ? -1 : all[i * 2 + 1];
  }
  return matrix;
}

bool GroupProfiler::several_hosts() const {
  return host_of_.size() == static_cast<size_t>(n_) &&
         std::any_of(host_of_.begin(), host_of_.end(), [&](int h) { return h != host_of_[0]; });
}

// The links between hosts (the others marked unmeasured) when the group spans several hosts,
// else all of them.
std::vector<LinkModel> GroupProfiler::network_links(const std::vector<LinkModel>& matrix) const {
  std::vector<LinkModel> out = matrix;
  const size_t n = static_cast<size_t>(n_);
  if (!several_hosts()) return out;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i != j && host_of_[i] == host_of_[j])
        out[i * n + j].alpha_s = out[i * n + j].beta_s_per_byte = -1;
    }
  }
  return out;
}

void GroupProfiler::install(const std::vector<LinkModel>& matrix) {
  LinkAnalysis a = analyze_links(network_links(matrix), n_, kDegradedThreshold);
  if (!several_hosts()) a.degraded.clear();  // one host: no network
  NetworkModel net;
  net.link = a.reference;
  net.degraded = a.degraded;
  planner_.set_network(net);
  bool verdict_changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    verdict_changed = a.degraded.size() != analysis_.degraded.size();
    for (size_t i = 0; !verdict_changed && i < a.degraded.size(); ++i) {
      verdict_changed = a.degraded[i].rank != analysis_.degraded[i].rank;
    }
    link_ = a.reference;
    link_source_ = "measured";
    link_matrix_ = matrix;
    analysis_ = a;
    drift_baseline_ = 0;
  }
  std::ostringstream m;
  m << "stragg: rank " << rank_ << " of group '" << group_ << "': link probe: alpha "
    << a.reference.alpha_s * 1e6 << " us, " << 1e-9 / a.reference.beta_s_per_byte
    << " GB/s (median over healthy links); " << degraded_text(a.degraded);
  log_info(m.str());
  if (verdict_changed) {
    log_info("stragg: rank " + std::to_string(rank_) + " of group '" + group_ +
             "': degraded links: " + degraded_text(a.degraded));
  }
}

ProfilerSummary GroupProfiler::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (profiler_) return profiler_->summary();
  ProfilerSummary s{};
  s.n = n_;
  s.straggler = -1;
  s.candidate = -1;
  s.link = link_;
  return s;
}

LinkModel GroupProfiler::link_model(std::string* source) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (source) *source = link_source_;
  return link_;
}

std::vector<LinkModel> GroupProfiler::link_matrix() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!link_matrix_.empty()) return link_matrix_;
  std::vector<LinkModel> empty(static_cast<size_t>(n_) * n_);
  for (auto& l : empty) l.alpha_s = l.beta_s_per_byte = -1;
  return empty;
}

LinkAnalysis GroupProfiler::link_analysis() const {
  std::lock_guard<std::mutex> lock(mu_);
  return analysis_;
}

std::vector<double> GroupProfiler::recent_delays() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recent_delays_;
}

}  // namespace stragg
