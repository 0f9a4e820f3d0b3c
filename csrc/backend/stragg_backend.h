// stragg's c10d::Backend: the thin adapter between torch.distributed and stragg's session.
//
// all_reduce on CPU tensors becomes a session call (csrc/session/session.h: contiguous buffer,
// dtype and reduce op mapped to the runtime's, copy back into the caller's tensor when needed);
// the Work completes on the session's worker thread. Every other collective, sparse and (without
// stragg's GPU path) CUDA all_reduce are delegated to an inner backend created from the same
// store: Gloo for CPU, NCCL for CUDA. Errors become DistBackendError (ValueError for bad
// settings), see dist_error.h.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/flight_recorder.h"
#include "backend/regroup.h"
#include "backend/store_rendezvous.h"
#include "backend/stragg_work.h"
#include "plan/settings.h"
#include "session/session.h"

namespace stragg {

#ifdef STRAGG_BACKEND_CUDA
class CudaAllreduce;  // backend/cuda_allreduce.h
#endif
struct TraceGroup;  // backend/call_trace.h

class StraggBackend final : public c10d::Backend {
 public:
  // Collective over the group: sets the session up through `store` (naming ranks that do not
  // join within `timeout`, and the store if it fails).
  StraggBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                std::chrono::milliseconds timeout, std::string group_name, Settings settings,
                StoreInfo store_info);
  ~StraggBackend() override;

  // Backends that run the collectives stragg does not: device is "cpu" or "cuda".
  void attach_inner(const std::string& device, c10::intrusive_ptr<c10d::Backend> inner);

  Session& session() { return *session_; }
  const Session& session() const { return *session_; }
  // Session counters plus delegated_calls (and the CUDA path's).
  std::map<std::string, int64_t> stats() const;
  // Collective (every rank calls it, in the same order as its all_reduces): runs a link probe
  // on the worker thread. The Work's result is a float64 tensor [n, n, 2] (alpha_s, beta_s/B).
  c10::intrusive_ptr<c10d::Work> measure_links();

  const std::string getBackendName() const override { return "stragg"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;

  // Delegated to the inner backend of the tensors' device (delegated_collectives.cc).
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  // stragg's own (Session::barrier) on a group with CPU tensors, else the inner backend's.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  // Like ProcessGroupNCCL's: shutdown() (destroy_process_group) runs the queued all_reduces to
  // completion, then refuses every operation; abort() fails the running and queued ones at once,
  // tells every peer, and refuses every operation. Both idempotent.
  void shutdown() override;
  void abort() override;

  // shrink_group / split_group (regroup.cc): built by the callback the creator installs.
  bool supportsShrinking() const override { return static_cast<bool>(regroup_); }
  bool supportsSplitting() const override { return static_cast<bool>(regroup_); }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
      const c10::intrusive_ptr<Options>& opts_override) override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  // The options torch's split_group copies to a child: the timeout (stragg's settings are the
  // parent's and travel through the regroup callback).
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void set_regroup(Regroup regroup) { regroup_ = std::move(regroup); }
  // The parent's part of a shrink, before the survivors agree: `abort` (SHRINK_ABORT) fails what
  // runs at once and tells every peer still on this group (an excluded rank that is alive) `why`;
  // otherwise the queued calls finish first and the peers are told by announce_retired() once
  // every survivor has finished its own (a peer told earlier would fail a call it can complete).
  void retire(bool abort, const std::string& why);
  // Every later op here and on the peers raises with `why` (SHRINK_DEFAULT, after the agreement).
  void announce_retired(const std::string& why) { session_->abort(why); }
  // Peers whose process or connection is gone (Session::gone_peers).
  std::vector<int> gone_peers() const { return session_->gone_peers(); }

  // The members' global ranks, set by the Python creator: the flight recorder's view of this
  // group (flight_recorder.h; its description is torch's, getGroupDesc()) and the group_ranks of
  // its profiler trace events (call_trace.h).
  void set_flight_recorder_ranks(std::vector<int64_t> global_ranks);

 private:
  // One all_reduce of `buffer` (contiguous; results copied into `outputs` when they differ).
  c10::intrusive_ptr<c10d::Work> submit_allreduce(const char* name, c10d::OpType type,
                                                  std::vector<at::Tensor> outputs,
                                                  at::Tensor buffer, bool copy_back,
                                                  const c10d::ReduceOp& op,
                                                  std::chrono::milliseconds timeout);
  // Throws DistBackendError naming `op` and the original cause if the group was aborted (by any
  // rank) or shut down.
  void check_usable(const char* op) const;
  // This group as its profiler trace events name it (call_trace.h).
  TraceGroup trace_group() const;
  // The inner backend for `op` (check_usable first).
  c10d::Backend& inner_for(c10::DeviceType type, const char* op);
  c10d::Backend& inner_for(const std::vector<at::Tensor>& tensors, const char* op);
  std::chrono::milliseconds effective_timeout(std::chrono::milliseconds requested) const;
  // Wraps an inner backend's Work (delegated_work.h): an abort while it runs, or its failure,
  // fails the whole group.
  // With the recorder on, records it (inputs / outputs: the caller's tensors).
  c10::intrusive_ptr<c10d::Work> delegated(c10::intrusive_ptr<c10d::Work> inner, const char* op,
                                           const std::vector<at::Tensor>& inputs = {},
                                           const std::vector<at::Tensor>& outputs = {},
                                           bool is_p2p = false);

  // Flight recorder (flight_recorder.h): a new "scheduled" entry (-1 when the recorder is off);
  // FlightRecorder::finished ends it (a failure also writes the dump when
  // TORCH_FR_DUMP_TEMP_FILE is set).
  int64_t fr_record(const char* op, const std::vector<at::Tensor>& inputs,
                    const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout,
                    bool is_p2p = false);

  std::chrono::milliseconds timeout_;
  std::shared_ptr<FrGroup> fr_group_;  // null when the recorder is off
  // The members' global ranks in group-rank order (set_flight_recorder_ranks; empty: 0..size-1),
  // for the flight recorder and profiler traces.
  std::vector<int64_t> global_ranks_;
  std::unique_ptr<Session> session_;
  c10::intrusive_ptr<c10d::Backend> cpu_inner_;
  c10::intrusive_ptr<c10d::Backend> cuda_inner_;
  std::atomic<int64_t> delegated_calls_{0};
  Regroup regroup_;
#ifdef STRAGG_BACKEND_CUDA
  std::unique_ptr<CudaAllreduce> cuda_allreduce_;  // null: CUDA all_reduce goes to cuda_inner_
#endif
};

}  // namespace stragg
