#include "backend/stragg_backend.h"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#ifdef STRAGG_BACKEND_CUDA
#include "backend/cuda_allreduce.h"
#endif
#include "backend/call_trace.h"
#include "backend/copy_back.h"
#include "backend/dist_error.h"
#include "backend/store_arrival_board.h"
#include "backend/store_rendezvous.h"
#include "backend/type_mapping.h"
#include "runtime/reduce.h"

namespace stragg {

StraggBackend::StraggBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             std::chrono::milliseconds timeout, std::string group_name,
                             Settings settings, StoreInfo store_info)
    : c10d::Backend(rank, size), timeout_(timeout) {
  SessionOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.group_name = std::move(group_name);
  o.settings = std::move(settings);
  o.store_host = store_info.host;
  o.make_store_board = [store, rank, size] {
    // No shared-memory board (TCP across hosts): arrival tickets go through the store.
    return std::make_unique<StoreArrivalBoard>(
        c10::make_intrusive<c10d::PrefixStore>("arrivals/", store), rank, size);
  };
#ifdef STRAGG_BACKEND_CUDA
  const std::string cuda_mode = o.settings.cuda_allreduce;
#endif
  const std::string name = o.group_name;
  StoreRendezvous rdv(store, store_info.description, store_info.hosted_by_rank0);
  rethrow_as_dist_error([&] { session_ = std::make_unique<Session>(rdv, o); });
  if (FlightRecorder::get().enabled()) {
    Session* session = session_.get();
    fr_group_ = FlightRecorder::get().add_group(name, rank, size,
                                                [session] { return session->recent_calls(); });
  }
#ifdef STRAGG_BACKEND_CUDA
  if (cuda_mode == "stragg") {
    CudaAllreduceConfig cuda;
    cuda.planner = PlannerConfig::from(session_->settings());
    cuda.same_host = session_->same_host();
    cuda.timeout = timeout;
    cuda_allreduce_ = std::make_unique<CudaAllreduce>(store, rank, size, cuda, *session_);
  }
#endif
}

StraggBackend::~StraggBackend() {
  // Calls still queued run to completion (like Gloo); the session's destructor waits for them.
  // The CUDA path's calls run on the session's worker: stop it first.
  if (session_) session_->shutdown("the process group was destroyed");
  if (fr_group_) FlightRecorder::get().detach_group(fr_group_);
#ifdef STRAGG_BACKEND_CUDA
  cuda_allreduce_.reset();
#endif
  session_.reset();
}

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

std::map<std::string, int64_t> StraggBackend::stats() const {
  std::map<std::string, int64_t> s = session_->stats();
  s["delegated_calls"] = delegated_calls_.load();
#ifdef STRAGG_BACKEND_CUDA
  if (cuda_allreduce_) {
    for (const auto& kv : cuda_allreduce_->stats()) s[kv.first] = kv.second;
  }
#endif
  return s;
}

std::chrono::milliseconds StraggBackend::effective_timeout(
    std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? timeout_ : requested;
}

void StraggBackend::check_usable(const char* op) const {
  if (auto why = session_->failure()) {
    C10_THROW_ERROR(DistBackendError, "stragg: rank " + std::to_string(getRank()) + ": " + op +
                                          " on a process group that was " + *why);
  }
}

c10d::Backend& StraggBackend::inner_for(c10::DeviceType type, const char* op) {
  check_usable(op);
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
// all_reduce on stragg's session

c10::intrusive_ptr<c10d::Work> StraggBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "stragg: rank ", getRank(),
              ": all_reduce takes exactly one tensor per process, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  if (t.is_sparse()) {
    return delegated(inner_for(tensors, "sparse all_reduce").allreduce(tensors, opts),
                     "sparse all_reduce");
  }
#ifdef STRAGG_BACKEND_CUDA
  if (t.is_cuda() && cuda_allreduce_) {
    return cuda_allreduce_->allreduce(t, opts.reduceOp, effective_timeout(opts.timeout));
  }
