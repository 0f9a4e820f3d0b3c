// Session (session.h): how calls reach the worker and run there. Submission queues a call
// behind the ones before it, or runs a small one on the caller's thread when nothing is queued
// (the inline fast path); the worker then runs it on the executor (or delegates it), and runs
// external calls, barriers and link probes in the same order.
#include "session/session.h"

#include "common/error.h"
#include "runtime/reduce.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// Queues `job` as call number next_seq_ (the caller holds submit_mu_); its cancellation tells
// `done` why it did not run. Throws if the session no longer takes calls.
uint64_t Session::enqueue(SerialWorker::Job job, const char* name,
                          std::function<void(std::exception_ptr)> done) {
  const uint64_t seq = next_seq_;
  job.cancel = [this, name, seq, done](const std::string& why) {
    failed_calls_.fetch_add(1);
    done(std::make_exception_ptr(Error("stragg: rank " + std::to_string(opt_.rank) + ": " + name +
                                       " #" + std::to_string(seq) + " did not run: " + why)));
  };
  if (!worker_->submit(std::move(job))) {
    refuse(name, stop_reason_);
  }
  ++next_seq_;
  return seq;
}

uint64_t Session::submit(AllreduceCall call) {
  if (auto why = failure()) {
    refuse(call.name, *why);
  }
  std::unique_lock<std::mutex> lock(submit_mu_);
  const int64_t bytes = static_cast<int64_t>(call.numel * dtype_size(call.dtype));
  if (static_cast<size_t>(bytes) <= opt_.settings.inline_bytes && worker_->claim_inline()) {
    // A small call and nothing queued or running: it runs here, now, and is complete when
    // submit returns (no hand-off to the worker and back, which costs as much as the call).
    // Large calls keep running behind the caller's back (DDP overlaps them with backward). The
    // claim keeps later submissions behind this one; the lock is released first, since the
    // call may abort the session (which takes it). The call and its record live on this stack
    // and the job's closures hold one pointer each (std::function stores them in place): no
    // allocation for the hand-over.
    CallRecord record;
    record.seq = next_seq_++;
    record.numel = static_cast<int64_t>(call.numel);
    record.bytes = bytes;
    lock.unlock();
    if (call.tracer) call.tracer->queued(record);
    struct Inline {
      Session* session;
      AllreduceCall* call;
      CallRecord* record;
    } here{this, &call, &record};
    SerialWorker::Job job;
    job.run = [h = &here] { h->session->run_call(*h->call, *h->record); };
    job.finish = [h = &here](std::exception_ptr error) {
      h->session->finish_call(*h->call, *h->record, error);
    };
    const uint64_t seq = record.seq;
    worker_->run_claimed(job);
    return seq;
  }
  const auto enqueued = Clock::now();
  auto shared = std::make_shared<AllreduceCall>(std::move(call));
  auto record = std::make_shared<CallRecord>();
  record->seq = next_seq_;
  record->numel = static_cast<int64_t>(shared->numel);
  record->bytes = bytes;
  if (shared->tracer) shared->tracer->queued(*record);
  SerialWorker::Job job;
  job.run = [this, shared, record, enqueued] {
    record->queued_s = seconds_since(enqueued);
    run_call(*shared, *record);
  };
  job.finish = [this, shared, record](std::exception_ptr error) {
    finish_call(*shared, *record, error);
  };
  return enqueue(std::move(job), shared->name, [shared](std::exception_ptr e) { shared->done(e); });
}

uint64_t Session::submit_external(ExternalCall call) {
  if (auto why = failure()) {
    refuse(call.name, *why);
  }
  std::lock_guard<std::mutex> lock(submit_mu_);
  auto shared = std::make_shared<ExternalCall>(std::move(call));
  const uint64_t seq = next_seq_;
  SerialWorker::Job job;
  job.run = [this, shared, seq] { run_external(*shared, seq); };
  job.finish = [this, shared](std::exception_ptr error) {
    if (error) failed_calls_.fetch_add(1);
    shared->done(error);
  };
  return enqueue(std::move(job), shared->name, [shared](std::exception_ptr e) { shared->done(e); });
}

