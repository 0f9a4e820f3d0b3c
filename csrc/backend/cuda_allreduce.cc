// all_reduce on CUDA tensors on stragg's GPU executor; see cuda_allreduce.h for the semantics.
// CudaAllreduce::Impl: the lazy p2p setup and the tasks the session's worker enqueues on the GPU.
// The calls in flight and the poller that completes or fails them are in cuda_in_flight.h, the
// Work each call returns in cuda_work.h.
#ifndef STRAGG_BACKEND_CUDA
#error "cuda_allreduce.cc is compiled only with -DSTRAGG_BACKEND_CUDA (CMake STRAGG_BACKEND_CUDA)"
#endif

#include "backend/cuda_allreduce.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "backend/cuda_in_flight.h"
#include "backend/cuda_work.h"
#include "backend/dist_error.h"
#include "backend/store_rendezvous.h"
#include "backend/type_mapping.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_ipc_p2p.h"
#include "kernels/gpu_executor.h"
#include "kernels/gpu_p2p.h"
#include "kernels/local_p2p.h"
#include "kernels/reduce_kernels.h"
#ifdef STRAGG_BACKEND_NCCL
#include "kernels/nccl_p2p.h"
#endif
#include "common/error.h"
#include "runtime/dtype.h"
#include "session/session.h"

namespace stragg {
namespace {

constexpr const char* kOpName = "all_reduce";

struct Task {
  c10::intrusive_ptr<CudaWork> work;
  at::Tensor user;    // the caller's tensor (results end up here)
  at::Tensor buffer;  // contiguous (real view of complex); aliases `user` when it is contiguous
  bool copy_back = false;
  DType dtype = DType::Float32;
  LoweredReduceOp op;
  uint64_t seq = 0;
  std::chrono::milliseconds timeout{0};
  EventPtr ready;  // recorded on the caller's stream when the call was made
  EventPtr done;   // the Work's completion event
};

}  // namespace

struct CudaAllreduce::Impl {
  Impl(const c10::intrusive_ptr<c10d::Store>& base, int rank_, int size_, CudaAllreduceConfig c,
       Session& session_)
      : store(c10::make_intrusive<c10d::PrefixStore>("cuda/", base)),
        rank(rank_),
        size(size_),
        cfg(std::move(c)),
        session(session_) {}

  std::string prefix() const { return "stragg: rank " + std::to_string(rank); }
  std::string where(uint64_t seq) const {
    std::ostringstream s;
    s << prefix() << ": " << kOpName << " #" << seq << " (gpu, " << p2p_name << ")";
    return s.str();
  }

  void ensure_setup(int dev);  // caller thread, under call_mu
  ExternalCall call_for(std::shared_ptr<Task> task);
  void run_task(Task& task, const PlanChoice* choice);
  void task_finished(Task& task, std::exception_ptr error);
  void stop(const std::string& why, bool abort_p2p);

  c10::intrusive_ptr<c10d::Store> store;
  const int rank;
  const int size;
  const CudaAllreduceConfig cfg;
  // The group's session: its worker runs the CUDA calls in issue order with the CPU ones, after
  // exchanging their headers on the CPU transport (mismatches raise), with the planner's choice.
  Session& session;

  // Set up once by the first call (under call_mu); read-only afterwards.
  std::mutex call_mu;  // serialises allreduce(): setup, sequence numbers, queue order
  bool setup_done = false;
  std::exception_ptr setup_error;
  int device = -1;
  std::string p2p_name;
  std::unique_ptr<StoreRendezvous> rdv;
  std::unique_ptr<gpu::GpuP2P> p2p;
  std::atomic<gpu::GpuP2P*> p2p_ptr{nullptr};  // for abort() from other threads
  std::unique_ptr<gpu::GpuExecutor> exec;
  std::unique_ptr<Planner> planner;
  uint64_t next_seq = 0;

  std::atomic<bool> stopping{false};

