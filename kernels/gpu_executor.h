// Runs a LoweredSchedule (csrc/runtime/lowered_schedule.h) on a device buffer, stream-ordered (no
// torch; no CUDA headers: the device is the Device interface of device.h, CUDA's or the host's).
//
// Stream semantics (those of ProcessGroupNCCL): run() orders the collective after everything
// already enqueued on the caller's stream (an event recorded there, waited on by the executor's
// own stream), enqueues every step on the executor's stream and returns a GpuCompletion whose
// event is recorded after the last step. The caller then either makes a stream wait for it
// (GpuCompletion::stream_wait, the usual Work::wait() on CUDA) or blocks the host
// (GpuExecutor::wait, with a timeout). Collectives run by one executor complete in issue order.
//
// Per step: one p2p group (GpuP2P::group_start, the step's sends and receives, group_end) on the
// executor stream, then, on the same stream, the reduce kernel (or copy) of each receive that
// landed in scratch memory. A receive lands in scratch when it reduces, when it is staged
// (LoweredOp::staged) or when it overlaps a send of the step (LoweredOp::follows_send): since the
// kernels run after the whole group completed, sends read the data as it was at the start of the
// step, exactly the CPU executor's semantics. Plain overwriting receives land in place. Reduce
// kernels compute dst = dst op received, the CPU operand order, so results match the CPU path.
//
// Errors: device and p2p failures become stragg::Error naming rank, op and sequence number; any
// failure aborts the p2p layer (GpuP2P::abort) so the peers fail promptly instead of hanging. A
// timeout (TimeoutError) also names the ranks that have not called the collective at all, where
// the p2p layer tracks arrivals (CUDA IPC, host). GPU-side message headers are not exchanged:
// unlike the CPU executor, mismatched collectives (numel, dtype, op) are not detected here; the
// caller must agree on them beforehand.
//
// What has run where: this class runs in CI on the host device
// (tests/cpp/test_host_gpu_executor.cc, every algorithm, 2-4 in-process ranks); on the CUDA device
// it has not run yet (tests/gpu/).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/device.h"
#include "kernels/gpu_p2p.h"
#include "runtime/executor.h"
#include "runtime/lowered_schedule.h"

namespace stragg::gpu {

// Completion of one GpuExecutor::run.
class GpuCompletion {
 public:
  GpuCompletion() = default;
  // The event recorded on the executor stream after the collective (nullptr for an empty one).
  Event event() const { return event_.get(); }
  // True once the collective finished on the device. Throws stragg::Error on a device error.
  bool query() const;
  // Makes `stream` wait for the collective (no host blocking).
  void stream_wait(Stream stream) const;

 private:
  friend class GpuExecutor;
  std::shared_ptr<CUevent_st> event_;
  Device* device_ = nullptr;
};

struct GpuExecutorStats {
  uint64_t runs = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t reduce_kernels = 0;
  double enqueue_s = 0;  // host time inside run()
};

class GpuExecutor {
 public:
  // On the CUDA device (defined in cuda_device.cc, built with the CUDA parts only): creates a
  // non-blocking stream on p2p.device(). Throws stragg::Error on CUDA errors.
  explicit GpuExecutor(GpuP2P& p2p);
  // On any device; `device` must outlive the executor and its completions.
  GpuExecutor(GpuP2P& p2p, Device& device);
  ~GpuExecutor();
  GpuExecutor(const GpuExecutor&) = delete;
  GpuExecutor& operator=(const GpuExecutor&) = delete;

  // Enqueues `plan` in place on device buffer `buf` (spec.numel elements of spec.dtype), after
  // the work enqueued on `caller_stream` so far. The host blocks only where the p2p layer needs
  // its peers' host-side progress, at most `timeout` in all. AVG / PREMUL_SUM are the caller's
  // (gpu::divide / gpu::scale on the caller's stream).
  GpuCompletion run(const LoweredSchedule& plan, const CollectiveSpec& spec, void* buf,
                    Stream caller_stream, std::chrono::milliseconds timeout);

  // Blocks the host until `done` completed, polling the event and GpuP2P::async_error().
  // Throws stragg::Error on a p2p or device error (also when the event fired but the group was
  // aborted meanwhile: aborted p2p work may complete without having moved the data) and
  // stragg::TimeoutError after `timeout`; all abort the p2p layer first. `spec` only names the
  // collective in the message.
  void wait(const GpuCompletion& done, const CollectiveSpec& spec,
            std::chrono::milliseconds timeout);

  Stream stream() const { return stream_; }
  GpuP2P& p2p() { return p2p_; }
  Device& device() { return dev_; }
  const GpuExecutorStats& stats() const { return stats_; }

 private:
  void* scratch(size_t bytes);
  void enqueue_steps(const LoweredSchedule& plan, const CollectiveSpec& spec, uint8_t* bytes,
                     std::chrono::steady_clock::time_point deadline);

  GpuP2P& p2p_;
  Device& dev_;
  int device_ = 0;
  Stream stream_ = nullptr;
  Event caller_ready_ = nullptr;  // reused: each wait captures the record before it
  void* scratch_ = nullptr;       // stream-ordered allocation on stream_
  size_t scratch_bytes_ = 0;
  GpuExecutorStats stats_;
};

}  // namespace stragg::gpu
