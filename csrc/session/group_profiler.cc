#include "session/group_profiler.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "common/log.h"
#include "plan/link_probe.h"
#include "plan/median.h"

namespace stragg {
namespace {

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
double median_of_tail(const std::vector<double>& v) {
  const size_t n = std::min(kMedianCalls, v.size());
  return median_of(std::vector<double>(v.end() - static_cast<std::ptrdiff_t>(n), v.end()));
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
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
      plan_check_(settings.plan_check),
      probe_budget_(settings.probe_budget),
      host_of_(std::move(host_of)),
      planner_(planner),
      group_(std::move(group)),
      // Host mates' links say nothing about the network: groups with some pair every rank.
      prober_(rank, n,
              host_of_.size() == static_cast<size_t>(n) &&
                  [this] {
                    std::vector<int> h = host_of_;
                    std::sort(h.begin(), h.end());
                    return std::adjacent_find(h.begin(), h.end()) != h.end();
                  }(),
              host_of_.size() == static_cast<size_t>(n) ? host_of_ : std::vector<int>{}),
      check_(planner.host_level_possible() && planner.config().host_level == HostLevelPolicy::Auto),
      every_(settings.profiler_settings().exchange_every),
      link_(planner.link_model()) {
  if (settings_.enabled) {
    profiler_ = std::make_unique<StragglerProfiler>(n, settings_);
    profiler_->set_direct_variant(planner.direct_candidate());  // fixed with the transport
  }
  enabled_.store(profiler_ != nullptr);
  // Checked moves start from the baseline; unchecked ones from the cost model's choice.
  if (plan_check_ && profiler_) mode_ = check_.current();
}

void GroupProfiler::run_probe_slices(Executor& ex, const InternalSpec& spec,
                                     std::chrono::milliseconds timeout) {
  if (slices_allowed_ == 0 || !prober_.active()) return;
  const size_t count = std::min(slices_per_call_, slices_allowed_);
  slices_allowed_ -= count;
  const auto t0 = Clock::now();
  std::optional<std::vector<LinkModel>> matrix = prober_.run_slices(ex, spec, timeout, count);
  const double spent = seconds(Clock::now() - t0);
  batch_probe_s_ += spent;
  pause_s_ += spent;
  interval_spoiled_ = true;
  batch_slices_ += count;
  {
    std::lock_guard<std::mutex> lock(mu_);
    probe_stats_.slices += count;
    probe_stats_.seconds += spent;
  }
  if (matrix) {
    campaign_finished(std::move(*matrix));
    // A measured matrix waits for an exchange (its verdict goes through the plan check there):
    // that one comes kFirstBatchCalls calls from now, not at the end of a long batch.
    if (pending_) cut_batch_at_ = static_cast<int>(batch_durations_.size()) + kFirstBatchCalls;
  }
}

void GroupProfiler::after_call(Executor& ex, const InternalSpec& spec, const CallRecord& record,
                               std::chrono::milliseconds timeout) {
  if (!enabled()) return;
  const uint64_t call = calls_++;
  const auto now = record.run_end == Clock::time_point{} ? Clock::now() : record.run_end;
  if (batch_durations_.empty()) batch_first_call_ = call;
  if (!interval_spoiled_) batch_intervals_.push_back(seconds(now - last_end_));
  // The call's cost to the job: since the previous call's end, without exchanges and probes.
  batch_costs_.push_back(last_end_ == Clock::time_point{}
                             ? -1.0
                             : std::max(0.0, seconds(now - last_end_) - pause_s_));
  pause_s_ = 0;
  last_end_ = now;
  interval_spoiled_ = false;
  batch_durations_.push_back(record.agreement_s + record.run_s);
  batch_bytes_.push_back(record.bytes);
  batch_predicted_.push_back(record.predicted_s);
  batch_families_.push_back({record.plan_algorithm, record.plan_by_host});
  try {
    // An extra exchange after the first kFirstBatchCalls calls: until it the planner has only
    // the default link model (fast links), which on a slow network picks slower schedules for
    // large calls. The next one is at call K again, so the later ones keep their schedule.
    int batch = every_;
    if (exchanges_done_ == 0 && every_ > kFirstBatchCalls) batch = kFirstBatchCalls;
    if (exchanges_done_ == 1 && early_exchange_) batch = std::max(1, every_ - kFirstBatchCalls);
    if (cut_batch_at_ > 0) batch = std::min(batch, cut_batch_at_);
    // A trial's batch is the trial: its arms' calls, however often exchanges come otherwise.
    if (check_.in_trial()) batch = static_cast<int>(check_.trial_calls());
    if (static_cast<int>(batch_durations_.size()) >= batch) {
      cut_batch_at_ = 0;
      if (exchanges_done_ == 0) early_exchange_ = batch < every_;
      ++exchanges_done_;
      exchange(ex, spec, timeout);
      pause_s_ += last_exchange_s_;
      std::lock_guard<std::mutex> lock(mu_);
      probe_stats_.exchange_s += last_exchange_s_;
    }
    run_probe_slices(ex, spec, timeout);
  } catch (const std::exception& e) {
    log_warning("stragg: rank " + std::to_string(rank_) + ": profiler exchange failed, " +
                "profiling stops: " + e.what());
    std::lock_guard<std::mutex> lock(mu_);
    profiler_.reset();
    enabled_.store(false);
    straggler_.store(-1);
  }
}

void GroupProfiler::exchange(Executor& ex, const InternalSpec& spec,
                             std::chrono::milliseconds timeout) {
  const int k = static_cast<int>(batch_durations_.size());
  const size_t w = 2 * static_cast<size_t>(k) + 3;  // durations, costs, 3 numbers
  // This rank's time per call in the batch (the median time between the ends of consecutive
  // calls: the job's compute included, exchanges and probes not), its time in probe slices,
  // its last exchange's.
  const double period = batch_intervals_.size() >= 3 ? median_of_tail(batch_intervals_) : -1;
  batch_intervals_.clear();
  // All-gather through a sum: every rank fills its own row, zeros elsewhere (x + 0 is exact).
  std::vector<double>& all = exchange_rows_;  // kept between exchanges: no allocation
  all.assign(static_cast<size_t>(n_) * w, 0.0);
  double* row = all.data() + static_cast<size_t>(rank_) * w;
  std::copy(batch_durations_.begin(), batch_durations_.end(), row);
  std::copy(batch_costs_.begin(), batch_costs_.end(), row + k);
  row[2 * k] = period;
  row[2 * k + 1] = batch_probe_s_;
  row[2 * k + 2] = last_exchange_s_;
  // The exchange's cost is its all_reduce and what follows it here (the profiler's analysis, the
  // plan check): at 2 ranks and 4 KiB the analysis costs more than the all_reduce.
  const auto t0 = Clock::now();
  struct CostClock {
    double& out;
    Clock::time_point start;
    ~CostClock() { out = seconds(Clock::now() - start); }
  } cost_clock{last_exchange_s_, t0};
  ex.run(*small_allreduce_schedule(rank_, n_, all.size()),
         spec("profiler exchange", DType::Float64, all.size()), all.data(), timeout);
  interval_spoiled_ = true;

  std::vector<double>& durations = exchange_durations_;
  durations.resize(static_cast<size_t>(n_) * k);
  std::vector<double>& costs = exchange_costs_;
  costs.resize(static_cast<size_t>(n_) * k);
  std::vector<double> periods;
  // An exchange's cost is the last rank's time in it: the others also waited for it to arrive.
  double slice_s = 0, exchange_s = 1e300;
  for (int r = 0; r < n_; ++r) {
    const double* rr = all.data() + static_cast<size_t>(r) * w;
    std::copy(rr, rr + k, durations.begin() + static_cast<ptrdiff_t>(r) * k);
    std::copy(rr + k, rr + 2 * k, costs.begin() + static_cast<ptrdiff_t>(r) * k);
    if (rr[2 * k] > 0) periods.push_back(rr[2 * k]);
    slice_s = std::max(slice_s, rr[2 * k + 1]);
    exchange_s = std::min(exchange_s, rr[2 * k + 2]);
  }
  const double batch_period = median_of(periods);  // 0: unknown
  if (batch_slices_ > 0) slice_s_ = std::max(slice_s / static_cast<double>(batch_slices_), 1e-6);
  batch_probe_s_ = 0;
  batch_slices_ = 0;
  // Calls so short that exchanges would cost more than their share: exchange less often.
  const double batch_time = batch_period * k;
  if (batch_period > 0 && exchange_s > 0 && exchange_s < 1e300) {
    const bool costly = batch_time * kExchangeShare < exchange_s;
    const double batch_at_k_s = batch_period * every_;  // a batch of K calls (this one may be cut)
    if (costly && costly_exchanges_ && every_ < kMaxEvery && 2 * batch_at_k_s <= kMaxBatchS) {
      every_ = std::min(kMaxEvery, every_ * 2);
    } else if ((batch_time * kExchangeShare > 8 * exchange_s || batch_at_k_s > 2 * kMaxBatchS) &&
               every_ > settings_.exchange_every) {
      every_ = std::max(settings_.exchange_every, every_ / 2);
    }
    costly_exchanges_ = costly;
  }

  const std::vector<int64_t> bytes = std::move(batch_bytes_);
  batch_durations_.clear();
  batch_bytes_.clear();
  const bool drift = drifted(durations, k);
  const std::vector<CheckedCall> checked = checked_calls(costs, k, bytes);
  batch_predicted_.clear();
  batch_families_.clear();
  batch_costs_.clear();

  std::unique_lock<std::mutex> lock(mu_);
  // Link probes: at the first exchange, then periodically and on drift. Their slices run right
  // after calls (run_probe_slices), when every rank has just finished the same collective: at
  // the start of a call a late rank would be late for the probe too, and its partners would
  // time its lateness as their links' latency.
  // (The early first exchange does not start them: its calls are the job's warm-up, whose
  // noise the probes would read as slow links.)
  const bool early = early_exchange_ && exchanges_done_ == 1;
  const uint64_t regular = profiler_->exchanges() - (early_exchange_ && !early ? 1 : 0);
  if (probe_every_ > 0 && !early && regular % probe_every_ == 0) periodic_probe_wanted_ = true;
  if (batch_period > 0) job_s_since_campaign_ += batch_time;
  // slice_s_ and the batches' time are agreed: every rank decides alike.
  const double campaign_s = static_cast<double>(campaign_slices_) * slice_s_;
  if (periodic_probe_wanted_ && job_s_since_campaign_ * kPeriodicProbeShare >= campaign_s) {
    periodic_probe_wanted_ = false;
    probe_due_ = true;
  }
  if (drift && profiler_->exchanges() >= last_drift_probe_ + kDriftProbeInterval &&
      job_s_since_campaign_ * probe_budget_ >= campaign_s) {
    last_drift_probe_ = profiler_->exchanges();
    probe_due_ = true;
  }
  const bool changed = profiler_->add_batch(durations, k, bytes, link_, batch_first_call_);
  // Not summary(): it evaluates the cost model for its report, which small calls would pay for.
  recent_delays_ = profiler_->recent_delays(static_cast<size_t>(settings_.window));
  straggler_delay_s_.store(profiler_->candidate_median_delay_s());
  probe_stats_.exchange_every = every_;
  if (changed) {
    // The verdict first (rank, share, delay), then the profiler's reason for it.
    const ProfilerSummary sum = profiler_->summary();
    std::ostringstream m;
    m << "stragg: rank " << rank_ << " of group '" << group_ << "': profiler: straggler verdict: ";
    if (sum.straggler >= 0) {
      m << "rank " << sum.straggler << " (last in " << std::fixed << std::setprecision(1)
        << sum.straggler_share * 100 << "% of the window's significant calls";
      if (sum.candidate == sum.straggler)
        m << ", median delay " << std::setprecision(3) << sum.median_delay_s * 1e3 << " ms";
      m << ")";
    } else {
      m << "none";
    }
    if (!sum.decisions.empty()) {
      m << " from call " << sum.decisions.back().call << ": " << sum.decisions.back().reason;
    }
    log_info(m.str());
  }
  const int proposed_straggler = profiler_->straggler();
  const uint64_t exchanges = profiler_->exchanges();
  lock.unlock();

  const double beta = calls_beta(durations, k, bytes, checked);
  schedule_probes(beta, k, batch_period);
  {
    // Until a probe has measured the links, the calls' own rate is a better model than the
    // default, which is made for fast links and picks slower algorithms on slow ones.
    std::unique_lock<std::mutex> guard(mu_);
    if (link_source_ != "measured" && beta > 0) {
      // The model's predictions change: drift is measured against the new model from here.
      if (link_source_ == "default") drift_baseline_ = 0;
      link_.beta_s_per_byte = beta;
      link_source_ = "calls";
      const LinkModel provisional = link_;
      guard.unlock();
      planner_.set_link_model(provisional);
    }
  }
  if (pending_) {
    install(*pending_, pending_verdict_ ? &*pending_verdict_ : nullptr);
    pending_.reset();
    pending_verdict_.reset();
  }
  PlanMode proposed;
  proposed.straggler = proposed_straggler;
  {
    std::lock_guard<std::mutex> guard(mu_);
    proposed.degraded = analysis_.degraded;
  }
  check_plan(proposed, checked, exchanges);
  {
    std::lock_guard<std::mutex> guard(mu_);
    // The first campaign decides whether the network is degraded: when its budget runs out
    // before its last slice, the next exchange (which grants more) comes after kFirstBatchCalls
    // calls, not after K. Not while a plan check's trial runs (its batch is the trial) nor when
    // exchanges are costly (K grew).
    if (probe_stats_.campaigns == 0 && !confirming_ && prober_.active() &&
        slices_allowed_ < prober_.slices_left() && every_ <= settings_.exchange_every &&
        !check_.in_trial()) {
      cut_batch_at_ = kFirstBatchCalls;
    }
  }
}

double GroupProfiler::calls_beta(const std::vector<double>& durations, int k,
                                 const std::vector<int64_t>& bytes,
                                 const std::vector<CheckedCall>& calls) const {
  // The last arrival's time (it waited for nobody) over what a flat Ring or RHD moves per rank
  // (across hosts one flow per NIC), for such calls of 64 KiB or more: the rate the calls showed
  // (0: no such call).
  std::vector<double> betas;
  for (int i = 0; i < k; ++i) {
    const PlanFamily& f = calls[static_cast<size_t>(i)].family;
    const bool ring_like =
        !f.by_host && (f.algorithm == Algorithm::Ring || f.algorithm == Algorithm::Rhd);
    if (bytes[static_cast<size_t>(i)] < 64 * 1024 || !ring_like) continue;
    double t = durations[static_cast<size_t>(i)];
    for (int r = 1; r < n_; ++r) t = std::min(t, durations[static_cast<size_t>(r) * k + i]);
    const double moved = 2.0 * (n_ - 1) / n_ * static_cast<double>(bytes[static_cast<size_t>(i)]);
    if (t > 0) betas.push_back(t / moved);
  }
  return median_of(betas);
}

void GroupProfiler::schedule_probes(double calls_beta_s, int k, double period_s) {
  if (probe_every_ <= 0 || n_ < 2) return;
  // A confirming campaign completes its first one's measurement: the first's budget.
  const double budget = probe_stats_.campaigns == 0 || confirming_ ? probe_budget_
                                                                   : kLaterProbeBudget * probe_budget_;
  if (period_s > 0) allowance_s_ += budget * period_s * k;
  if (probe_due_ && !prober_.active()) {
    // Transfers of about kProbeTransferS at the rate the calls showed.
    double beta = calls_beta_s;
    if (!(beta > 0)) beta = link_.beta_s_per_byte;
    double want = kProbeTransferS / std::max(beta, 1e-15);
    // The last campaign's slices took more than their share of a call: smaller transfers (a
    // 4 KiB call on one host need not wait for 3 MiB of probe traffic).
    if (period_s > 0 && slice_s_ > 0 && campaign_transfer_ > 0 &&
        slice_s_ > kSliceShareOfCall * period_s) {
      want = std::min(want, static_cast<double>(campaign_transfer_) * kSliceShareOfCall *
                                period_s / slice_s_);
    }
    prober_.start(static_cast<size_t>(std::clamp(want, static_cast<double>(kMinProbeTransfer),
                                                 static_cast<double>(kMaxProbeTransfer))));
    probe_due_ = false;
    periodic_probe_wanted_ = false;  // a drift probe serves as the periodic one too
    job_s_since_campaign_ = 0;
    campaign_slices_ = prober_.slices_left();
    campaign_transfer_ = prober_.transfer_bytes();
    if (slice_s_ <= 0) {
      // Until a slice has run: two transfers and a dozen latencies, doubled for safety.
      slice_s_ = 2 * (2 * static_cast<double>(prober_.transfer_bytes()) * beta +
                      12 * link_.alpha_s);
    }
  }
  if (!prober_.active()) {
    slices_allowed_ = 0;
    // Nothing to spend it on: the allowance does not pile up into a burst later. Until the
    // first campaign it does: its budget is a share of the job's time until it, warm-up included.
    if (slice_s_ > 0) allowance_s_ = std::min(allowance_s_, 2 * slice_s_);
    return;
  }
  const size_t affordable = slice_s_ > 0 ? static_cast<size_t>(allowance_s_ / slice_s_) : 0;
  slices_allowed_ = std::min(affordable, prober_.slices_left());
  allowance_s_ -= static_cast<double>(slices_allowed_) * slice_s_;
  slices_per_call_ = 1;
  if (period_s > 0 && slice_s_ > 0) {
    slices_per_call_ = std::max<size_t>(1, static_cast<size_t>(kSliceShareOfCall * period_s / slice_s_));
  }
}

void GroupProfiler::campaign_finished(std::vector<LinkModel> matrix) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    probe_stats_.campaigns += 1;
    probe_stats_.transfer_bytes = prober_.transfer_bytes();
  }
  if (confirming_) {
    confirming_ = false;
    pending_verdict_ = confirmed_verdict(first_matrix_, matrix);
    pending_ = average_links(first_matrix_, matrix);
    return;
  }
  std::vector<Slowdown> sure;
  if (needs_second_probe(matrix, &sure)) {
    confirming_ = true;
    // A new rank far past the threshold acts now; the second probe is for the rest.
    if (!(sure == degraded_now())) {
      pending_ = matrix;
      pending_verdict_ = std::move(sure);
    }
    first_matrix_ = std::move(matrix);
    prober_.start(prober_.transfer_bytes());
    return;
  }
  pending_ = std::move(matrix);
  pending_verdict_.reset();
}

bool GroupProfiler::needs_second_probe(const std::vector<LinkModel>& matrix,
                                       std::vector<Slowdown>* sure) {
  const std::vector<Slowdown> current = degraded_now();
  // Every rank holds the same matrix and verdict: all decide alike to probe again.
  if (!several_hosts()) return false;
  const LinkAnalysis first = analyze(matrix);
  if (!needs_confirmation(first, current, kSureFactor)) return false;
  if (sure) *sure = sure_degraded(first, current, kSureFactor);
  log_info("stragg: rank " + std::to_string(rank_) + " of group '" + group_ +
           "': link probe: " + degraded_text(first.degraded) + "; probing again to confirm");
  return true;
}

void GroupProfiler::probe_links(Executor& ex, const InternalSpec& spec,
                                std::chrono::milliseconds timeout) {
  const auto t0 = Clock::now();
  std::vector<LinkModel> matrix = prober_.probe_now(ex, spec, timeout);
  std::optional<std::vector<Slowdown>> verdict;
  if (needs_second_probe(matrix)) {
    const std::vector<LinkModel> second = prober_.probe_now(ex, spec, timeout);
    verdict = confirmed_verdict(matrix, second);
    matrix = average_links(matrix, second);
  }
  const double spent = seconds(Clock::now() - t0);
  pause_s_ += spent;
  interval_spoiled_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    probe_stats_.campaigns += 1;
    probe_stats_.seconds += spent;
  }
  install(matrix, verdict ? &*verdict : nullptr);
  // Asked for explicitly (the same point on every rank): applied now, without a trial.
  PlanMode mode;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PlanMode proposed = check_.current();
    proposed.degraded = analysis_.degraded;
    if (profiler_) proposed.straggler = profiler_->straggler();
    mode = plan_check_ ? check_.apply_now(proposed, profiler_ ? profiler_->exchanges() : 0)
                       : proposed;
  }
  apply(mode);
}