  // Calls enqueued on the GPU and their poller (started by the setup, stopped by stop()).
  // Lock order: call_mu before in_flight's lock, never the reverse (add() runs on the worker).
  CudaInFlight in_flight;

  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> failed{0};  // calls that failed to enqueue (in_flight counts the others)
};

void CudaAllreduce::Impl::ensure_setup(int dev) {
  if (setup_done) {
    if (setup_error) std::rethrow_exception(setup_error);
    return;
  }
  setup_done = true;
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(dev));
    // The planner first: it validates the configuration without talking to the peers.
    if (size > 1) planner = std::make_unique<Planner>(size, cfg.planner);
    rdv = std::make_unique<StoreRendezvous>(store);
    if (size == 1) {
      p2p = std::make_unique<gpu::LocalP2P>(dev);
    } else if (cfg.same_host) {
      gpu::CudaIpcOptions opts;
      opts.slot_bytes = cfg.ipc_slot_bytes;
      opts.slots = cfg.ipc_slots;
      p2p = std::make_unique<gpu::CudaIpcP2P>(*rdv, "ipc", rank, size, dev, cfg.timeout, opts);
    } else {
#ifdef STRAGG_BACKEND_NCCL
      p2p = std::make_unique<gpu::NcclP2P>(*rdv, "nccl", rank, size, dev, cfg.timeout);
#else
      throw Error(prefix() + ": CUDA all_reduce across hosts needs stragg's NCCL layer, which this "
                  "build lacks (nccl.h was not found when it was built); set "
                  "STRAGG_CUDA_ALLREDUCE=nccl on every rank to use the inner NCCL backend");
#endif
    }
    exec = std::make_unique<gpu::GpuExecutor>(*p2p);
    device = dev;
    p2p_name = p2p->name();
    p2p_ptr.store(p2p.get());
    in_flight.start(dev, *p2p);
  } catch (const c10::Error& e) {
    setup_error = dist_error(prefix() + ": setting up CUDA all_reduce on cuda:" +
                             std::to_string(dev) + " failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    setup_error = dist_error(prefix() + ": setting up CUDA all_reduce on cuda:" +
                             std::to_string(dev) + " failed: " + e.what());
  }
  if (setup_error) {
    if (auto* p = p2p.get()) p->abort(prefix() + ": CUDA all_reduce setup failed");
    exec.reset();
    p2p_ptr.store(nullptr);
    p2p.reset();
    std::rethrow_exception(setup_error);
  }
}

ExternalCall CudaAllreduce::Impl::call_for(std::shared_ptr<Task> task) {
  ExternalCall call;
  call.numel = static_cast<size_t>(task->buffer.numel());
  call.dtype = task->dtype;
  call.op = task->op.op;
  call.timeout = task->timeout;
  call.run = [this, task](const PlanChoice* choice, uint64_t) {
    (void)cudaSetDevice(device);  // the worker's CUDA calls and torch ops run on the group's device
    c10::AutoGradMode no_grad(false);  // the copy back of a leaf that requires grad is no autograd op
    run_task(*task, choice);
  };
  call.done = [this, task](std::exception_ptr error) { task_finished(*task, error); };
  return call;
}

void CudaAllreduce::Impl::task_finished(Task& task, std::exception_ptr error) {
  if (error) {
    // A half-enqueued call leaves the peers inconsistent: make them (and later calls) fail.
    if (auto* p = p2p_ptr.load()) p->abort(task.work->where() + ": failed to enqueue");
    failed.fetch_add(1);
    task.work->mark_failed(to_dist_error(error, task.work->where()));
    return;
  }
  calls.fetch_add(1);
  bytes.fetch_add(static_cast<int64_t>(task.buffer.nbytes()));
  task.work->mark_enqueued();
  in_flight.add(task.work, task.timeout);
}

