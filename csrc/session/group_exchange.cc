// The straggler exchange of a group's profiler (session/group_profiler.h): each call's numbers
// gathered into the batch (after_call), the batch all-gathered every K calls (exchange), K
// adapted to what exchanges cost, the batch handed to the straggler profiler and its verdict
// logged; then the exchange's other readers in order: the link-probe schedule
// (group_link_probes.cc), the link model (group_link_model.cc), the plan check
// (group_plan_check.cc).
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "common/log.h"
#include "session/group_profiler.h"
#include "session/group_profiler_tuning.h"

namespace stragg {

using namespace profiler_tuning;

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
  fill_exchange_row(k);
  // The exchange's cost is its all_reduce and what follows it here (the profiler's analysis, the
  // plan check): at 2 ranks and 4 KiB the analysis costs more than the all_reduce.
  struct CostClock {
    double& out;
    Clock::time_point start;
    ~CostClock() { out = seconds(Clock::now() - start); }
  } cost_clock{last_exchange_s_, Clock::now()};
  std::vector<double>& all = exchange_rows_;
  ex.run(*small_allreduce_schedule(rank_, n_, all.size()),
         spec("profiler exchange", DType::Float64, all.size()), all.data(), timeout);
  interval_spoiled_ = true;
  const AgreedBatch agreed = read_exchange_rows(k);
  const std::vector<double>& durations = exchange_durations_;
  const double batch_time = agreed.period * k;
  adapt_exchange_every(agreed.period, k, agreed.exchange_s);

  const std::vector<int64_t> bytes = std::move(batch_bytes_);
  batch_durations_.clear();
  batch_bytes_.clear();
  const bool drift = drifted(durations, k);
  const std::vector<CheckedCall> checked = checked_calls(exchange_costs_, k, bytes);
  batch_predicted_.clear();
  batch_families_.clear();
  batch_costs_.clear();

  std::unique_lock<std::mutex> lock(mu_);
  // Before add_batch: the probes count the exchanges the profiler had before this one.
  want_probes(drift, agreed.period > 0 ? batch_time : 0);
  const bool changed = profiler_->add_batch(durations, k, bytes, link_, batch_first_call_);
  // Not summary(): it evaluates the cost model for its report, which small calls would pay for.
  recent_delays_ = profiler_->recent_delays(static_cast<size_t>(settings_.window));
  straggler_delay_s_.store(profiler_->candidate_median_delay_s());
  probe_stats_.exchange_every = every_;
  if (changed) log_straggler_verdict();
  const int proposed_straggler = profiler_->straggler();
  const uint64_t exchanges = profiler_->exchanges();
  lock.unlock();

  const double beta = calls_beta(durations, k, bytes, checked);
  schedule_probes(beta, k, agreed.period);
  use_calls_rate(beta);
  install_pending();
  PlanMode proposed;
  proposed.straggler = proposed_straggler;
  {
    std::lock_guard<std::mutex> guard(mu_);
    proposed.degraded = analysis_.degraded;
  }
  check_plan(proposed, checked, exchanges);
  hurry_first_campaign();
}

void GroupProfiler::fill_exchange_row(int k) {
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
}

GroupProfiler::AgreedBatch GroupProfiler::read_exchange_rows(int k) {
  const size_t w = 2 * static_cast<size_t>(k) + 3;
  const std::vector<double>& all = exchange_rows_;
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
  // A slice's time: the slowest rank's time in the batch's slices, per slice.
  if (batch_slices_ > 0) slice_s_ = std::max(slice_s / static_cast<double>(batch_slices_), 1e-6);
  batch_probe_s_ = 0;
  batch_slices_ = 0;
  return {median_of(periods), exchange_s};  // period 0: unknown
}

void GroupProfiler::adapt_exchange_every(double batch_period, int k, double exchange_s) {
  // Calls so short that exchanges would cost more than their share: exchange less often.
  if (!(batch_period > 0 && exchange_s > 0 && exchange_s < 1e300)) return;
  const double batch_time = batch_period * k;
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

void GroupProfiler::log_straggler_verdict() const {
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

void GroupProfiler::apply(const PlanMode& mode) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = mode;
  }
  straggler_.store(mode.straggler);
}

}  // namespace stragg
