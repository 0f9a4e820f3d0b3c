#include "session/session.h"

#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "plan/wait_or_proceed.h"
#include "runtime/reduce.h"
#include "session/group_setup.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

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
  executor_->run(*small_allreduce_plan(opt_.rank, opt_.size, rows.size()),
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
    // The configured or profiled straggler (the dynamic one is agreed on CPU arrivals, which say
    // nothing about a GPU call).
    const int straggler = planner_->profiled() ? profiler_->straggler()
                          : planner_->dynamic() ? -1
                                                : planner_->straggler().rank;
    const double delay = planner_->profiled() ? profiler_->straggler_delay_s() : 0.0;
    choice = planner_->choose(call.numel * dtype_size(call.dtype), straggler, delay,
                              /*host=*/false);
    chosen = &choice;
  }
  call.run(chosen, seq);
}

void Session::run_call(AllreduceCall& call, CallRecord& record) {
  record.algorithm = path_ == AllreducePath::Delegate ? "gloo" : "local";
  record.plan = record.algorithm;
  if (call.premul && call.numel > 0) {
    scale_inplace(call.dtype, call.data, call.numel, call.premul_factor);
  }
  if (path_ == AllreducePath::Executor) {
    run_on_executor(call, record);
  } else if (path_ == AllreducePath::Delegate) {
    call.delegate();
  }
  if (call.average && call.numel > 0) {
    divide_inplace(call.dtype, call.data, call.numel, opt_.size);
  }
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

int Session::call_straggler(const CollectiveSpec& spec, size_t bytes, AllreduceCall& call,
                            CallRecord& record) {
  if (planner_->dynamic()) {
    const auto window = dynamic_window_for(bytes);
    record.window_s = std::chrono::duration<double>(window).count();
    // The board numbers agreements 0, 1, 2, ... (internal collectives take no ticket).
    const int s =
        executor_->agree_on_straggler(spec, window, call.timeout, store_board_.get(), agreements_++);
    (s >= 0 ? dynamic_straggler_calls_ : dynamic_plain_calls_).fetch_add(1);
    last_straggler_.store(s);
    return s;
  }
  if (planner_->profiled()) return profiler_->straggler();
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

void Session::run_on_executor(AllreduceCall& call, CallRecord& record) {
  current_call_ = static_cast<int64_t>(record.seq);
  CollectiveSpec spec = next_spec(call.name, call.dtype, call.numel, /*internal=*/false);
  spec.op = call.op;
  record.wire_seq = spec.seq;
  const size_t elem = dtype_size(call.dtype);
  const ExecutorStats before = executor_->stats();
  const int straggler = call_straggler(spec, call.numel * elem, call, record);
  // How late the call's straggler is expected (the cost model weighs it against degraded links).
  const double delay = planner_->dynamic()    ? record.window_s
                       : planner_->profiled() ? profiler_->straggler_delay_s()
                                              : 0.0;
  const PlanChoice choice = planner_->choose(call.numel * elem, straggler, delay);
  const bool oneshot = oneshot_fits(choice, call.numel * elem);
  std::shared_ptr<const RankPlan> plan;
  if (oneshot) {
    record.algorithm = record.plan = "oneshot";
    record.straggler = -1;
    record.predicted_s = planner_->predict_oneshot(call.numel * elem);
  } else {
    record.algorithm = stragg::algorithm_name(choice.algorithm);
    if (!(choice == last_choice_) || last_plan_.empty()) {  // describe() formats: once per choice
      last_choice_ = choice;
      last_plan_ = choice.describe();
    }
    record.plan = last_plan_;
    record.straggler = choice.straggler;
    record.predicted_s = choice.predicted_s;
    plan = planner_->plan(opt_.rank, choice, call.numel, elem, transport_->supports_recv_limit());
  }
  const auto run_start = Clock::now();
  try {
    if (oneshot) {
      executor_->run_oneshot(spec, call.data, oneshot_calls_++, call.timeout);
    } else {
      executor_->run(*plan, spec, call.data, call.timeout);
    }
  } catch (...) {
    record.run_s = seconds_since(run_start);
    throw;
  }
  record.run_s = seconds_since(run_start);
  const ExecutorStats& after = executor_->stats();
  record.agreement_s = after.agreement_s - before.agreement_s;
  record.wait_s = after.wait_s - before.wait_s;
  record.pre_arrival_s = after.pre_arrival_s - before.pre_arrival_s;
}

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
      << record.plan << " straggler " << record.straggler << ": queued "
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

void Session::run_barrier(std::chrono::milliseconds timeout) {
  if (path_ != AllreducePath::Executor) return;  // one rank: nobody to wait for
  // No rank finishes an all_reduce before every rank has contributed to it: a one-element one
  // is a barrier (recursive doubling: log2(n) rounds of pairwise exchanges).
  int32_t token = 0;
  CollectiveSpec spec = next_spec("barrier", DType::Int32, 1, /*internal=*/true);
  spec.between_calls = true;
  executor_->run(*small_allreduce_plan(opt_.rank, opt_.size, 1), spec, &token, timeout);
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

std::chrono::microseconds Session::dynamic_window_for(size_t bytes) const {
  if (opt_.settings.dynamic_window_us >= 0) {
    return std::chrono::microseconds(opt_.settings.dynamic_window_us);
  }
  const LinkModel link = link_model(nullptr);
  const std::vector<double> delays = profiler_ ? profiler_->recent_delays() : std::vector<double>{};
  const double w = wait_or_proceed_window_s(opt_.size, static_cast<double>(bytes), link, delays);
  return std::chrono::microseconds(static_cast<int64_t>(w * 1e6));
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