void CudaAllreduce::Impl::run_task(Task& task, const PlanChoice* chosen) {
  const cudaStream_t stream = exec->stream();
  auto check = [&](cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) throw Error(task.work->where() + ": " + what + ": " + gpu::cuda_error_text(rc));
  };
  // Ordered after what the caller had enqueued on its stream when it called all_reduce.
  check(cudaStreamWaitEvent(stream, task.ready.get(), 0), "cudaStreamWaitEvent (caller's stream)");
  void* data = task.buffer.data_ptr();
  const size_t numel = static_cast<size_t>(task.buffer.numel());
  if (numel > 0) {
    if (task.op.premul) gpu::scale(task.dtype, data, numel, task.op.premul_factor, stream);
    if (size > 1) {
      CollectiveSpec spec;
      spec.op_name = kOpName;
      spec.seq = task.seq;
      spec.dtype = task.dtype;
      spec.op = task.op.op;
      spec.numel = numel;
      const size_t elem = dtype_size(task.dtype);
      // The session's choice (same planner state on every rank: the call runs in the session's
      // issue order); without a CPU transport, the configured straggler only.
      const PlanChoice choice =
          chosen != nullptr ? *chosen : planner->choose(numel * elem, planner->straggler().rank, 0,
                                                            /*host=*/false);
      exec->run(*planner->lower(rank, choice, numel, elem, /*ordered_recvs=*/false), spec, data,
                stream, task.timeout);
    }
    if (task.op.average) gpu::divide(task.dtype, data, numel, size, stream);
    if (task.copy_back) {
      c10::cuda::CUDAStreamGuard guard(
          c10::cuda::getStreamFromExternal(stream, static_cast<c10::DeviceIndex>(device)));
      if (task.user.is_complex()) {
        task.user.copy_(at::view_as_complex(task.buffer));
      } else {
        task.user.copy_(task.buffer);
      }
    }
  }
  check(cudaEventRecord(task.done.get(), stream), "cudaEventRecord (completion)");
}

void CudaAllreduce::Impl::stop(const std::string& why, bool abort_p2p) {
  // The session's worker (stopped by the backend before this) has run or cancelled every call.
  stopping.store(true);
  gpu::GpuP2P* p = p2p_ptr.load();
  if (p != nullptr && abort_p2p) p->abort(prefix() + ": " + why);
  // Calls in flight get a short grace period (bounded by the group's timeout) to finish.
  in_flight.stop(std::min<std::chrono::milliseconds>(cfg.timeout, std::chrono::seconds(10)));
}

CudaAllreduce::CudaAllreduce(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                             CudaAllreduceConfig config, Session& session)
    : impl_(std::make_unique<Impl>(store, rank, size, std::move(config), session)) {}

CudaAllreduce::~CudaAllreduce() {
  Impl& s = *impl_;
  s.stop("the process group was destroyed", /*abort_p2p=*/false);
  // Executor first (its stream and scratch), then the p2p layer; all best effort, no throw.
  s.exec.reset();
  s.p2p_ptr.store(nullptr);
  s.p2p.reset();
}

