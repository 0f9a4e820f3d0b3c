// all_reduce on CUDA tensors on stragg's GPU executor (kernels/), owned by StraggBackend.
// Compiled only with -DSTRAGG_BACKEND_CUDA (CMake option STRAGG_BACKEND_CUDA, see
// csrc/backend/CMakeLists.txt); without it CUDA all_reduce is delegated to the inner NCCL backend.
//
// Transport: CudaIpcP2P when every rank of the group is on one host (the backend's setup
// exchange says so; several ranks may share a GPU), NcclP2P otherwise (one GPU per rank). Both
// are set up lazily by the first CUDA all_reduce (collective, bounded by the group's timeout),
// on the device of its tensor, through the c10d store under the prefix "cuda/".
//
// Stream semantics (those of ProcessGroupNCCL):
//  * allreduce() records an event on the caller's current stream of the tensor's device and
//    returns at once; the call then runs on the group's session worker (csrc/session), in issue
//    order with the CPU all_reduces: the ranks exchange its header over the CPU transport (a
//    different numel, dtype or op raises on every rank, naming it), the planner chooses its
//    schedule with the same state as on every other rank (configured or profiled straggler,
//    measured links), and the worker makes the executor's stream wait for the caller's event,
//    then enqueues PREMUL_SUM scaling (gpu::scale), the schedule (GpuExecutor::run), AVG
//    division (gpu::divide) and the copy back of a non-contiguous tensor, and records the Work's
//    completion event. The host never waits for the GPU.
//  * Work::wait() blocks the host only until the worker has enqueued the call (bounded by the
//    call's timeout), then makes the caller's current stream wait for the completion event
//    (cudaStreamWaitEvent) and rethrows the call's error, if any. isCompleted() queries the
//    event. getFuture() is completed by a poller thread when the event has fired (no CUDA call
//    in a host callback); its value is the list of output tensors.
//  * The tensor (and the contiguous working copy) are recorded on the executor stream with
//    CUDACachingAllocator::recordStream, so freeing them early is safe.
// Errors (setup failures, timeouts, NCCL / CUDA-IPC failures, a peer's abort, a header mismatch)
// become c10::DistBackendError naming the rank, the op and its sequence number; the p2p layer is
// then aborted (like NCCL), the call's Work and future carry the error, and later calls raise at
// once. A call that does not finish on the GPU within its timeout is failed by the poller, which
// aborts the p2p layer (ncclCommAbort releases kernels stuck on a dead peer); a call whose
// completion event fired after the group was aborted fails too (an aborted NCCL kernel may exit
// without having moved the data).
//
// Not supported on this path: the dynamic straggler (agreed on CPU arrival times, which say
// nothing about GPU work: such groups run GPU calls without a straggler). Without a CPU
// transport (STRAGG_TRANSPORT=gloo) there is no header exchange and only a configured straggler.
// None of this has run on a GPU yet (tests/gpu/README.md).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "plan/planner.h"
#include "session/session.h"

namespace stragg {

struct CudaAllreduceConfig {
  PlannerConfig planner;  // the group's (STRAGG_ALGO / STRAGG_STRAGGLER)
  bool same_host = true;  // every rank on one host: CUDA IPC, else NCCL
  std::chrono::milliseconds timeout{300000};  // process-group timeout (setup; calls' default)
  size_t ipc_slot_bytes = size_t{1} << 20;    // CUDA-IPC staging (must be equal on all ranks)
  int ipc_slots = 4;
};

class CudaAllreduce {
 public:
  // Cheap: nothing is set up until the first call. `store` is the backend's store (a
  // PrefixStore "cuda/" is put on top of it). Calls run on `session`'s worker (which must outlive
  // this object and be stopped before it).
  CudaAllreduce(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                CudaAllreduceConfig config, Session& session);
  // Fails queued calls, waits (bounded) for calls in flight, then releases the GPU resources.
  ~CudaAllreduce();
  CudaAllreduce(const CudaAllreduce&) = delete;
  CudaAllreduce& operator=(const CudaAllreduce&) = delete;

  // In-place all_reduce of one dense CUDA tensor; `timeout` is the call's (already resolved).
  c10::intrusive_ptr<c10d::Work> allreduce(const at::Tensor& tensor, const c10d::ReduceOp& op,
                                           std::chrono::milliseconds timeout);

  // cuda_allreduce_calls, cuda_allreduce_bytes, cuda_failed_calls, cuda_device (-1 before
  // setup), cuda_p2p_ipc (1: CUDA IPC, 0: NCCL, -1 before setup).
  std::map<std::string, int64_t> stats() const;
  // "cuda-ipc", "nccl", "local" (one rank) or "" before the first call.
  std::string p2p_name() const;

  // Stops accepting calls, fails the queued ones, waits (bounded) for those in flight.
  void shutdown(const std::string& why);
  // Aborts the p2p layer (peers fail promptly), then shutdown.
  void abort(const std::string& why);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace stragg
