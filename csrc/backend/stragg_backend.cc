#include "backend/stragg_backend.h"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include <sstream>

#ifdef STRAGG_BACKEND_CUDA
#include "backend/cuda_allreduce.h"
#endif
#include "backend/store_arrival_board.h"
#include "backend/store_rendezvous.h"
#include "core/closed_forms.h"
#include "runtime/error.h"
#include "runtime/host_identity.h"
#include "runtime/reduce.h"
#include "runtime/ring_plan.h"

namespace stragg {
namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Errors from the runtime reach Python as torch.distributed.DistBackendError (a RuntimeError).
std::exception_ptr as_dist_error(const std::exception& e) {
  try {
    C10_THROW_ERROR(DistBackendError, e.what());
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

StraggBackend::StraggBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             std::chrono::milliseconds timeout, std::string group_name,
                             BackendConfig config)
    : c10d::Backend(rank, size),
      group_name_(std::move(group_name)),
      timeout_(timeout),
      config_(config),
      profiler_settings_(config.profiler) {
  link_model_.alpha_s = config.planner.alpha_s;
  link_model_.beta_s_per_byte = config.planner.beta_s_per_byte;
  const std::string& mode = config.transport;
  TORCH_CHECK(mode == "auto" || mode == "shm" || mode == "tcp" || mode == "gloo", "stragg: rank ",
              rank, ": unknown STRAGG_TRANSPORT '", mode, "' (expected auto, shm, tcp or gloo)");
#ifdef STRAGG_BACKEND_CUDA
  const std::string cuda_mode = resolve_cuda_allreduce_mode(config.cuda_allreduce, rank);
#endif
  if (size > 1) {
    StoreRendezvous rdv(store);
    // This rank's TCP address, worked out before the exchange so that every rank decides the
    // transport from the same information ("-" when unknown).
    std::string tcp_address = config.tcp.advertise_host;
    if (tcp_address.empty() && !config.tcp_store_host.empty()) {
      try {
        tcp_address = local_address_toward(config.tcp_store_host);
      } catch (const Error& e) {
        LOG(WARNING) << e.what();
      }
    }
    if (tcp_address.empty()) tcp_address = "-";
    std::vector<std::string> hello;
    try {
      std::string algo = config.planner.algo + " straggler=" +
                         std::to_string(config.planner.straggler);
#ifdef STRAGG_BACKEND_CUDA
      algo += " STRAGG_CUDA_ALLREDUCE=" + cuda_mode;  // must be equal on all ranks too
#endif
      hello = exchange_all(rdv, "hello", rank, size,
                           host_identity() + "\n" + mode + "\n" + tcp_address + "\n" + algo,
                           timeout, "process group setup");
    } catch (const Error& e) {
      C10_THROW_ERROR(DistBackendError, e.what());
    }
    bool same_host = true;
    bool all_have_tcp_address = true;
    std::string first_host;
    for (int r = 0; r < size; ++r) {
      auto f = split_lines(hello[r]);
      TORCH_CHECK(f.size() == 4, "stragg: rank ", rank, ": bad setup record from rank ", r);
      const std::string mine = split_lines(hello[rank])[3];
      TORCH_CHECK(f[3] == mine, "stragg: rank ", rank, ": STRAGG_ALGO/STRAGG_STRAGGLER mismatch: rank ",
                  r, " uses '", f[3], "', rank ", rank, " uses '", mine, "'");
      if (r == 0) first_host = f[0];
      if (f[0] != first_host) same_host = false;
      if (f[2] == "-") all_have_tcp_address = false;
      TORCH_CHECK(f[1] == mode, "stragg: rank ", rank, ": STRAGG_TRANSPORT mismatch: rank ", r,
                  " uses '", f[1], "', rank ", rank, " uses '", mode, "'");
    }
    // auto: shared memory on one host; TCP across hosts when every rank knows its address;
    // otherwise all_reduce falls back to the inner Gloo backend.
    std::string chosen = mode;
    if (mode == "auto") chosen = same_host ? "shm" : (all_have_tcp_address ? "tcp" : "gloo");
    same_host_ = same_host;
    TORCH_CHECK(chosen != "shm" || same_host, "stragg: rank ", rank,
                ": STRAGG_TRANSPORT=shm but the ranks are not on one host (different host, boot "
                "or network namespace)");
    TORCH_CHECK(chosen != "tcp" || all_have_tcp_address, "stragg: rank ", rank,
                ": STRAGG_TRANSPORT=tcp needs every rank's address: set STRAGG_TCP_HOST (or use "
                "a TCPStore / MASTER_ADDR, whose route picks it)");
    try {
      if (chosen == "shm") {
        config.shm.setup_timeout = timeout;
        transport_ = std::make_unique<ShmTransport>(rdv, "shm", rank, size, config.shm);
      } else if (chosen == "tcp") {
        config.tcp.setup_timeout = timeout;
        config.tcp.advertise_host = tcp_address;
        transport_ = std::make_unique<TcpTransport>(rdv, "tcp", rank, size, config.tcp);
      }
    } catch (const Error& e) {
      C10_THROW_ERROR(DistBackendError, e.what());
    }
    if (transport_) {
      path_ = AllreducePath::Executor;
      try {
        planner_ = std::make_unique<Planner>(size, config.planner);
      } catch (const Error& e) {
        C10_THROW_ERROR(ValueError, e.what());
      }
      for (const auto& note : planner_->notes()) {
        LOG(INFO) << "stragg: rank " << rank << " of group '" << group_name_ << "': " << note;
      }
      if (planner_->dynamic() && transport_->arrival_board() == nullptr) {
        // No shared-memory board (TCP across hosts): arrival tickets go through the store.
        store_board_ = std::make_unique<StoreArrivalBoard>(
            c10::make_intrusive<c10d::PrefixStore>("arrivals/", store), rank, size);
      }
      dynamic_window_ = config.dynamic_window;
      log_calls_ = config.log_calls;
      executor_ = std::make_unique<Executor>(*transport_);
      if (profiler_settings_.enabled) {
        try {
          profiler_ = std::make_unique<StragglerProfiler>(size, profiler_settings_);
        } catch (const Error& e) {
          C10_THROW_ERROR(ValueError, e.what());
        }
      }
    } else {
      path_ = AllreducePath::Delegate;
    }
  }
#ifdef STRAGG_BACKEND_CUDA
  if (cuda_mode == "stragg") {
    CudaAllreduceConfig cuda;
    cuda.planner = config.planner;
    cuda.same_host = same_host_;
    cuda.timeout = timeout;
    cuda_allreduce_ = std::make_unique<CudaAllreduce>(store, rank, size, cuda);
  }
#endif
  LOG(INFO) << "stragg: rank " << rank << " of group '" << group_name_ << "' (size " << size
            << "): all_reduce via " << transport_name() << ", algorithm " << algorithm();
  worker_ = std::thread([this] { worker_loop(); });
}

StraggBackend::~StraggBackend() { stop_worker("the process group was destroyed"); }

void StraggBackend::attach_inner(const std::string& device,
                                 c10::intrusive_ptr<c10d::Backend> inner) {
  if (device == "cpu") {
    cpu_inner_ = std::move(inner);
  } else if (device == "cuda") {
    cuda_inner_ = std::move(inner);
  } else {
    TORCH_CHECK(false, "stragg: unknown inner backend device '", device, "'");
  }
}

std::string StraggBackend::transport_name() const {
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

std::string StraggBackend::algorithm() const {
  if (path_ == AllreducePath::Delegate) return "gloo";
  return planner_ ? planner_->algorithm() : "local";
}

int StraggBackend::straggler() const { return planner_ ? planner_->straggler() : -1; }

std::map<std::string, int64_t> StraggBackend::stats() const {
  std::map<std::string, int64_t> s;
  s["allreduce_calls"] = allreduce_calls_.load();
  s["allreduce_bytes"] = allreduce_bytes_.load();
  s["delegated_calls"] = delegated_calls_.load();
  s["failed_calls"] = failed_calls_.load();
  {
    std::lock_guard<std::mutex> lock(history_mu_);
    s["busy_us"] = static_cast<int64_t>(executor_totals_.busy_s * 1e6);
    s["wait_us"] = static_cast<int64_t>(executor_totals_.wait_s * 1e6);
    s["pre_arrival_us"] = static_cast<int64_t>(executor_totals_.pre_arrival_s * 1e6);
    s["agreement_us"] = static_cast<int64_t>(executor_totals_.agreement_s * 1e6);
  }
  s["dynamic_straggler_calls"] = dynamic_straggler_calls_.load();
  s["dynamic_plain_calls"] = dynamic_plain_calls_.load();
  s["last_straggler"] = last_straggler_.load();
  s["rank"] = getRank();
  s["size"] = getSize();
#ifdef STRAGG_BACKEND_CUDA
  if (cuda_allreduce_) {
    for (const auto& kv : cuda_allreduce_->stats()) s[kv.first] = kv.second;
  }
#endif
  if (auto* shm = dynamic_cast<ShmTransport*>(transport_.get())) {
    s["shm_slot_bytes"] = static_cast<int64_t>(shm->options().slot_bytes);
    s["shm_slots"] = static_cast<int64_t>(shm->options().num_slots);
  }
  if (auto* tcp = dynamic_cast<TcpTransport*>(transport_.get())) {
    s["tcp_staging_bytes"] = static_cast<int64_t>(tcp->options().staging_bytes);
  }
  return s;
}

std::chrono::milliseconds StraggBackend::effective_timeout(
    std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? timeout_ : requested;
}

c10d::Backend& StraggBackend::inner_for(c10::DeviceType type, const char* op) {
  auto& inner = type == c10::DeviceType::CUDA ? cuda_inner_ : cpu_inner_;
  TORCH_CHECK(inner, "stragg: rank ", getRank(), ": ", op, " on ", c10::DeviceTypeName(type),
              " tensors needs an inner ", type == c10::DeviceType::CUDA ? "NCCL" : "Gloo",
              " backend, which is not available (torch build without it, or no device visible)");
  delegated_calls_.fetch_add(1);
  return *inner;
}

c10d::Backend& StraggBackend::inner_for(const std::vector<at::Tensor>& tensors, const char* op) {
  return inner_for(tensors.empty() ? c10::DeviceType::CPU : tensors[0].device().type(), op);
}

// ---------------------------------------------------------------------------------------------
// all_reduce on stragg's executor

c10::intrusive_ptr<c10d::Work> StraggBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "stragg: rank ", getRank(),
              ": all_reduce takes exactly one tensor per process, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  if (t.is_sparse()) return inner_for(tensors, "sparse all_reduce").allreduce(tensors, opts);
#ifdef STRAGG_BACKEND_CUDA
  if (t.is_cuda() && cuda_allreduce_) {
    return cuda_allreduce_->allreduce(t, opts.reduceOp, effective_timeout(opts.timeout));
  }
#endif
  if (!t.device().is_cpu()) return inner_for(tensors, "all_reduce").allreduce(tensors, opts);
  at::Tensor view = t;
  if (t.is_complex()) {
    TORCH_CHECK(opts.reduceOp.op_ == c10d::ReduceOp::SUM ||
                    opts.reduceOp.op_ == c10d::ReduceOp::AVG ||
                    opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM,
                "stragg: rank ", getRank(), ": all_reduce: ReduceOp.",
                c10d_reduce_op_name(opts.reduceOp), " is not defined for complex tensors");
    view = at::view_as_real(t.is_contiguous() ? t : t.contiguous());
  }
  auto dtype = to_runtime_dtype(view.scalar_type());
  TORCH_CHECK(dtype.has_value(), "stragg: rank ", getRank(), ": all_reduce: dtype ",
              view.scalar_type(), " is not supported");
  Task task;
  task.dtype = *dtype;
  task.op = lower_reduce_op(opts.reduceOp, *dtype, getRank());
  task.user = {t};
  task.buffer = view.is_contiguous() ? view : view.contiguous();
  task.copy_back = !(t.is_contiguous() && !t.is_complex());
  task.timeout = effective_timeout(opts.timeout);
  task.work = c10::make_intrusive<StraggWork>(getRank(), c10d::OpType::ALLREDUCE,
                                              "stragg:all_reduce", task.user);
  return enqueue(std::move(task));
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "stragg: rank ", getRank(),
              ": all_reduce_coalesced needs at least one tensor");
  bool all_cpu_dense = true;
  for (const auto& t : tensors) {
    all_cpu_dense = all_cpu_dense && t.device().is_cpu() && !t.is_sparse() && !t.is_complex();
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "stragg: rank ", getRank(),
                ": all_reduce_coalesced needs tensors of one dtype, got ", tensors[0].scalar_type(),
                " and ", t.scalar_type());
  }
  if (!all_cpu_dense) {
    return inner_for(tensors, "all_reduce_coalesced").allreduce_coalesced(tensors, opts);
  }
  auto dtype = to_runtime_dtype(tensors[0].scalar_type());
  TORCH_CHECK(dtype.has_value(), "stragg: rank ", getRank(), ": all_reduce_coalesced: dtype ",
              tensors[0].scalar_type(), " is not supported");
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  Task task;
  task.dtype = *dtype;
  task.op = lower_reduce_op(opts.reduceOp, *dtype, getRank());
  task.user = tensors;
  task.buffer = at::cat(flat);
  task.copy_back = true;
  task.timeout = effective_timeout(opts.timeout);
  task.name = "all_reduce_coalesced";
  task.work = c10::make_intrusive<StraggWork>(getRank(), c10d::OpType::ALLREDUCE_COALESCED,
                                              "stragg:all_reduce_coalesced", task.user);
  return enqueue(std::move(task));
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return inner_for(tensors, "sparse all_reduce").allreduce_sparse(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::enqueue(Task task) {
  auto work = task.work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(!stopping_, "stragg: rank ", getRank(), ": ", task.name,
                " on a process group that was shut down");
    task.seq = next_seq_++;
    task.enqueued = std::chrono::steady_clock::now();
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return work;
}

void StraggBackend::worker_loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    running_task_.store(true);
    if (task.kind == TaskKind::LinkProbe) {
      try {
        run_link_probe(task);
      } catch (const c10::Error&) {
        error = std::current_exception();
      } catch (const std::exception& e) {
        error = as_dist_error(e);
      }
      running_task_.store(false);
      task.work->complete(error);
      continue;
    }
    CallRecord record;
    record.seq = task.seq;
    record.numel = task.buffer.numel();
    record.bytes = static_cast<int64_t>(task.buffer.nbytes());
    record.queued_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - task.enqueued).count();
    try {
      run_task(task, record);
      if (path_ != AllreducePath::Delegate) {
        allreduce_calls_.fetch_add(1);
        allreduce_bytes_.fetch_add(static_cast<int64_t>(task.buffer.nbytes()));
      }
    } catch (const c10::Error&) {
      error = std::current_exception();
    } catch (const std::exception& e) {
      error = as_dist_error(e);
    }
    running_task_.store(false);
    if (error) failed_calls_.fetch_add(1);
    record.ok = !error;
    if (log_calls_) {
      LOG(INFO) << "stragg: rank " << getRank() << " group '" << group_name_ << "' all_reduce #"
                << record.seq << " " << record.bytes << " B via " << record.algorithm
                << " straggler " << record.straggler << ": queued " << record.queued_s * 1e6
                << " us, agreement " << record.agreement_s * 1e6 << " us (window "
                << record.window_s * 1e6 << " us), run " << record.run_s * 1e6 << " us (waiting "
                << record.wait_s * 1e6 << " us, pre-arrival " << record.pre_arrival_s * 1e6
                << " us)" << (record.ok ? "" : " FAILED");
    }
    {
      std::lock_guard<std::mutex> lock(history_mu_);
      history_.push_back(record);
      if (history_.size() > kCallHistory) history_.pop_front();
      if (executor_) executor_totals_ = executor_->stats();
    }
    task.work->complete(error);
    // After completing the call, so the user does not wait for it; every rank does it after the
    // same call, so the exchange's sequence number matches everywhere.
    if (!error && executor_ && profiler_) {
      internal_running_.store(true);
      try {
        profile_call(record);
      } catch (const std::exception& e) {
        // The group is aborted by the executor on failure; the next call reports it.
        LOG(WARNING) << "stragg: rank " << getRank() << ": profiler exchange failed, profiling "
                     << "stops: " << e.what();
        std::lock_guard<std::mutex> lock(profiler_mu_);
        profiler_.reset();
        profiled_straggler_.store(-1);
      }
      internal_running_.store(false);
    }
  }
}

