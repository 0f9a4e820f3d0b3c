// stragg's c10d::Backend: all_reduce on CPU tensors runs on stragg's own executor; every other
// collective (and CUDA all_reduce, until stragg's GPU path exists) is delegated to an inner
// backend created from the same store (Gloo for CPU, NCCL for CUDA).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend/stragg_work.h"
#include "backend/type_mapping.h"
#include "plan/link_probe.h"
#include "plan/planner.h"
#include "plan/straggler_profiler.h"
#include "runtime/executor.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg {

#ifdef STRAGG_BACKEND_CUDA
class CudaAllreduce;  // backend/cuda_allreduce.h
#endif

struct BackendConfig {
  std::string transport = "auto";  // auto | shm | tcp | gloo
  ShmOptions shm;
  TcpOptions tcp;          // tcp.advertise_host empty: the address that routes to tcp_store_host
  std::string tcp_store_host;  // host of the rendezvous store (TCPStore / MASTER_ADDR), or empty
  PlannerConfig planner;       // STRAGG_ALGO / STRAGG_STRAGGLER
  // Dynamic straggler: how long the first n-1 arrivals wait for the last one before running
  // StragglAR without it (STRAGG_DYNAMIC_WINDOW_US); negative: chosen per call from the cost
  // model (break-even rule, see StraggBackend::dynamic_window_for).
  std::chrono::microseconds dynamic_window{-1};
  bool log_calls = false;  // STRAGG_DEBUG=DETAIL
  ProfilerSettings profiler;   // STRAGG_PROFILE*
  // Link probes (AdapCC §IV-B) run at the first profiler exchange and then every this many
  // exchanges (0: only on demand).
  int probe_every_exchanges = 64;
  int probe_messages = 8;
  size_t probe_bytes = 64 * 1024;
  // all_reduce on CUDA tensors when built with STRAGG_BACKEND_CUDA: "stragg" (stragg's GPU
  // executor, the default there) or "nccl" (the inner NCCL backend); empty: from
  // $STRAGG_CUDA_ALLREDUCE. Ignored (always NCCL) in builds without it.
  std::string cuda_allreduce;
};

// One all_reduce as this rank saw it (kept for the last kCallHistory calls).
struct CallRecord {
  uint64_t seq = 0;
  int64_t numel = 0;
  int64_t bytes = 0;
  uint64_t wire_seq = 0;  // the collective's sequence number on the wire (internal ones count too)
  std::string algorithm;  // what ran: "ring", "stragglar", ... ("gloo" when delegated)
  int straggler = -1;     // configured or agreed straggler of this call, -1 = none
  double queued_s = 0;    // from the call to the worker starting it
  double agreement_s = 0; // dynamic straggler agreement
  double run_s = 0;       // executing the schedule
  double wait_s = 0;      // of run_s, blocked waiting for peers
  double pre_arrival_s = 0;  // of run_s, in pre-arrival steps
  double window_s = 0;       // dynamic straggler: the wait-or-proceed window used
  bool ok = true;
};

// How all_reduce on CPU tensors is carried out: in-process (world size 1), on stragg's executor
// over transport_, or delegated to the inner Gloo backend.
enum class AllreducePath { Local, Executor, Delegate };

