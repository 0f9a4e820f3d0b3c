// What one all_reduce tells whoever traces it, as it happens (no torch here): the torch adapter
// turns it into torch.profiler ranges (backend/call_trace.h). A call without a tracer
// (AllreduceCall::tracer null, the case whenever no profiler runs) pays one null check per hook.
#pragma once

#include "session/call_record.h"

namespace stragg {

// Each hook is called at most once per call, in this order; the record holds what is known at
// that point. queued() runs on the submitting thread; the others on the thread that runs the
// call (the session's worker, or the submitting thread for a small call run inline), none of
// them after the call's `done`.
class CallTracer {
 public:
  virtual ~CallTracer() = default;
  // The call has its sequence number (record: seq, numel, bytes) and is about to run or be
  // queued.
  virtual void queued(const CallRecord& record) = 0;
  // Dynamic straggler: the ranks agree on who is late (the wait-or-proceed window). Only when
  // the group runs dynamic mode; agreement_end also when the agreement failed.
  virtual void agreement_begin(const CallRecord& record) = 0;
  virtual void agreement_end(const CallRecord& record) = 0;
  // The plan is decided (record: algorithm, schedule_name, straggler) and starts running.
  // `pre_arrival`: this rank's plan has pre-arrival steps (StragglAR on a rank on time).
  virtual void run_begin(const CallRecord& record, bool pre_arrival) = 0;
  // This rank's last pre-arrival step completed: every later step involves the straggler.
  virtual void pre_arrival_end(const CallRecord& record) = 0;
  // The plan finished running (ok) or failed.
  virtual void run_end(const CallRecord& record, bool ok) = 0;
};

}  // namespace stragg