CollectiveSpec StraggBackend::internal_spec(const char* name, DType dtype, size_t numel) {
  CollectiveSpec spec;
  spec.op_name = name;
  spec.seq = wire_seq_++;
  spec.dtype = dtype;
  spec.op = ReduceOp::Sum;
  spec.numel = numel;
  return spec;
}

void StraggBackend::profile_call(const CallRecord& record) {
  const uint64_t call = executor_calls_++;
  if (batch_durations_.empty()) batch_first_call_ = call;
  batch_durations_.push_back(record.agreement_s + record.run_s);
  batch_bytes_.push_back(record.bytes);
  if (static_cast<int>(batch_durations_.size()) >= profiler_settings_.exchange_every) {
    profile_exchange();
  }
}

void StraggBackend::profile_exchange() {
  const int n = getSize();
  const int rank = getRank();
  const int k = static_cast<int>(batch_durations_.size());
  // All-gather through a sum: every rank fills its own row, zeros elsewhere (x + 0 is exact).
  std::vector<double> all(static_cast<size_t>(n) * k, 0.0);
  std::copy(batch_durations_.begin(), batch_durations_.end(), all.begin() + rank * k);
  CollectiveSpec spec = internal_spec("profiler exchange", DType::Float64, all.size());
  executor_->run(ring_allreduce_plan(rank, n, all.size()), spec, all.data(), timeout_);
  const std::vector<int64_t> bytes = std::move(batch_bytes_);
  batch_durations_.clear();
  batch_bytes_.clear();

  // Link probes: after the first exchange, then periodically. They run at the start of the next
  // call (run_task), not now: now the users' threads are computing (the exchange runs behind
  // their backs) and would slow the probe's messages; inside a call every rank is waiting.
  std::lock_guard<std::mutex> lock(profiler_mu_);
  if (config_.probe_every_exchanges > 0 &&
      profiler_->exchanges() % config_.probe_every_exchanges == 0) {
    probe_pending_ = true;
  }
  const bool changed = profiler_->add_batch(all, k, bytes, link_model_, batch_first_call_);
  const ProfilerSummary sum = profiler_->summary();
  // The window's delays (the dynamic mode's wait-or-proceed rule learns from them).
  const size_t w = std::min<size_t>(profiler_settings_.window, sum.recent_delays_s.size());
  recent_delays_.assign(sum.recent_delays_s.end() - w, sum.recent_delays_s.end());
  profiled_straggler_.store(profiler_->straggler());
  if (changed) {
    LOG(INFO) << "stragg: rank " << rank << " of group '" << group_name_ << "': profiler: "
              << (sum.decisions.empty() ? std::string("straggler changed")
                                        : sum.decisions.back().reason);
  }
}