void Session::measure_links(std::function<void(std::exception_ptr)> done) {
  if (path_ == AllreducePath::Delegate) {
    throw Error("stragg: rank " + std::to_string(opt_.rank) +
                ": link probes need stragg's executor; this group delegates all_reduce to Gloo");
  }
  std::lock_guard<std::mutex> lock(submit_mu_);
  auto shared_done = std::make_shared<std::function<void(std::exception_ptr)>>(std::move(done));
  SerialWorker::Job job;
  job.run = [this] {
    if (!executor_) return;  // a single rank: no links
    const InternalSpec internal = [this](const char* name, DType dtype, size_t numel) {
      return next_spec(name, dtype, numel, /*internal=*/true);
    };
    profiler_->probe_links(*executor_, internal, opt_.timeout);
  };
  job.finish = [shared_done](std::exception_ptr error) { (*shared_done)(error); };
  job.cancel = [this, shared_done](const std::string& why) {
    (*shared_done)(std::make_exception_ptr(
        Error("stragg: rank " + std::to_string(opt_.rank) + ": link probe did not run: " + why)));
  };
  if (!worker_->submit(std::move(job))) {
    refuse("link probe", stop_reason_);
  }
}

void Session::barrier(std::chrono::milliseconds timeout,
                      std::function<void(std::exception_ptr)> done) {
  if (path_ == AllreducePath::Delegate) {
    throw Error(prefix() + ": barrier needs stragg's executor; this group delegates to Gloo");
  }
  if (auto why = failure()) {
    refuse("barrier", *why);
  }
  std::unique_lock<std::mutex> lock(submit_mu_);
  auto shared_done = std::make_shared<std::function<void(std::exception_ptr)>>(std::move(done));
  SerialWorker::Job job;
  job.run = [this, timeout] { run_barrier(timeout); };
  job.finish = [this, shared_done](std::exception_ptr error) {
    (error ? failed_calls_ : barrier_calls_).fetch_add(1);
    (*shared_done)(error);
  };
  job.cancel = [this, shared_done](const std::string& why) {
    failed_calls_.fetch_add(1);
    (*shared_done)(std::make_exception_ptr(
        Error("stragg: rank " + std::to_string(opt_.rank) + ": barrier did not run: " + why)));
  };
  // Nothing queued or running: no hand-off (see submit; STRAGG_INLINE_BYTES=0 turns it off).
  if (opt_.settings.inline_bytes >= sizeof(int32_t) && worker_->claim_inline()) {
    lock.unlock();
    worker_->run_claimed(job);
    return;
  }
  if (!worker_->submit(std::move(job))) {
    refuse("barrier", stop_reason_);
  }
}

void Session::run_call(AllreduceCall& call, CallRecord& record) {
  record.algorithm = path_ == AllreducePath::Delegate ? "gloo" : "local";
  record.schedule_name = record.algorithm;
  if (call.premul && call.numel > 0) {
    scale_inplace(call.dtype, call.data, call.numel, call.premul_factor);
  }
  if (path_ == AllreducePath::Executor) {
    run_on_executor(call, record);
  } else {
    // One rank or delegated: nothing to decide, no phases.
    if (call.tracer) call.tracer->run_begin(record, /*pre_arrival=*/false);
    try {
      if (path_ == AllreducePath::Delegate) call.delegate();
    } catch (...) {
      if (call.tracer) call.tracer->run_end(record, /*ok=*/false);
      throw;
    }
    if (call.tracer) call.tracer->run_end(record, /*ok=*/true);
  }
  if (call.average && call.numel > 0) {
    divide_inplace(call.dtype, call.data, call.numel, opt_.size);
  }
}

void Session::run_on_executor(AllreduceCall& call, CallRecord& record) {
  current_call_ = static_cast<int64_t>(record.seq);
  CollectiveSpec spec = next_spec(call.name, call.dtype, call.numel, /*internal=*/false);
  spec.op = call.op;
  record.wire_seq = spec.seq;
  const ExecutorStats before = executor_->stats();
  const CallDecision decision = decide_call(spec, call, record);
  // Traced: the executor says when this rank's pre-arrival steps are done (PhaseHook).
  CallTracer* tracer = call.tracer.get();
  struct PhaseHook final : RunObserver {
    CallTracer* tracer;
    const CallRecord* record;
    PhaseHook(CallTracer* t, const CallRecord* r) : tracer(t), record(r) {}
    void pre_arrival_done() override { tracer->pre_arrival_end(*record); }
  } hook(tracer, &record);
  if (tracer) {
    bool pre_arrival = false;
    if (decision.schedule) {
      for (const auto& step : decision.schedule->steps) pre_arrival |= step.pre_arrival;
    }
    tracer->run_begin(record, pre_arrival);
  }
  const auto run_start = Clock::now();
  try {
    if (decision.oneshot) {
      executor_->run_oneshot(spec, call.data, oneshot_calls_++, call.timeout);
    } else {
      executor_->run(*decision.schedule, spec, call.data, call.timeout,
                     tracer ? &hook : nullptr);
    }
  } catch (...) {
    record.run_s = seconds_since(run_start);
    if (tracer) tracer->run_end(record, /*ok=*/false);
    throw;
  }
  record.run_end = Clock::now();
  record.run_s = std::chrono::duration<double>(record.run_end - run_start).count();
  if (tracer) tracer->run_end(record, /*ok=*/true);
  const ExecutorStats& after = executor_->stats();
  record.agreement_s = after.agreement_s - before.agreement_s;
  record.wait_s = after.wait_s - before.wait_s;
  record.pre_arrival_s = after.pre_arrival_s - before.pre_arrival_s;
}

