// torch.profiler ranges for stragg's all_reduce: the session's CallTracer hooks
// (session/call_tracer.h) as at::RecordFunction ranges (USER_SCOPE). Per call:
//
//   stragg:all_reduce       the call from issue to completion (the Work's range, async), opened
//                           on the calling thread; args: seq, numel, bytes, dtype, rank, group,
//                           group_desc, group_ranks (the members' global ranks)
//   (stragg:barrier         a barrier, the same way, with the group's args: stragg_backend.cc)
//   stragg:agreement        dynamic straggler only: the ranks agreeing on who is late
//   stragg:run              the plan running; args: seq, group, plan, algorithm, straggler
//     stragg:pre_arrival    a call with a straggler, on a rank on time: the steps that do not
//                           involve the straggler (StragglAR's early reduce-scatter)
//     stragg:post_arrival   a call with a straggler: the rest, which begins, on a rank on time,
//                           by waiting for the straggler (args of both: seq, straggler)
//
// All but the first run on the thread that runs the call (the session's worker, or the calling
// thread for a small call run inline), under the calling thread's profiler state: torch.profiler
// records only the threads it was started on and those its state is carried to. Args (kwargs)
// appear in the Chrome trace with record_shapes=True, as torch records kwargs only then.
// Nothing of this exists when no profiler callback is installed: make() returns null.
#pragma once

#include <ATen/ThreadLocalState.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/stragg_work.h"
#include "session/call_tracer.h"

namespace stragg {

// What the call's range says about its group.
struct TraceGroup {
  int rank = 0;
  int size = 1;
  std::string name;                   // torch's group name ("0", ...)
  std::string desc;                   // torch's group description ("default_pg", ...)
  std::vector<int64_t> global_ranks;  // empty: 0..size-1
};

// The args every stragg range of a collective carries about its group: rank, group,
// group_desc, group_ranks (the members' global ranks, "[0, 1, 2, 3]").
std::unordered_map<std::string, c10::IValue> group_trace_args(const TraceGroup& group);

class ProfilerCallTrace final : public CallTracer {
 public:
  // A tracer for one call of `work` named `title` ("stragg:all_reduce"), or null when no profiler
  // callback is installed on this thread (at::hasCallbacks(): a plain call pays nothing more).
  static std::shared_ptr<ProfilerCallTrace> make(c10::intrusive_ptr<StraggWork> work,
                                                 const char* title, const char* dtype,
                                                 const TraceGroup& group);

  ProfilerCallTrace(c10::intrusive_ptr<StraggWork> work, const char* title, const char* dtype,
                    const TraceGroup& group);

  void queued(const CallRecord& record) override;
  void agreement_begin(const CallRecord& record) override;
  void agreement_end(const CallRecord& record) override;
  void run_begin(const CallRecord& record, bool pre_arrival) override;
  void pre_arrival_end(const CallRecord& record) override;
  void run_end(const CallRecord& record, bool ok) override;

 private:
  using Kwargs = std::unordered_map<std::string, c10::IValue>;
  // Opens `range` as `name` with `kwargs`, under the calling thread's profiler state.
  void open(std::optional<at::RecordFunction>& range, const char* name, const Kwargs& kwargs);
  void close(std::optional<at::RecordFunction>& range);

  c10::intrusive_ptr<StraggWork> work_;  // released once its range is open
  const char* title_;
  const char* dtype_;
  TraceGroup group_;
  at::ThreadLocalState state_;  // the calling thread's: its profiler and callbacks
  std::optional<at::RecordFunction> agreement_, run_, phase_;
};

}  // namespace stragg