std::vector<CallRecord> StraggBackend::recent_calls() const {
  std::lock_guard<std::mutex> lock(history_mu_);
  return std::vector<CallRecord>(history_.begin(), history_.end());
}

void StraggBackend::run_task(Task& task, CallRecord& record) {
  record.algorithm = path_ == AllreducePath::Delegate ? "gloo" : "local";
  void* data = task.buffer.data_ptr();
  const size_t numel = static_cast<size_t>(task.buffer.numel());
  if (task.op.premul && numel > 0) scale_inplace(task.dtype, data, numel, task.op.premul_factor);
  if (executor_) {
    if (probe_pending_) {
      probe_pending_ = false;
      probe_links();
    }
    CollectiveSpec spec;
    spec.op_name = task.name;
    spec.seq = wire_seq_++;
    spec.dtype = task.dtype;
    spec.op = task.op.op;
    spec.numel = numel;
    record.wire_seq = spec.seq;
    const size_t nbytes = numel * dtype_size(task.dtype);
    const ExecutorStats before = executor_->stats();
    int call_straggler = planner_->straggler();
    if (planner_->dynamic()) {
      const auto window = dynamic_window_for(nbytes);
      record.window_s = std::chrono::duration<double>(window).count();
      // The board numbers agreements 0, 1, 2, ... (internal collectives take no ticket).
      call_straggler = executor_->agree_on_straggler(spec, window, task.timeout,
                                                     store_board_.get(), agreements_++);
      (call_straggler >= 0 ? dynamic_straggler_calls_ : dynamic_plain_calls_).fetch_add(1);
      last_straggler_.store(call_straggler);
    } else if (planner_->profiled()) {
      call_straggler = profiled_straggler_.load();
    }
    const PlanChoice choice = planner_->choose(nbytes, call_straggler);
    record.algorithm = choice.algorithm;
    record.straggler = choice.straggler;
    const auto run_start = std::chrono::steady_clock::now();
    try {
      executor_->run(planner_->plan(getRank(), choice, numel, dtype_size(task.dtype),
                                    transport_->supports_recv_limit()),
                     spec, data, task.timeout);
    } catch (...) {
      record.run_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      throw;
    }
    const ExecutorStats& after = executor_->stats();
    record.run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    record.agreement_s = after.agreement_s - before.agreement_s;
    record.wait_s = after.wait_s - before.wait_s;
    record.pre_arrival_s = after.pre_arrival_s - before.pre_arrival_s;
  } else if (path_ == AllreducePath::Delegate) {
    // Same pipeline as the executor path (contiguous buffer, premul/average done here, issue
    // order kept by this thread); only the reduction itself runs on the inner Gloo backend.
    std::vector<at::Tensor> buffers{task.buffer};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d_reduce_op(task.op.op, task.dtype);
    opts.timeout = task.timeout;
    inner_for(c10::DeviceType::CPU, task.name).allreduce(buffers, opts)->wait();
  }
  if (task.op.average && numel > 0) divide_inplace(task.dtype, data, numel, getSize());
  if (!task.copy_back) return;
  if (task.user.size() == 1) {
    const at::Tensor& out = task.user[0];
    if (out.is_complex()) {
      out.copy_(at::view_as_complex(task.buffer));
    } else {
      out.copy_(task.buffer.view(out.sizes()));
    }
    return;
  }
  int64_t offset = 0;
  for (auto& out : task.user) {
    const int64_t n = out.numel();
    out.copy_(task.buffer.narrow(0, offset, n).view(out.sizes()));
    offset += n;
  }
}