// Every rank learns every rank's (numel, dtype, op) of the call: an all-gather (a sum of rows,
// each rank filling its own) over the CPU transport, so a mismatch raises on every rank alike,
// naming the ranks and values, and aborts the group like any collective mismatch.
void Session::check_external_header(const ExternalCall& call, uint64_t seq) {
  const size_t n = static_cast<size_t>(opt_.size), me = static_cast<size_t>(opt_.rank);
  std::vector<int64_t> rows(n * 3, 0);
  rows[me * 3] = static_cast<int64_t>(call.numel);
  rows[me * 3 + 1] = static_cast<int64_t>(call.dtype);
  rows[me * 3 + 2] = static_cast<int64_t>(call.op);
  current_call_ = static_cast<int64_t>(seq);
  executor_->run(*small_allreduce_schedule(opt_.rank, opt_.size, rows.size()),
                 next_spec("header exchange", DType::Int64, rows.size(), /*internal=*/true),
                 rows.data(), call.timeout);
  for (size_t q = 0; q < n; ++q) {
    const int64_t* a = &rows[std::min(q, me) * 3];
    const int64_t* b = &rows[std::max(q, me) * 3];
    std::vector<std::string> diffs;
    auto field = [&](const char* name, const std::string& x, const std::string& y) {
      if (x != y) {
        diffs.push_back(std::string(name) + " " + x + " (rank " + std::to_string(std::min(q, me)) +
                        ") vs " + y + " (rank " + std::to_string(std::max(q, me)) + ")");
      }
    };
    auto dt = [](int64_t v) { return std::string(dtype_name(static_cast<DType>(v))); };
    auto op = [](int64_t v) { return std::string(reduce_op_name(static_cast<ReduceOp>(v))); };
    field("numel", std::to_string(a[0]), std::to_string(b[0]));
    field("dtype", dt(a[1]), dt(b[1]));
    field("op", op(a[2]), op(b[2]));
    if (diffs.empty()) continue;
    std::string m = "stragg: rank " + std::to_string(me) + ": " + call.name + " #" +
                    std::to_string(seq) + " (gpu) mismatch with rank " + std::to_string(q) + ": ";
    for (size_t i = 0; i < diffs.size(); ++i) m += (i ? "; " : "") + diffs[i];
    transport_->signal_abort(m);
    throw Error(m);
  }
}

void Session::run_external(ExternalCall& call, uint64_t seq) {
  PlanChoice choice;
  const PlanChoice* chosen = nullptr;
  if (path_ == AllreducePath::Executor) {
    check_external_header(call, seq);
    choice = decide_external(call);
    chosen = &choice;
  }
  call.run(chosen, seq);
}

void Session::run_barrier(std::chrono::milliseconds timeout) {
  if (path_ != AllreducePath::Executor) return;  // one rank: nobody to wait for
  // No rank finishes an all_reduce before every rank has contributed to it: a one-element one
  // is a barrier (recursive doubling: log2(n) rounds of pairwise exchanges).
  int32_t token = 0;
  CollectiveSpec spec = next_spec("barrier", DType::Int32, 1, /*internal=*/true);
  spec.between_calls = true;
  executor_->run(*small_allreduce_schedule(opt_.rank, opt_.size, 1), spec, &token, timeout);
}

CollectiveSpec Session::next_spec(const char* name, DType dtype, size_t numel, bool internal) {
  CollectiveSpec spec;
  spec.op_name = name;
  spec.seq = wire_seq_++;
  spec.call = current_call_;
  spec.internal = internal;
  spec.dtype = dtype;
  spec.op = ReduceOp::Sum;
  spec.numel = numel;
  return spec;
}

}  // namespace stragg