#endif
  if (!t.device().is_cpu()) {
    return delegated(inner_for(tensors, "all_reduce").allreduce(tensors, opts), "all_reduce");
  }
  at::Tensor view = t;
  if (t.is_complex()) {
    TORCH_CHECK(opts.reduceOp.op_ == c10d::ReduceOp::SUM ||
                    opts.reduceOp.op_ == c10d::ReduceOp::AVG ||
                    opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM,
                "stragg: rank ", getRank(), ": all_reduce: ReduceOp.",
                c10d_reduce_op_name(opts.reduceOp), " is not defined for complex tensors");
    view = at::view_as_real(t.is_contiguous() ? t : t.contiguous());
  }
  return submit_allreduce("all_reduce", c10d::OpType::ALLREDUCE, {t},
                          view.is_contiguous() ? view : view.contiguous(),
                          !(t.is_contiguous() && !t.is_complex()), opts.reduceOp,
                          effective_timeout(opts.timeout));
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
    return delegated(inner_for(tensors, "all_reduce_coalesced").allreduce_coalesced(tensors, opts),
                     "all_reduce_coalesced");
  }
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  return submit_allreduce("all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors,
                          at::cat(flat), true, opts.reduceOp, effective_timeout(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return delegated(inner_for(tensors, "sparse all_reduce").allreduce_sparse(tensors, opts),
                   "sparse all_reduce");
}

TraceGroup StraggBackend::trace_group() const {
  TraceGroup group;
  group.rank = getRank();
  group.size = getSize();
  group.name = getGroupUid();
  group.desc = getGroupDesc();
  group.global_ranks = global_ranks_;
  return group;
}

c10::intrusive_ptr<c10d::Work> StraggBackend::barrier(const c10d::BarrierOptions& opts) {
  // A group with CPU tensors runs its barrier itself (Session::barrier: a one-element all_reduce
  // behind the queued calls, microseconds on shared memory where Gloo's takes milliseconds); a
  // CUDA-only group and a group that delegates all_reduce keep the inner backend's.
  if (cpu_inner_ && session_->path() != AllreducePath::Delegate) {
    // Session::barrier refuses an aborted or shut-down group itself, with check_usable's words.
    auto work = c10::make_intrusive<StraggWork>(getRank(), c10d::OpType::BARRIER, nullptr,
                                                std::vector<at::Tensor>{});
    if (at::hasCallbacks()) {
      work->begin_profiler_range("stragg:barrier", group_trace_args(trace_group()));
    }
    const auto timeout = effective_timeout(opts.timeout);
    if (!fr_group_) {
      rethrow_as_dist_error([&] {
        session_->barrier(timeout, [work](std::exception_ptr error) {
          work->complete(to_dist_error(error));
        });
      });
      return work;
    }
    const int64_t fr_id = fr_record("barrier", {}, {}, timeout);
    rethrow_as_dist_error([&] {
      session_->barrier(timeout, [this, work, fr_id](std::exception_ptr error) {
        FlightRecorder::get().finished(fr_group_, fr_id, error);
        work->complete(to_dist_error(error));
      });
    });
    return work;
  }
  return delegated(
      inner_for(cpu_inner_ ? c10::DeviceType::CPU : c10::DeviceType::CUDA, "barrier").barrier(opts),
      "barrier");
}

c10::intrusive_ptr<c10d::Work> StraggBackend::submit_allreduce(
    const char* name, c10d::OpType type, std::vector<at::Tensor> outputs, at::Tensor buffer,
    bool needs_copy_back, const c10d::ReduceOp& op, std::chrono::milliseconds timeout) {
  auto dtype = to_runtime_dtype(buffer.scalar_type());
  TORCH_CHECK(dtype.has_value(), "stragg: rank ", getRank(), ": ", name, ": dtype ",
              buffer.scalar_type(), " is not supported");
  const LoweredReduceOp lowered = lower_reduce_op(op, *dtype, getRank());
  // The title names the call in torch.profiler traces. Its range is opened by the call's tracer
  // (call_trace.h) once the session has numbered the call, not by c10d::Work (no title here).
  // Without a profiler callback installed there is neither range nor tracer (no allocation).
  const char* title = !at::hasCallbacks()                   ? nullptr
                      : type == c10d::OpType::ALLREDUCE ? "stragg:all_reduce"
                                                        : "stragg:all_reduce_coalesced";
  auto work = c10::make_intrusive<StraggWork>(getRank(), type, nullptr, std::move(outputs));
  work->keep_buffer(buffer, needs_copy_back);
  AllreduceCall call;
  if (title != nullptr) {
    call.tracer = ProfilerCallTrace::make(work, title, dtype_name(*dtype), trace_group());
  }
  call.name = name;
  call.data = buffer.data_ptr();
  call.numel = static_cast<size_t>(buffer.numel());
  call.dtype = *dtype;
  call.op = lowered.op;
  call.premul = lowered.premul;
  call.premul_factor = lowered.premul_factor;
  call.average = lowered.average;
  call.timeout = timeout;
  if (session_->path() == AllreducePath::Delegate) {
    // Same pipeline as the executor path (contiguous buffer, premul/average around it, issue
    // order kept by the worker); only the reduction itself runs on the inner Gloo backend.
    call.delegate = [this, buffer, dtype = *dtype, op = lowered.op, timeout, name] {
      std::vector<at::Tensor> buffers{buffer};
      c10d::AllreduceOptions opts;
      opts.reduceOp = to_c10d_reduce_op(op, dtype);
      opts.timeout = timeout;
      try {
        inner_for(c10::DeviceType::CPU, name).allreduce(buffers, opts)->wait();
      } catch (const c10::Error& e) {
        // Total abort: the group's later operations raise at once with this cause.
        const std::string msg = e.msg();
        if (!session_->failure()) {
          session_->abort(std::string(name) + " failed: " + msg.substr(0, msg.find('\n')));
        }
        throw;
      }
    };
  }
  // The work keeps the buffer (and the user's tensors) alive until the call is done. The closure
  // holds 16 bytes, which std::function stores without allocating (with the flight recorder on:
  // a second closure, which records the end).
  auto done = [work, rank = getRank()](std::exception_ptr error) {
    if (!error && work->needs_copy_back()) {
      try {
        copy_back(work->buffer(), work->outputs(), rank);
      } catch (...) {
        error = std::current_exception();
      }
    }
    work->complete(to_dist_error(error));
  };
  if (!fr_group_) {
    call.done = std::move(done);
    rethrow_as_dist_error([&] { session_->submit(std::move(call)); });
    return work;
  }
  const int64_t fr_id = fr_record(name, work->outputs(), work->outputs(), timeout);
  call.done = [this, fr_id, done](std::exception_ptr error) {
    FlightRecorder::get().finished(fr_group_, fr_id, error);
    done(error);
  };
  uint64_t seq = 0;
  rethrow_as_dist_error([&] { seq = session_->submit(std::move(call)); });
  FlightRecorder::get().set_call_seq(fr_id, seq);
  return work;
}

c10::intrusive_ptr<c10d::Work> StraggBackend::measure_links() {
  const int n = getSize();
  at::Tensor result = at::full({n, n, 2}, -1.0, at::TensorOptions().dtype(at::kDouble));
  auto work = c10::make_intrusive<StraggWork>(getRank(), c10d::OpType::UNKNOWN,
                                              "stragg:link_probe", std::vector<at::Tensor>{result});
  Session* session = session_.get();
  rethrow_as_dist_error([&] {
    session_->measure_links([work, result, session, n](std::exception_ptr error) {
      if (!error) {
        const std::vector<LinkModel> matrix = session->link_matrix();
        auto out = result.accessor<double, 3>();
        for (int i = 0; i < n; ++i) {
          for (int j = 0; j < n; ++j) {
            const LinkModel& l = matrix[static_cast<size_t>(i) * n + j];
            out[i][j][0] = l.alpha_s;
            out[i][j][1] = l.beta_s_per_byte;
          }
        }
      }
      work->complete(to_dist_error(error));
    });
  });
  return work;
}

// ---------------------------------------------------------------------------------------------
// Flight recorder

void StraggBackend::set_flight_recorder_ranks(std::vector<int64_t> global_ranks) {
  TORCH_CHECK(global_ranks.empty() || static_cast<int>(global_ranks.size()) == getSize(),
              "stragg: rank ", getRank(), ": set_flight_recorder_ranks: ", global_ranks.size(),
              " global ranks for a group of ", getSize());
  if (global_ranks.empty()) return;
  global_ranks_ = global_ranks;
  if (!fr_group_) return;
  fr_group_->global_rank = global_ranks[static_cast<size_t>(getRank())];
  fr_group_->global_ranks = std::move(global_ranks);
}

int64_t StraggBackend::fr_record(const char* op, const std::vector<at::Tensor>& inputs,
                                 const std::vector<at::Tensor>& outputs,
                                 std::chrono::milliseconds timeout, bool is_p2p) {
  return FlightRecorder::get().record(fr_group_, getGroupDesc(), fr_profiling_name(op), inputs,
                                      outputs, timeout, is_p2p);
}

void StraggBackend::shutdown() {
  session_->shutdown("the process group was shut down");
#ifdef STRAGG_BACKEND_CUDA
  if (cuda_allreduce_) cuda_allreduce_->shutdown("the process group was shut down");
#endif
  if (cpu_inner_) cpu_inner_->shutdown();
  if (cuda_inner_) cuda_inner_->shutdown();
}

void StraggBackend::abort() {
  session_->abort("abort() was called");
#ifdef STRAGG_BACKEND_CUDA
  if (cuda_allreduce_) cuda_allreduce_->abort("the process group was aborted");
#endif
  if (cpu_inner_) cpu_inner_->abort();
  if (cuda_inner_) cuda_inner_->abort();
}

}  // namespace stragg