c10::intrusive_ptr<c10d::Work> StraggBackend::measure_links() {
  TORCH_CHECK(path_ != AllreducePath::Delegate, "stragg: rank ", getRank(),
              ": link probes need stragg's executor; this group delegates all_reduce to Gloo");
  const int n = getSize();
  Task task;
  task.kind = TaskKind::LinkProbe;
  task.buffer = at::full({n, n, 2}, -1.0, at::TensorOptions().dtype(at::kDouble));
  task.user = {task.buffer};
  task.timeout = timeout_;
  task.name = "link probe";
  task.work = c10::make_intrusive<StraggWork>(getRank(), c10d::OpType::UNKNOWN,
                                              "stragg:link_probe", task.user);
  return enqueue(std::move(task));
}

void StraggBackend::run_link_probe(Task& task) {
  if (!executor_) return;  // a single rank: no links
  probe_links();
  const int n = getSize();
  std::vector<LinkModel> matrix = link_matrix();
  auto out = task.buffer.accessor<double, 3>();
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const LinkModel& l = matrix[static_cast<size_t>(i) * n + j];
      out[i][j][0] = l.alpha_s;
      out[i][j][1] = l.beta_s_per_byte;
    }
  }
}

void StraggBackend::probe_links() {
  using Clock = std::chrono::steady_clock;
  const int n = getSize();
  const int rank = getRank();
  const int m = std::max(2, config_.probe_messages);
  const size_t elems = std::max<size_t>(1, config_.probe_bytes / sizeof(float));
  constexpr int kReps = 5;
  std::vector<float> buf(2 * static_cast<size_t>(m) * elems, 1.0f);
  std::vector<LinkModel> mine(static_cast<size_t>(n));
  for (auto& l : mine) l.alpha_s = l.beta_s_per_byte = -1;
  for (int round = 0; round < probe_rounds(n); ++round) {
    const int partner = probe_partner(n, round, rank);
    std::vector<double> t_many, t_one;
    for (int rep = 0; rep < kReps; ++rep) {
      for (bool many : {true, false}) {
        const RankPlan plan = link_probe_plan(n, rank, round, m, elems, many);
        CollectiveSpec spec = internal_spec("link probe", DType::Float32, buf.size());
        const auto t0 = Clock::now();
        executor_->run(plan, spec, buf.data(), timeout_);
        const double t = std::chrono::duration<double>(Clock::now() - t0).count();
        (many ? t_many : t_one).push_back(t);
      }
    }
    if (partner < 0) continue;
    // Minimum over the repetitions: noise (scheduling, other load) only ever adds time.
    const double many = *std::min_element(t_many.begin(), t_many.end());
    const double one = *std::min_element(t_one.begin(), t_one.end());
    mine[partner] = estimate_link(many, one, m, elems * sizeof(float));
  }
  // All-gather the rows (own row filled, zeros elsewhere), then average both ends of each link.
  std::vector<double> all(static_cast<size_t>(n) * n * 2, 0.0);
  for (int j = 0; j < n; ++j) {
    all[(static_cast<size_t>(rank) * n + j) * 2] = mine[j].alpha_s;
    all[(static_cast<size_t>(rank) * n + j) * 2 + 1] = mine[j].beta_s_per_byte;
  }
  CollectiveSpec spec = internal_spec("link probe exchange", DType::Float64, all.size());
  executor_->run(ring_allreduce_plan(rank, n, all.size()), spec, all.data(), timeout_);
  std::vector<LinkModel> matrix(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      const double* a = &all[(static_cast<size_t>(i) * n + j) * 2];
      const double* b = &all[(static_cast<size_t>(j) * n + i) * 2];
      LinkModel& l = matrix[static_cast<size_t>(i) * n + j];
      if (i == j || a[0] < 0 || b[0] < 0) {
        l.alpha_s = l.beta_s_per_byte = -1;
      } else {
        l.alpha_s = 0.5 * (a[0] + b[0]);
        l.beta_s_per_byte = 0.5 * (a[1] + b[1]);
      }
    }
  }
  const LinkModel combined = combine_links(matrix, n);
  planner_->set_link_model(combined.alpha_s, combined.beta_s_per_byte);
  std::lock_guard<std::mutex> lock(profiler_mu_);
  link_model_ = combined;
  link_source_ = "measured";
  link_matrix_ = std::move(matrix);
  LOG(INFO) << "stragg: rank " << rank << " of group '" << group_name_
            << "': link probe: alpha " << combined.alpha_s * 1e6 << " us, "
            << 1e-9 / combined.beta_s_per_byte << " GB/s (median over links)";
}

