// The link-probe campaign of a group's profiler (session/group_profiler.h): when a campaign is
// due (the first exchange, every STRAGG_PROBE_EVERY exchanges, the step times drifting from the
// model), its budget and how many slices run after which call, a campaign's end (a second probe
// to confirm a small new slowdown), and the explicit probe of stragg.profiler.measure_links().
// What a finished campaign's matrix becomes: group_link_model.cc.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "common/log.h"
#include "session/group_profiler.h"
#include "session/group_profiler_tuning.h"

namespace stragg {

using namespace profiler_tuning;

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

void GroupProfiler::want_probes(bool drift, double batch_time) {
  // Link probes: at the first exchange, then periodically and on drift. Their slices run right
  // after calls (run_probe_slices), when every rank has just finished the same collective: at
  // the start of a call a late rank would be late for the probe too, and its partners would
  // time its lateness as their links' latency.
  // (The early first exchange does not start them: its calls are the job's warm-up, whose
  // noise the probes would read as slow links.)
  const bool early = early_exchange_ && exchanges_done_ == 1;
  const uint64_t regular = profiler_->exchanges() - (early_exchange_ && !early ? 1 : 0);
  if (probe_every_ > 0 && !early && regular % probe_every_ == 0) periodic_probe_wanted_ = true;
  if (batch_time > 0) job_s_since_campaign_ += batch_time;
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

void GroupProfiler::hurry_first_campaign() {
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

}  // namespace stragg