bool GroupProfiler::drifted(const std::vector<double>& durations, int k) {
  std::vector<double> ratios;
  const int first = std::max(0, k - static_cast<int>(kMedianCalls));
  ratios.reserve(static_cast<size_t>(k - first));
  for (int i = first; i < k; ++i) {
    if (!(batch_predicted_[i] > 0)) continue;
    // The rank that arrived last waited for nobody: its duration is the communication time.
    double t = durations[i];
    for (int r = 1; r < n_; ++r) t = std::min(t, durations[static_cast<size_t>(r) * k + i]);
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

LinkAnalysis GroupProfiler::analyze(const std::vector<LinkModel>& matrix) const {
  return analyze_links(network_links(matrix), n_, kDegradedThreshold);
}

std::vector<Slowdown> GroupProfiler::degraded_now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return analysis_.degraded;
}

std::vector<Slowdown> GroupProfiler::confirmed_verdict(const std::vector<LinkModel>& first,
                                                       const std::vector<LinkModel>& second) const {
  return confirmed_degraded(analyze(first), analyze(second), degraded_now());
}

void GroupProfiler::install(const std::vector<LinkModel>& matrix,
                            const std::vector<Slowdown>* verdict) {
  LinkAnalysis a = analyze(matrix);
  if (verdict) a.degraded = *verdict;
  if (!several_hosts()) a.degraded.clear();  // one host: no network
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
  // The measured network at once (what the cost model predicts with); what OptCC runs for goes
  // through the plan check (the call's mode). Corrections measured against a model whose links
  // were a quarter or more faster or slower no longer hold.
  NetworkModel net = planner_.network();
  const double old_beta = net.link.beta_s_per_byte;
  net.link = a.reference;
  net.degraded = a.degraded;
  planner_.set_network(net);
  const double change = old_beta > 0 ? a.reference.beta_s_per_byte / old_beta : 0;
  if (planner_.two_level()) {
    // Host mates' links (shared memory): their median, for the two-level model.
    std::vector<double> alphas, betas;
    const size_t n = static_cast<size_t>(n_);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        const LinkModel& l = matrix[i * n + j];
        if (i == j || host_of_[i] != host_of_[j] || !(l.alpha_s >= 0)) continue;
        alphas.push_back(l.alpha_s);
        betas.push_back(l.beta_s_per_byte);
      }
    }
    if (!alphas.empty()) planner_.set_local_link({median_of(alphas), median_of(betas)});
  }
  if (!(change > 0.8 && change < 1.25)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_.reset_corrections();
    }
    planner_.set_corrections({});
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