ProfilerSummary StraggBackend::profiler_summary(bool* enabled) const {
  std::lock_guard<std::mutex> lock(profiler_mu_);
  if (enabled) *enabled = profiler_ != nullptr;
  if (!profiler_) {
    ProfilerSummary s{};
    s.n = getSize();
    s.straggler = -1;
    s.candidate = -1;
    s.link = link_model_;
    return s;
  }
  return profiler_->summary();
}

LinkModel StraggBackend::link_model(std::string* source) const {
  std::lock_guard<std::mutex> lock(profiler_mu_);
  if (source) *source = link_source_;
  return link_model_;
}

std::vector<LinkModel> StraggBackend::link_matrix() const {
  std::lock_guard<std::mutex> lock(profiler_mu_);
  if (!link_matrix_.empty()) return link_matrix_;
  std::vector<LinkModel> empty(static_cast<size_t>(getSize()) * getSize());
  for (auto& l : empty) l.alpha_s = l.beta_s_per_byte = -1;
  return empty;
}

std::chrono::microseconds StraggBackend::dynamic_window_for(size_t bytes) const {
  if (dynamic_window_.count() >= 0) return dynamic_window_;
  // Wait-or-proceed (AdapCC §IV-C). Waiting W for the last rank and then starting StragglAR
  // without it costs, from the (n-1)-th arrival, for a straggler delay d:
  //   d <= W: d + T_ring                  (everybody made it: plain Ring)
  //   d >  W: W + max(d - W, T_rs) + T_post
  // Without history the break-even (ski-rental) choice is W = c, StragglAR's critical delay
  // (App. B), never worse than twice the best. With the profiler's recent delays (identical on
  // every rank) W minimises the expected cost over them: the candidates are "go at once" (50 us),
  // just above each recent delay below c, and c.
  const int n = getSize();
  LinkModel link;
  std::vector<double> delays;
  {
    std::lock_guard<std::mutex> lock(profiler_mu_);
    link = link_model_;
    delays = recent_delays_;
  }
  constexpr double kMinWindow = 50e-6;
  constexpr double kAbove = 20e-6;  // margin above an observed delay
  const double b = static_cast<double>(bytes);
  namespace cf = core::closed_form;
  const double a = link.alpha_s, beta = link.beta_s_per_byte;
  const double c = n >= 3 ? cf::stragglar_critical_delay(n, b, a, beta) : 0.0;
  double best = std::max(kMinWindow, c);
  if (n >= 3 && !delays.empty()) {
    const double t_ring = cf::ring(n, b, a, beta);
    const double t_rs = cf::stragglar_reduce_scatter(n, b, a, beta);
    const double t_post = cf::stragglar_best(n, b, a, beta);
    auto expected = [&](double w) {
      double total = 0;
      for (double d : delays) {
        total += d <= w ? d + t_ring : w + std::max(d - w, t_rs) + t_post;
      }
      return total;
    };
    std::vector<double> candidates = {kMinWindow, best};
    for (double d : delays) {
      if (d + kAbove < c) candidates.push_back(d + kAbove);
    }
    std::sort(candidates.begin(), candidates.end());
    double best_cost = expected(candidates.front());
    best = candidates.front();
    for (double w : candidates) {
      const double cost = expected(w);
      if (cost < best_cost * (1 - 1e-12)) {
        best_cost = cost;
        best = w;
      }
    }
  }
  return std::chrono::microseconds(static_cast<int64_t>(best * 1e6));
}

