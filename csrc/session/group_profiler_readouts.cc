// The read-outs of a group's profiler (session/group_profiler.h), for other threads
// (stragg.profiler.summary(), backend_stats, the link model and matrix, the plan checks): each
// a copy taken under the lock, which the worker thread holds while it changes what they read.
#include "session/group_profiler.h"

namespace stragg {

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
