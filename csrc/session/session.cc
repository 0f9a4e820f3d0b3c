// Session (session.h): setup, names, the read-outs of the profiler's state, shutdown and abort.
// The rest of the class: session_run.cc (queueing and running calls), session_decide.cc (what
// each call runs), session_record.cc (call records and counters).
#include "session/session.h"

#include "common/error.h"
#include "common/log.h"
#include "session/group_setup.h"

namespace stragg {

Session::Session(Rendezvous& rdv, SessionOptions options)
    : opt_(std::move(options)), profiler_settings_(opt_.settings.profiler_settings()) {
  validate_profiler_settings(profiler_settings_);
  if (opt_.size > 1) {
    GroupSetup setup =
        set_up_group(rdv, opt_.rank, opt_.size, opt_.settings, opt_.store_host, opt_.timeout);
    same_host_ = setup.same_host;
    host_of_ = std::move(setup.host_of);
    transport_ = std::move(setup.impl);
    path_ = transport_ ? AllreducePath::Executor : AllreducePath::Delegate;
  }
  if (path_ == AllreducePath::Executor) {
    PlannerConfig config = PlannerConfig::from(opt_.settings);
    if (transport_->over_network()) config.pipeline_bytes = opt_.settings.tcp_pipeline_bytes;
    config.link = opt_.settings.initial_link_model(transport_->over_network());
    config.host_of = host_of_;  // ranks sharing hosts among several: two-level plans and model
    planner_ = std::make_unique<Planner>(opt_.size, std::move(config));
    for (const auto& note : planner_->notes()) log_info(prefix() + ": " + note);
    if (planner_->dynamic() && transport_->arrival_board() == nullptr) {
      if (!opt_.make_store_board) {
        throw Error(prefix() + ": STRAGG_STRAGGLER=dynamic needs an arrival board: the " +
                    std::string(transport_->name()) + " transport has none and no store was given");
      }
      store_board_ = opt_.make_store_board();
    }
    executor_ = std::make_unique<Executor>(*transport_);
    executor_->set_streaming_bytes(opt_.settings.streaming_bytes);
    profiler_ = std::make_unique<GroupProfiler>(opt_.rank, opt_.size, opt_.settings, *planner_,
                                                opt_.group_name, host_of_);
  }
  worker_ = std::make_unique<SerialWorker>();
  log_info(prefix() + " (size " + std::to_string(opt_.size) + "): all_reduce via " +
           transport_name() + ", algorithm " + algorithm_name() + ", straggler " +
           straggler().to_string());
}

Session::~Session() { shutdown("the process group was destroyed"); }

std::string Session::prefix() const {
  return "stragg: rank " + std::to_string(opt_.rank) + " of group '" + opt_.group_name + "'";
}

std::string Session::transport_name() const {
  switch (path_) {
    case AllreducePath::Local:
      return "local";
    case AllreducePath::Executor:
      return transport_->name();
    case AllreducePath::Delegate:
      return "gloo";
  }
  return "unknown";
}

std::string Session::algorithm_name() const {
  if (path_ == AllreducePath::Delegate) return "gloo";
  if (!planner_) return "local";
  return stragg::algorithm_name(planner_->algorithm());
}

Straggler Session::straggler() const {
  return planner_ ? planner_->straggler() : opt_.settings.straggler;
}

void Session::refuse(const char* op, const std::string& state) const {
  throw Error("stragg: rank " + std::to_string(opt_.rank) + ": " + op +
              " on a process group that was " + state);
}

ProfilerSummary Session::profiler_summary(bool* enabled) const {
  if (enabled) *enabled = profiler_ && profiler_->enabled();
  if (profiler_) return profiler_->summary();
  ProfilerSummary s{};
  s.n = opt_.size;
  s.straggler = -1;
  s.candidate = -1;
  s.link = opt_.settings.link_model();
  return s;
}

LinkModel Session::link_model(std::string* source) const {
  if (profiler_) return profiler_->link_model(source);
  if (source) *source = "default";
  return opt_.settings.link_model();
}

LinkAnalysis Session::link_analysis() const {
  if (profiler_) return profiler_->link_analysis();
  return LinkAnalysis{};
}

std::vector<LinkModel> Session::link_matrix() const {
  if (profiler_) return profiler_->link_matrix();
  std::vector<LinkModel> empty(static_cast<size_t>(opt_.size) * opt_.size);
  for (auto& l : empty) l.alpha_s = l.beta_s_per_byte = -1;
  return empty;
}

void Session::shutdown(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    if (stop_reason_.empty()) stop_reason_ = "shut down";
  }
  if (worker_) worker_->stop(/*drain=*/true, why);
}

void Session::abort(const std::string& why) {
  const std::string reason = "stragg: rank " + std::to_string(opt_.rank) + ": " + why;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    stop_reason_ = "aborted";
    if (local_abort_.empty()) local_abort_ = reason;
  }
  if (transport_) transport_->signal_abort(reason);
  if (worker_) worker_->stop(/*drain=*/false, why);
}

std::optional<std::string> Session::abort_reason() const {
  if (transport_) {
    if (auto r = transport_->abort_reason()) return r;
  }
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (!local_abort_.empty()) return local_abort_;
  return std::nullopt;
}

std::vector<int> Session::gone_peers() const {
  return transport_ ? transport_->gone_peers() : std::vector<int>{};
}

std::optional<std::string> Session::failure() const {
  if (auto reason = abort_reason()) {
    std::string why = *reason;
    if (why.rfind("stragg: ", 0) == 0) why = why.substr(8);
    return "aborted: " + why;
  }
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (!stop_reason_.empty()) return stop_reason_;
  return std::nullopt;
}

}  // namespace stragg