void StraggBackend::stop_worker(const char* why) {
  std::deque<Task> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    orphans.swap(queue_);
  }
  cv_.notify_all();
  // A collective still running here will never be completed by this rank: abort it so the worker
  // (and the peers) stop waiting now instead of at the timeout.
  if (running_task_.load() && transport_) {
    transport_->signal_abort("stragg: rank " + std::to_string(getRank()) + ": " + why +
                       " while a collective was running");
  }
  for (auto& task : orphans) {
    task.work->complete(std::make_exception_ptr(std::runtime_error(
        "stragg: rank " + std::to_string(getRank()) + ": " + task.name + " #" +
        std::to_string(task.seq) + " did not run: " + why)));
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

void StraggBackend::shutdown() {
  stop_worker("the process group was shut down");
#ifdef STRAGG_BACKEND_CUDA
  if (cuda_allreduce_) cuda_allreduce_->shutdown("the process group was shut down");
#endif
  if (cpu_inner_) cpu_inner_->shutdown();
  if (cuda_inner_) cuda_inner_->shutdown();
}

void StraggBackend::abort() {
  if (transport_) {
    transport_->signal_abort("stragg: rank " + std::to_string(getRank()) +
                             " aborted the process group");
  }
  stop_worker("the process group was aborted");
#ifdef STRAGG_BACKEND_CUDA
  if (cuda_allreduce_) cuda_allreduce_->abort("the process group was aborted");
#endif
  if (cpu_inner_) cpu_inner_->abort();
  if (cuda_inner_) cuda_inner_->abort();
}

// ---------------------------------------------------------------------------------------------
// Delegated collectives

c10::intrusive_ptr<c10d::Work> StraggBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  return inner_for(tensors, "broadcast").broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  return inner_for(tensors, "reduce").reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_for(inputs, "all_gather").allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::_allgather_base(at::Tensor& output,
                                                              at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  return inner_for(input.device().type(), "all_gather_into_tensor")
      ._allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_for(inputs, "all_gather_coalesced").allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_for(inputs, "all_gather_into_tensor_coalesced")
      .allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return inner_for(inputs, "gather").gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return inner_for(outputs, "scatter").scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return inner_for(outputs, "reduce_scatter").reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return inner_for(input.device().type(), "reduce_scatter_tensor")
      ._reduce_scatter_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return inner_for(inputs, "reduce_scatter_tensor_coalesced")
      .reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return inner_for(input.device().type(), "all_to_all_single")
      .alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  return inner_for(inputs, "all_to_all").alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                   int tag) {
  return inner_for(tensors, "send").send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                   int tag) {
  return inner_for(tensors, "recv").recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                            int tag) {
  return inner_for(tensors, "recv").recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::barrier(const c10d::BarrierOptions& opts) {
  return inner_for(cpu_inner_ ? c10::DeviceType::CPU : c10::DeviceType::CUDA, "barrier")
      .barrier(opts);
}

void StraggBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  inner_for(c10::DeviceType::CPU, "monitored_barrier").monitoredBarrier(opts, wait_all_ranks);
}

void StraggBackend::setSequenceNumberForGroup() {
  if (cpu_inner_) cpu_inner_->setSequenceNumberForGroup();
}

uint64_t StraggBackend::getSequenceNumberForGroup() {
  return cpu_inner_ ? cpu_inner_->getSequenceNumberForGroup() : 0;
}

}  // namespace stragg
