// The link model of a group's profiler (session/group_profiler.h) and its install into the
// planner: the calls' own rate as a provisional model until a probe has measured the links, a
// measured matrix's analysis (the network's links, the degraded ranks, the host mates' links of
// the two-level model) given to the planner, and the corrections that no longer hold reset.
// When the probes run: group_link_probes.cc.
#include <algorithm>
#include <sstream>

#include "common/log.h"
#include "session/group_profiler.h"
#include "session/group_profiler_tuning.h"

namespace stragg {

using namespace profiler_tuning;

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

void GroupProfiler::use_calls_rate(double calls_beta_s) {
  // Until a probe has measured the links, the calls' own rate is a better model than the
  // default, which is made for fast links and picks slower algorithms on slow ones.
  std::unique_lock<std::mutex> guard(mu_);
  if (link_source_ == "measured" || !(calls_beta_s > 0)) return;
  // The model's predictions change: drift is measured against the new model from here.
  if (link_source_ == "default") drift_baseline_ = 0;
  link_.beta_s_per_byte = calls_beta_s;
  link_source_ = "calls";
  const LinkModel provisional = link_;
  guard.unlock();
  planner_.set_link_model(provisional);
}

void GroupProfiler::install_pending() {
  if (!pending_) return;
  install(*pending_, pending_verdict_ ? &*pending_verdict_ : nullptr);
  pending_.reset();
  pending_verdict_.reset();
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

}  // namespace stragg
