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
#include "plan/planner.h"
#include "runtime/executor.h"
#include "runtime/shm_transport.h"
#include "runtime/tcp_transport.h"

namespace stragg {

struct BackendConfig {
  std::string transport = "auto";  // auto | shm | tcp | gloo
  ShmOptions shm;
  TcpOptions tcp;          // tcp.advertise_host empty: the address that routes to tcp_store_host
  std::string tcp_store_host;  // host of the rendezvous store (TCPStore / MASTER_ADDR), or empty
  PlannerConfig planner;       // STRAGG_ALGO / STRAGG_STRAGGLER
  // Dynamic straggler: how long the first n-1 arrivals wait for the last one before running
  // StragglAR without it (STRAGG_DYNAMIC_WINDOW_US).
  std::chrono::microseconds dynamic_window{1000};
  bool log_calls = false;  // STRAGG_DEBUG=DETAIL
};

// One all_reduce as this rank saw it (kept for the last kCallHistory calls).
struct CallRecord {
  uint64_t seq = 0;
  int64_t numel = 0;
  int64_t bytes = 0;
  std::string algorithm;  // what ran: "ring", "stragglar", ... ("gloo" when delegated)
  int straggler = -1;     // configured or agreed straggler of this call, -1 = none
  double queued_s = 0;    // from the call to the worker starting it
  double agreement_s = 0; // dynamic straggler agreement
  double run_s = 0;       // executing the schedule
  double wait_s = 0;      // of run_s, blocked waiting for peers
  double pre_arrival_s = 0;  // of run_s, in pre-arrival steps
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
  struct Task {
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
  c10::intrusive_ptr<c10d::Backend> cpu_inner_;
  c10::intrusive_ptr<c10d::Backend> cuda_inner_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::atomic<bool> running_task_{false};
  uint64_t next_seq_ = 0;
  std::thread worker_;

  std::atomic<int64_t> allreduce_calls_{0};
  std::atomic<int64_t> allreduce_bytes_{0};
  std::atomic<int64_t> delegated_calls_{0};
  std::atomic<int64_t> failed_calls_{0};
  std::chrono::microseconds dynamic_window_{1000};
  std::atomic<int64_t> dynamic_straggler_calls_{0};  // agreed on a straggler: StragglAR ran
  std::atomic<int64_t> dynamic_plain_calls_{0};      // everybody in time: plain Ring ran
  std::atomic<int64_t> last_straggler_{-1};
  bool log_calls_ = false;  // STRAGG_DEBUG=DETAIL: one log line per call
  mutable std::mutex history_mu_;
  std::deque<CallRecord> history_;
  ExecutorStats executor_totals_;  // copy of the executor's counters after each call
};

}  // namespace stragg
