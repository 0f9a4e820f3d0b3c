#include "kernels/gpu_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/reduce_kernels.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace stragg::gpu {
namespace {

using Clock = std::chrono::steady_clock;

// Makes `device` current for the scope and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "stragg: gpu executor: cudaGetDevice");
    if (previous_ != device) cuda_check(cudaSetDevice(device), "stragg: gpu executor: cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }  // best effort: destructors do not throw

 private:
  int previous_ = 0;
};

std::string prefix(const GpuP2P& p2p, const CollectiveSpec& spec) {
  std::ostringstream s;
  s << "stragg: rank " << p2p.rank() << ": " << spec.op_name << " #" << spec.seq << " (gpu, "
    << p2p.name() << ")";
  return s.str();
}

// Scratch regions start at the same address modulo 16 as their destination in the buffer, so the
// reduce kernel can use 16-byte vectors on both.
size_t align_like(size_t pos, size_t dst_byte_offset) {
  const size_t want = dst_byte_offset & 15u;
  const size_t base = (pos + 15u) & ~size_t{15};
  return base + want;
}

struct ScratchRecv {
  size_t op_index;
  size_t scratch_offset;
};

}  // namespace

bool GpuCompletion::query() const {
  if (!event_) return true;
  const cudaError_t rc = cudaEventQuery(event_.get());
  if (rc == cudaSuccess) return true;
  if (rc == cudaErrorNotReady) return false;
  cuda_check(rc, "stragg: gpu collective: cudaEventQuery");
  return false;
}

void GpuCompletion::stream_wait(cudaStream_t stream) const {
  if (!event_) return;
  cuda_check(cudaStreamWaitEvent(stream, event_.get(), 0),
             "stragg: gpu collective: cudaStreamWaitEvent");
}

GpuExecutor::GpuExecutor(GpuP2P& p2p) : p2p_(p2p), device_(p2p.device()) {
  DeviceGuard guard(device_);
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
             "stragg: gpu executor: cudaStreamCreateWithFlags");
  const cudaError_t rc = cudaEventCreateWithFlags(&caller_ready_, cudaEventDisableTiming);
  if (rc != cudaSuccess) {
    cudaStreamDestroy(stream_);
    cuda_check(rc, "stragg: gpu executor: cudaEventCreateWithFlags");
  }
}

