#include "backend/call_trace.h"

#include <sstream>
#include <utility>

namespace stragg {
namespace {

std::string ranks_text(const TraceGroup& g) {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < g.size; ++i) {
    const auto r = static_cast<size_t>(i) < g.global_ranks.size()
                       ? g.global_ranks[static_cast<size_t>(i)]
                       : static_cast<int64_t>(i);
    s << (i ? ", " : "") << r;
  }
  s << "]";
  return s.str();
}

int64_t seq_of(const CallRecord& record) { return static_cast<int64_t>(record.seq); }

}  // namespace

std::shared_ptr<ProfilerCallTrace> ProfilerCallTrace::make(c10::intrusive_ptr<StraggWork> work,
                                                           const char* title, const char* dtype,
                                                           const TraceGroup& group) {
  if (!at::hasCallbacks()) return nullptr;
  return std::make_shared<ProfilerCallTrace>(std::move(work), title, dtype, group);
}

ProfilerCallTrace::ProfilerCallTrace(c10::intrusive_ptr<StraggWork> work, const char* title,
                                     const char* dtype, const TraceGroup& group)
    : work_(std::move(work)), title_(title), dtype_(dtype), group_(group) {}

void ProfilerCallTrace::open(std::optional<at::RecordFunction>& range, const char* name,
                             const Kwargs& kwargs) {
  at::ThreadLocalStateGuard guard(state_);
  range.emplace(at::RecordScope::USER_SCOPE);
  if (!range->isActive()) {
    range.reset();
    return;
  }
  range->before(name, &kwargs);
}

void ProfilerCallTrace::close(std::optional<at::RecordFunction>& range) {
  if (!range) return;
  at::ThreadLocalStateGuard guard(state_);
  range.reset();  // ends it
}

std::unordered_map<std::string, c10::IValue> group_trace_args(const TraceGroup& group) {
  return {{"rank", static_cast<int64_t>(group.rank)},
          {"group", group.name},
          {"group_desc", group.desc},
          {"group_ranks", ranks_text(group)}};
}

void ProfilerCallTrace::queued(const CallRecord& record) {
  Kwargs kwargs = group_trace_args(group_);
  kwargs.emplace("seq", seq_of(record));
  kwargs.emplace("numel", record.numel);
  kwargs.emplace("bytes", record.bytes);
  kwargs.emplace("dtype", std::string(dtype_));
  work_->begin_profiler_range(title_, kwargs);
  work_.reset();
}

void ProfilerCallTrace::agreement_begin(const CallRecord& record) {
  open(agreement_, "stragg:agreement", Kwargs{{"seq", seq_of(record)}});
}

void ProfilerCallTrace::agreement_end(const CallRecord& record) { close(agreement_); }

void ProfilerCallTrace::run_begin(const CallRecord& record, bool pre_arrival) {
  open(run_, "stragg:run",
       Kwargs{{"seq", seq_of(record)},
              {"group", group_.name},
              {"plan", record.schedule_name},
              {"algorithm", record.algorithm},
              {"straggler", static_cast<int64_t>(record.straggler)}});
  if (!pre_arrival && record.straggler < 0) return;
  const Kwargs phase{{"seq", seq_of(record)},
                     {"straggler", static_cast<int64_t>(record.straggler)}};
  open(phase_, pre_arrival ? "stragg:pre_arrival" : "stragg:post_arrival", phase);
}

void ProfilerCallTrace::pre_arrival_end(const CallRecord& record) {
  close(phase_);
  open(phase_, "stragg:post_arrival",
       Kwargs{{"seq", seq_of(record)}, {"straggler", static_cast<int64_t>(record.straggler)}});
}

void ProfilerCallTrace::run_end(const CallRecord& record, bool ok) {
  close(phase_);
  close(run_);
}

}  // namespace stragg
