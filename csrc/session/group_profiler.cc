#include "session/group_profiler.h"

#include <algorithm>
#include <sstream>

#include "plan/link_probe.h"
#include "runtime/log.h"

namespace stragg {
namespace {

constexpr int kProbeMessages = 8;
constexpr size_t kProbeBytes = 64 * 1024;
constexpr int kProbeRepetitions = 5;

}  // namespace

GroupProfiler::GroupProfiler(int rank, int n, const Settings& settings, Planner& planner,
                             std::string group)
    : rank_(rank),
      n_(n),
      settings_(settings.profiler_settings()),
      probe_every_(settings.probe_every),
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
  ex.run(*ring_allreduce_plan(rank_, n_, all.size()),
         spec("profiler exchange", DType::Float64, all.size()), all.data(), timeout);
  const std::vector<int64_t> bytes = std::move(batch_bytes_);
  batch_durations_.clear();
  batch_bytes_.clear();

  std::lock_guard<std::mutex> lock(mu_);
  // Link probes: after the first exchange, then periodically. They run at the start of the next
  // call (before_call), not now: now the users' threads are computing (the exchange runs behind
  // their backs) and would slow the probe's messages; inside a call every rank is waiting.
  if (probe_every_ > 0 && profiler_->exchanges() % probe_every_ == 0) probe_pending_ = true;
  const bool changed = profiler_->add_batch(all, k, bytes, link_, batch_first_call_);
  const ProfilerSummary sum = profiler_->summary();
  const size_t w = std::min<size_t>(settings_.window, sum.recent_delays_s.size());
  recent_delays_.assign(sum.recent_delays_s.end() - w, sum.recent_delays_s.end());
  straggler_.store(profiler_->straggler());
  if (changed) {
    log_info("stragg: rank " + std::to_string(rank_) + " of group '" + group_ + "': profiler: " +
             (sum.decisions.empty() ? std::string("straggler changed")
                                    : sum.decisions.back().reason));
  }
}

std::vector<LinkModel> GroupProfiler::measure_own_row(Executor& ex, const InternalSpec& spec,
                                                      std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const size_t elems = std::max<size_t>(1, kProbeBytes / sizeof(float));
  std::vector<float> buf(2 * static_cast<size_t>(kProbeMessages) * elems, 1.0f);
  std::vector<LinkModel> mine(static_cast<size_t>(n_));
  for (auto& l : mine) l.alpha_s = l.beta_s_per_byte = -1;
  for (int round = 0; round < probe_rounds(n_); ++round) {
    const int partner = probe_partner(n_, round, rank_);
    std::vector<double> t_many, t_one;
    for (int rep = 0; rep < kProbeRepetitions; ++rep) {
      for (bool many : {true, false}) {
        const RankPlan plan = link_probe_plan(n_, rank_, round, kProbeMessages, elems, many);
        const CollectiveSpec s = spec("link probe", DType::Float32, buf.size());
        const auto t0 = Clock::now();
        ex.run(plan, s, buf.data(), timeout);
        (many ? t_many : t_one).push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
    }
    if (partner < 0) continue;
    // Minimum over the repetitions: noise (scheduling, other load) only ever adds time.
    mine[partner] = estimate_link(*std::min_element(t_many.begin(), t_many.end()),
                                  *std::min_element(t_one.begin(), t_one.end()), kProbeMessages,
                                  elems * sizeof(float));
  }
  return mine;
}

void GroupProfiler::probe_links(Executor& ex, const InternalSpec& spec,
                                std::chrono::milliseconds timeout) {
  const std::vector<LinkModel> mine = measure_own_row(ex, spec, timeout);
  // All-gather the rows (own row filled, zeros elsewhere), then average both ends of each link.
  const size_t n = static_cast<size_t>(n_);
  std::vector<double> all(n * n * 2, 0.0);
  for (size_t j = 0; j < n; ++j) {
    all[(rank_ * n + j) * 2] = mine[j].alpha_s;
    all[(rank_ * n + j) * 2 + 1] = mine[j].beta_s_per_byte;
  }
  ex.run(*ring_allreduce_plan(rank_, n_, all.size()),
         spec("link probe exchange", DType::Float64, all.size()), all.data(), timeout);
  std::vector<LinkModel> matrix(n * n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const double* a = &all[(i * n + j) * 2];
      const double* b = &all[(j * n + i) * 2];
      LinkModel& l = matrix[i * n + j];
      if (i == j || a[0] < 0 || b[0] < 0) {
        l.alpha_s = l.beta_s_per_byte = -1;
      } else {
        l.alpha_s = 0.5 * (a[0] + b[0]);
        l.beta_s_per_byte = 0.5 * (a[1] + b[1]);
      }
    }
  }
  const LinkModel combined = combine_links(matrix, n_);
  planner_.set_link_model(combined);
  {
    std::lock_guard<std::mutex> lock(mu_);
    link_ = combined;
    link_source_ = "measured";
    link_matrix_ = std::move(matrix);
  }
  std::ostringstream m;
  m << "stragg: rank " << rank_ << " of group '" << group_ << "': link probe: alpha "
    << combined.alpha_s * 1e6 << " us, " << 1e-9 / combined.beta_s_per_byte
    << " GB/s (median over links)";
  log_info(m.str());
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

std::vector<double> GroupProfiler::recent_delays() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recent_delays_;
}

}  // namespace stragg