GpuExecutor::~GpuExecutor() {
  // Best effort, never throws. Work still enqueued keeps running; CUDA releases the stream and
  // the scratch allocation once it is done.
  int previous = 0;
  const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(device_);
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
  if (caller_ready_ != nullptr) cudaEventDestroy(caller_ready_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (have_previous) cudaSetDevice(previous);
}

void* GpuExecutor::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Stream-ordered: the old block is released after the work that uses it, and nothing here
  // waits for the GPU (a blocking cudaFree could hang on a stalled peer).
  size_t want = std::max(bytes, scratch_bytes_ * 2);
  want = (want + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
  if (scratch_ != nullptr) {
    cuda_check(cudaFreeAsync(scratch_, stream_), "stragg: gpu executor: cudaFreeAsync (scratch)");
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  cuda_check(cudaMallocAsync(&scratch_, want, stream_),
             "stragg: gpu executor: cudaMallocAsync of " + std::to_string(want) + " scratch bytes");
  scratch_bytes_ = want;
  return scratch_;
}

GpuCompletion GpuExecutor::run(const RankPlan& plan, const CollectiveSpec& spec, void* buf,
                               cudaStream_t caller_stream, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const std::string where = prefix(p2p_, spec);
  if (auto reason = p2p_.async_error()) {
    throw Error(where + ": the process group was aborted earlier and cannot be used any more: " +
                *reason);
  }
  DeviceGuard guard(device_);
  const size_t elem = dtype_size(spec.dtype);
  auto* bytes = static_cast<uint8_t*>(buf);
  GpuCompletion done;
  try {
    cuda_check(cudaEventRecord(caller_ready_, caller_stream), where + ": cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, caller_ready_, 0), where + ": cudaStreamWaitEvent");

    // One scratch block sized for the largest step.
    size_t scratch_need = 0;
    for (const PlanStep& step : plan.steps) {
      size_t pos = 0;
      for (const PlanOp& r : step.recvs) {
        if (r.count == 0 || !(r.reduce || r.staged || r.follows_send >= 0)) continue;
        pos = align_like(pos, r.offset * elem) + r.count * elem;
      }
      scratch_need = std::max(scratch_need, pos);
    }
    auto* scratch_base = static_cast<uint8_t*>(scratch_need ? scratch(scratch_need) : nullptr);

    std::vector<ScratchRecv> scratch_recvs;
    for (size_t step_index = 0; step_index < plan.steps.size(); ++step_index) {
      const PlanStep& step = plan.steps[step_index];
      scratch_recvs.clear();
      p2p_.group_start();
      for (const PlanOp& s : step.sends) {
        if (s.count == 0) continue;
        p2p_.send(bytes + s.offset * elem, s.count * elem, s.peer, stream_);
        stats_.bytes_sent += s.count * elem;
      }
      size_t pos = 0;
      for (size_t i = 0; i < step.recvs.size(); ++i) {
        const PlanOp& r = step.recvs[i];
        if (r.count == 0) continue;
        if (r.reduce || r.staged || r.follows_send >= 0) {
          pos = align_like(pos, r.offset * elem);
          scratch_recvs.push_back({i, pos});
          p2p_.recv(scratch_base + pos, r.count * elem, r.peer, stream_);
          pos += r.count * elem;
        } else {
          p2p_.recv(bytes + r.offset * elem, r.count * elem, r.peer, stream_);
        }
        stats_.bytes_received += r.count * elem;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      p2p_.group_end(std::max(left, std::chrono::milliseconds(1)));
      // The group is complete on the stream: apply what landed in scratch.
      for (const ScratchRecv& sr : scratch_recvs) {
        const PlanOp& r = step.recvs[sr.op_index];
        uint8_t* dst = bytes + r.offset * elem;
        const uint8_t* src = scratch_base + sr.scratch_offset;
        if (r.reduce) {
          reduce_into(spec.dtype, spec.op, dst, src, r.count, stream_);
          stats_.reduce_kernels += 1;
        } else {
          cuda_check(cudaMemcpyAsync(dst, src, r.count * elem, cudaMemcpyDeviceToDevice, stream_),
                     "cudaMemcpyAsync (staged receive)");
        }
      }
    }

    cudaEvent_t ev = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    done.event_.reset(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
    cuda_check(cudaEventRecord(ev, stream_), "cudaEventRecord (completion)");
  } catch (const Error& e) {
    const std::string msg = e.what();
    const std::string full = msg.rfind(where, 0) == 0 ? msg : where + ": " + msg;
    p2p_.abort(full);
    if (dynamic_cast<const TimeoutError*>(&e) != nullptr) throw TimeoutError(full);
    throw Error(full);
  }
  stats_.runs += 1;
  stats_.enqueue_s += std::chrono::duration<double>(Clock::now() - start).count();
  return done;
}

void GpuExecutor::wait(const GpuCompletion& done, const CollectiveSpec& spec,
                       std::chrono::milliseconds timeout) {
  const std::string where = prefix(p2p_, spec);
  const auto start = Clock::now();
  auto sleep = std::chrono::microseconds(1);
  while (true) {
    bool finished = false;
    try {
      finished = done.query();
    } catch (const Error& e) {
      p2p_.abort(where + ": " + e.what());
      throw Error(where + ": " + e.what());
    }
    if (finished) return;
    if (auto reason = p2p_.async_error()) {
      p2p_.abort(*reason);
      throw Error(where + ": aborted: " + *reason);
    }
    const auto now = Clock::now();
    if (now - start >= timeout) {
      std::ostringstream m;
      m << where << ": timed out after "
        << std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count() / 1000.0
        << " s waiting for the collective to finish on the GPU";
      p2p_.abort(m.str());
      throw TimeoutError(m.str());
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace stragg::gpu