c10::intrusive_ptr<c10d::Work> CudaAllreduce::allreduce(const at::Tensor& t,
                                                        const c10d::ReduceOp& op,
                                                        std::chrono::milliseconds timeout) {
  Impl& s = *impl_;
  TORCH_CHECK(t.is_cuda() && t.layout() == at::kStrided, s.prefix(),
              ": CUDA all_reduce needs a dense CUDA tensor");
  if (t.is_complex()) {
    TORCH_CHECK(op.op_ == c10d::ReduceOp::SUM || op.op_ == c10d::ReduceOp::AVG ||
                    op.op_ == c10d::ReduceOp::PREMUL_SUM,
                s.prefix(), ": all_reduce: ReduceOp.", c10d_reduce_op_name(op),
                " is not defined for complex tensors");
  }
  const at::ScalarType real_type = t.is_complex() ? c10::toRealValueType(t.scalar_type())
                                                  : t.scalar_type();
  auto dtype = to_runtime_dtype(real_type);
  TORCH_CHECK(dtype.has_value(), s.prefix(), ": all_reduce: dtype ", t.scalar_type(),
              " is not supported");
  const LoweredReduceOp lowered = lower_reduce_op(op, *dtype, s.rank);
  const int dev = t.device().index();

  std::lock_guard<std::mutex> call_lock(s.call_mu);
  s.ensure_setup(dev);
  TORCH_CHECK(dev == s.device, s.prefix(), ": all_reduce: this process group runs CUDA "
              "all_reduce on cuda:", s.device, ", got a tensor on cuda:", dev);
  if (s.stopping.load()) throw_dist_error(s.prefix() + ": all_reduce on a process group that was shut down");
  if (auto* p = s.p2p_ptr.load()) {
    if (auto reason = p->async_error()) {
      throw_dist_error(s.where(s.next_seq) + ": the process group was aborted earlier and cannot be "
                 "used any more: " + *reason);
    }
  }

  const auto d = static_cast<c10::DeviceIndex>(dev);
  c10::cuda::CUDAGuard guard(d);
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(d);
  Task task;
  task.seq = s.next_seq++;
  task.user = t;
  // A contiguous working copy is made on the caller's stream, before the ready event.
  const at::Tensor contiguous = t.is_contiguous() ? t : t.contiguous();
  task.buffer = t.is_complex() ? at::view_as_real(contiguous) : contiguous;
  task.copy_back = !t.is_contiguous();
  task.dtype = *dtype;
  task.op = lowered;
  task.timeout = timeout;
  try {
    task.ready = make_event(dev);
    task.done = make_event(dev);
  } catch (const std::exception& e) {
    throw_dist_error(s.where(task.seq) + ": " + e.what());
  }
  const cudaError_t rc = cudaEventRecord(task.ready.get(), caller.stream());
  if (rc != cudaSuccess) {
    throw_dist_error(s.where(task.seq) + ": cudaEventRecord (caller's stream): " + gpu::cuda_error_text(rc));
  }
  // The executor's stream uses these blocks until the call completes: the caching allocator must
  // not hand them to another stream before (recordStream skips memory it does not own).
  const c10::cuda::CUDAStream exec_stream = c10::cuda::getStreamFromExternal(s.exec->stream(), d);
  if (t.numel() > 0) {
    c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), exec_stream);
    if (!task.buffer.is_alias_of(t)) {
      c10::cuda::CUDACachingAllocator::recordStream(task.buffer.storage().data_ptr(), exec_stream);
    }
  }
  task.work = c10::make_intrusive<CudaWork>(s.rank, dev, s.where(task.seq), t, task.done);
  auto work = task.work;
  rethrow_as_dist_error([&] { s.session.submit_external(s.call_for(std::make_shared<Task>(std::move(task)))); });
  return work;
}

std::map<std::string, int64_t> CudaAllreduce::stats() const {
  const Impl& s = *impl_;
  std::map<std::string, int64_t> out;
  out["cuda_allreduce_calls"] = s.calls.load();
  out["cuda_allreduce_bytes"] = s.bytes.load();
  out["cuda_failed_calls"] = s.failed.load() + s.in_flight.failed();
  const gpu::GpuP2P* p = s.p2p_ptr.load();
  out["cuda_device"] = p != nullptr ? p->device() : -1;
  out["cuda_p2p_ipc"] = p == nullptr ? -1 : (std::string(p->name()) == "cuda-ipc" ? 1 : 0);
  return out;
}

std::string CudaAllreduce::p2p_name() const {
  const gpu::GpuP2P* p = impl_->p2p_ptr.load();
  return p != nullptr ? p->name() : "";
}

void CudaAllreduce::shutdown(const std::string& why) { impl_->stop(why, /*abort_p2p=*/false); }

void CudaAllreduce::abort(const std::string& why) { impl_->stop(why, /*abort_p2p=*/true); }

}  // namespace stragg
