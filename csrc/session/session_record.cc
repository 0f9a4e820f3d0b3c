// Session (session.h): what the session keeps of each call: the record of a finished call
// (STRAGG_DEBUG=DETAIL logs it, the profiler learns from it, stragg.recent_calls returns the last
// kCallHistory), and the counters stats() reports (backend_stats).
#include "session/session.h"

#include <sstream>

#include "common/log.h"

namespace stragg {

void Session::finish_call(AllreduceCall& call, CallRecord& record, std::exception_ptr error) {
  if (error) {
    failed_calls_.fetch_add(1);
  } else if (path_ != AllreducePath::Delegate) {
    allreduce_calls_.fetch_add(1);
    allreduce_bytes_.fetch_add(record.bytes);
  }
  record.ok = !error;
  if (opt_.settings.debug == DebugLevel::Detail) {
    std::ostringstream m;
    m << prefix() << " all_reduce #" << record.seq << " " << record.bytes << " B via "
      << record.schedule_name << " straggler " << record.straggler << ": queued "
      << record.queued_s * 1e6 << " us, agreement " << record.agreement_s * 1e6 << " us (window "
      << record.window_s * 1e6 << " us), run " << record.run_s * 1e6 << " us (waiting "
      << record.wait_s * 1e6 << " us, pre-arrival " << record.pre_arrival_s * 1e6 << " us)"
      << (record.ok ? "" : " FAILED");
    log_info(m.str());
  }
  {
    std::lock_guard<std::mutex> lock(history_mu_);
    history_.push_back(record);
    if (history_.size() > kCallHistory) history_.pop_front();
    if (executor_) executor_totals_ = executor_->stats();
  }
  call.done(error);
  // After completing the call, so the user does not wait for it; every rank does it after the
  // same call, so the exchange's sequence number matches everywhere.
  if (!error && executor_) {
    const InternalSpec internal = [this](const char* name, DType dtype, size_t numel) {
      return next_spec(name, dtype, numel, /*internal=*/true);
    };
    profiler_->after_call(*executor_, internal, record, call.timeout);
  }
}

std::map<std::string, int64_t> Session::stats() const {
  std::map<std::string, int64_t> s;
  s["allreduce_calls"] = allreduce_calls_.load();
  s["allreduce_bytes"] = allreduce_bytes_.load();
  s["failed_calls"] = failed_calls_.load();
  s["barrier_calls"] = barrier_calls_.load();
  {
    std::lock_guard<std::mutex> lock(history_mu_);
    s["busy_us"] = static_cast<int64_t>(executor_totals_.busy_s * 1e6);
    s["wait_us"] = static_cast<int64_t>(executor_totals_.wait_s * 1e6);
    s["pre_arrival_us"] = static_cast<int64_t>(executor_totals_.pre_arrival_s * 1e6);
    s["agreement_us"] = static_cast<int64_t>(executor_totals_.agreement_s * 1e6);
    s["streamed_bytes"] = static_cast<int64_t>(executor_totals_.bytes_streamed);
  }
  s["dynamic_straggler_calls"] = dynamic_straggler_calls_.load();
  s["dynamic_plain_calls"] = dynamic_plain_calls_.load();
  s["last_straggler"] = last_straggler_.load();
  s["rank"] = opt_.rank;
  s["size"] = opt_.size;
  if (transport_) {
    for (const auto& [name, value] : transport_->stats()) s[name] = value;
  }
  return s;
}

std::vector<CallRecord> Session::recent_calls() const {
  std::lock_guard<std::mutex> lock(history_mu_);
  return std::vector<CallRecord>(history_.begin(), history_.end());
}

}  // namespace stragg