void GroupProfiler::apply(const PlanMode& mode) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = mode;
  }
  straggler_.store(mode.straggler);
}

ProfilerSummary GroupProfiler::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  ProfilerSummary s{};
  if (profiler_) {
    s = profiler_->summary();
  } else {
    s.n = n_;
    s.straggler = -1;
    s.candidate = -1;
    s.link = link_;
  }
  s.applied_straggler = mode_.straggler;
  s.applied_degraded = mode_.degraded;
  s.applied_mode = mode_.describe();
  for (const auto& [family, ratio] : check_.corrections()) {
    s.corrections.emplace_back(family.describe(), ratio);
  }
  s.plan_checks = check_.records();
  s.probe_campaigns = probe_stats_.campaigns;
  s.probe_slices = probe_stats_.slices;
  s.probe_s = probe_stats_.seconds;
  s.probe_transfer_bytes = probe_stats_.transfer_bytes;
  s.exchange_s = probe_stats_.exchange_s;
  s.exchange_every = probe_stats_.exchange_every > 0 ? probe_stats_.exchange_every : every_;
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

std::vector<PlanCheckRecord> GroupProfiler::plan_checks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return check_.records();
}

PlanMode GroupProfiler::plan_mode() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mode_;
}

ProbeStats GroupProfiler::probe_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return probe_stats_;
}

}  // namespace stragg