class StraggBackend final : public c10d::Backend {
 public:
  // Collective over the group: exchanges host identities through `store` (naming ranks that do
  // not join within `timeout`), picks the transport and sets it up.
  StraggBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                std::chrono::milliseconds timeout, std::string group_name, BackendConfig config);
  ~StraggBackend() override;

  // Backends that run the collectives stragg does not: device is "cpu" or "cuda".
  void attach_inner(const std::string& device, c10::intrusive_ptr<c10d::Backend> inner);

  // "local" (world size 1), "shm", or "gloo" (all_reduce delegated).
  std::string transport_name() const;
  // The all_reduce algorithm this group runs ("ring", "stragglar", ...) and its straggler (-1).
  std::string algorithm() const;
  int straggler() const;
  std::map<std::string, int64_t> stats() const;
  // The last calls, oldest first (at most kCallHistory).
  std::vector<CallRecord> recent_calls() const;
  static constexpr size_t kCallHistory = 1024;

  // Profiler state (identical on every rank after each exchange); enabled=false if profiling
  // is off or the group has a single rank / delegates all_reduce.
  ProfilerSummary profiler_summary(bool* enabled) const;
  const ProfilerSettings& profiler_settings() const { return profiler_settings_; }
  // The cost model in use and where it came from ("default" or "measured").
  LinkModel link_model(std::string* source) const;
  // Per-link alpha/beta measured by the last probe: n*n entries (alpha < 0: not measured).
  std::vector<LinkModel> link_matrix() const;
  // Collective (every rank calls it, in the same order as its all_reduces): runs a link probe
  // on the worker thread. The Work's result is a float64 tensor [n, n, 2] (alpha_s, beta_s/B).
  c10::intrusive_ptr<c10d::Work> measure_links();
  // The wait-or-proceed window of the dynamic straggler for a call of `bytes`.
  std::chrono::microseconds dynamic_window_for(size_t bytes) const;

  const std::string getBackendName() const override { return "stragg"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;

  // Delegated to the inner backend of the tensors' device.
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
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  void shutdown() override;
  void abort() override;

 private:
  enum class TaskKind { AllReduce, LinkProbe };
  struct Task {
    TaskKind kind = TaskKind::AllReduce;
    c10::intrusive_ptr<StraggWork> work;
    std::vector<at::Tensor> user;  // where the results must end up
    at::Tensor buffer;             // contiguous working buffer (aliases user[0] when possible)
    bool copy_back = false;
    DType dtype = DType::Float32;
    LoweredReduceOp op;
    uint64_t seq = 0;
    std::chrono::milliseconds timeout{0};
    const char* name = "all_reduce";
    std::chrono::steady_clock::time_point enqueued;
  };

  c10::intrusive_ptr<c10d::Work> enqueue(Task task);
  void worker_loop();
  void run_task(Task& task, CallRecord& record);
  void run_link_probe(Task& task);
  // Measures alpha/beta of every link (worker thread; collective) and installs the combined
  // model in the planner and the profiler.
  void probe_links();
  // After a completed executor all_reduce: feed the profiler; every K calls exchange the
  // per-call durations (one small all_reduce) and update the straggler decision.
  void profile_call(const CallRecord& record);
  void profile_exchange();
  CollectiveSpec internal_spec(const char* name, DType dtype, size_t numel);
  void stop_worker(const char* why);
  c10d::Backend& inner_for(c10::DeviceType type, const char* op);
  c10d::Backend& inner_for(const std::vector<at::Tensor>& tensors, const char* op);
  std::chrono::milliseconds effective_timeout(std::chrono::milliseconds requested) const;

  std::string group_name_;
  std::chrono::milliseconds timeout_;
  AllreducePath path_ = AllreducePath::Local;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Planner> planner_;
  std::unique_ptr<ArrivalBoard> store_board_;  // dynamic straggler without a transport board
  c10::intrusive_ptr<c10d::Backend> cpu_inner_;
  c10::intrusive_ptr<c10d::Backend> cuda_inner_;
  bool same_host_ = true;  // every rank on this host (setup exchange)
#ifdef STRAGG_BACKEND_CUDA
  std::unique_ptr<CudaAllreduce> cuda_allreduce_;  // null: CUDA all_reduce goes to cuda_inner_
#endif

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::atomic<bool> running_task_{false};      // a user's collective is running
  std::atomic<bool> internal_running_{false};  // a profiler exchange is running (every rank
                                               // runs it, so stopping waits for it)
  uint64_t next_seq_ = 0;
  std::thread worker_;

  std::atomic<int64_t> allreduce_calls_{0};
  std::atomic<int64_t> allreduce_bytes_{0};
  std::atomic<int64_t> delegated_calls_{0};
  std::atomic<int64_t> failed_calls_{0};
  std::chrono::microseconds dynamic_window_{-1};
  std::atomic<int64_t> dynamic_straggler_calls_{0};  // agreed on a straggler: StragglAR ran
  std::atomic<int64_t> dynamic_plain_calls_{0};      // everybody in time: plain Ring ran
  std::atomic<int64_t> last_straggler_{-1};
  bool log_calls_ = false;  // STRAGG_DEBUG=DETAIL: one log line per call
  mutable std::mutex history_mu_;
  std::deque<CallRecord> history_;
  ExecutorStats executor_totals_;  // copy of the executor's counters after each call

  // Worker-thread state: wire sequence numbers (user calls and internal collectives), profiler.
  uint64_t wire_seq_ = 0;
  uint64_t executor_calls_ = 0;  // completed executor all_reduces (the profiler's call index)
  uint64_t agreements_ = 0;      // dynamic straggler agreements so far (the arrival board's key)
  bool probe_pending_ = false;   // a periodic link probe runs at the start of the next call
  BackendConfig config_;
  ProfilerSettings profiler_settings_;
  std::unique_ptr<StragglerProfiler> profiler_;  // guarded by profiler_mu_ for readers
  std::atomic<int> profiled_straggler_{-1};
  std::vector<double> batch_durations_;
  std::vector<int64_t> batch_bytes_;
  uint64_t batch_first_call_ = 0;
  mutable std::mutex profiler_mu_;
  LinkModel link_model_;
  std::string link_source_ = "default";
  std::vector<LinkModel> link_matrix_;
  std::vector<double> recent_delays_;  // the window's per-call straggler delays (all ranks alike)
};

}  // namespace stragg
