// Session (session.h): what each call runs, decided alike on every rank: its straggler
// (configured, profiled, or agreed within the wait-or-proceed window in dynamic mode), the
// planner's choice, the one-shot all_reduce for small calls, and this rank's plan.
#include "session/session.h"

#include "plan/wait_or_proceed.h"

namespace stragg {

int Session::call_straggler(const CollectiveSpec& spec, size_t bytes, AllreduceCall& call,
                            CallRecord& record) {
  if (planner_->dynamic()) {
    const auto window = dynamic_window_for(bytes);
    record.window_s = std::chrono::duration<double>(window).count();
    // The board numbers agreements 0, 1, 2, ... (internal collectives take no ticket).
    CallTracer* tracer = call.tracer.get();
    if (tracer) tracer->agreement_begin(record);
    int s = -1;
    try {
      s = executor_->agree_on_straggler(spec, window, call.timeout, store_board_.get(),
                                        agreements_++);
    } catch (...) {
      if (tracer) tracer->agreement_end(record);
      throw;
    }
    if (tracer) tracer->agreement_end(record);
    (s >= 0 ? dynamic_straggler_calls_ : dynamic_plain_calls_).fetch_add(1);
    last_straggler_.store(s);
    return s;
  }
  if (planner_->profiled()) return profiler_->next_call_mode(nullptr).straggler;
  return planner_->straggler().rank;
}

// The one-shot all_reduce replaces what Auto chose for a small call without a straggler when
// the transport has one-shot buffers (shm: every rank on this host). The decision depends only
// on the size, the settings and the group, so every rank decides alike.
bool Session::oneshot_fits(const PlanChoice& choice, size_t bytes) const {
  if (planner_->algorithm() != Algorithm::Auto || choice.straggler >= 0) return false;
  if (choice.algorithm != Algorithm::Ring && choice.algorithm != Algorithm::Rhd &&
      choice.algorithm != Algorithm::Rd) {
    return false;
  }
  OneshotArea* area = transport_->oneshot_area();
  return area != nullptr && bytes <= opt_.settings.oneshot_bytes && bytes <= area->capacity();
}

Session::CallDecision Session::decide_call(const CollectiveSpec& spec, AllreduceCall& call,
                                           CallRecord& record) {
  const size_t elem = dtype_size(call.dtype);
  const int straggler = call_straggler(spec, call.numel * elem, call, record);
  // How late the call's straggler is expected (the cost model weighs it against degraded links).
  const double delay = planner_->dynamic()    ? record.window_s
                       : planner_->profiled() ? profiler_->straggler_delay_s()
                                              : 0.0;
  CallMode mode;  // the plan check's mode for this call (a trial's arm, or its verdict)
  profiler_->next_call_mode(&mode);
  const PlanChoice choice = planner_->choose(call.numel * elem, straggler, delay, true, mode);
  CallDecision decision;
  decision.oneshot = oneshot_fits(choice, call.numel * elem);
  if (decision.oneshot) {
    record.algorithm = record.schedule_name = "oneshot";
    record.straggler = -1;
    record.predicted_s = planner_->predict_oneshot(call.numel * elem);
  } else {
    record.algorithm = stragg::algorithm_name(choice.algorithm);
    // describe() formats: once per choice.
    if (!(choice == last_choice_) || last_schedule_name_.empty()) {
      last_choice_ = choice;
      last_schedule_name_ = choice.describe();
    }
    record.schedule_name = last_schedule_name_;
    record.straggler = choice.straggler;
    record.predicted_s = choice.post_arrival_s;
    record.plan_algorithm = choice.algorithm;
    record.plan_by_host = choice.by_host;
    decision.schedule =
        planner_->lower(opt_.rank, choice, call.numel, elem, transport_->supports_recv_limit());
  }
  return decision;
}

PlanChoice Session::decide_external(const ExternalCall& call) const {
  // The configured or profiled straggler (the dynamic one is agreed on CPU arrivals, which say
  // nothing about a GPU call).
  const int straggler = planner_->profiled() ? profiler_->straggler()
                        : planner_->dynamic() ? -1
                                              : planner_->straggler().rank;
  const double delay = planner_->profiled() ? profiler_->straggler_delay_s() : 0.0;
  CallMode mode;
  const PlanMode m = profiler_->plan_mode();
  mode.degraded = m.degraded;
  mode.flat = m.flat;
  return planner_->choose(call.numel * dtype_size(call.dtype), straggler, delay, /*host=*/false,
                          mode);
}

std::chrono::microseconds Session::dynamic_window_for(size_t bytes) const {
  if (opt_.settings.dynamic_window_us >= 0) {
    return std::chrono::microseconds(opt_.settings.dynamic_window_us);
  }
  const LinkModel link = link_model(nullptr);
  const std::vector<double> delays = profiler_ ? profiler_->recent_delays() : std::vector<double>{};
  const double w = wait_or_proceed_window_s(opt_.size, static_cast<double>(bytes), link, delays);
  return std::chrono::microseconds(static_cast<int64_t>(w * 1e6));
}

}  // namespace stragg
