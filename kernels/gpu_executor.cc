#include "kernels/gpu_executor.h"

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "common/error.h"
#include "runtime/dtype.h"

namespace stragg::gpu {
namespace {

using Clock = std::chrono::steady_clock;

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

bool lands_in_scratch(const LoweredOp& r) { return r.reduce || r.staged || r.follows_send >= 0; }

// Bytes of scratch the largest step needs.
size_t scratch_needed(const LoweredSchedule& plan, size_t elem) {
  size_t need = 0;
  for (const LoweredStep& step : plan.steps) {
    size_t pos = 0;
    for (const LoweredOp& r : step.recvs) {
      if (r.count == 0 || !lands_in_scratch(r)) continue;
      pos = align_like(pos, r.offset * elem) + r.count * elem;
    }
    need = std::max(need, pos);
  }
  return need;
}

struct ScratchRecv {
  size_t op_index;
  size_t scratch_offset;
};

}  // namespace

bool GpuCompletion::query() const {
  if (!event_) return true;
  return device_->query(event_.get());
}

void GpuCompletion::stream_wait(Stream stream) const {
  if (!event_) return;
  device_->wait_event(stream, event_.get());
}

GpuExecutor::GpuExecutor(GpuP2P& p2p, Device& device)
    : p2p_(p2p), dev_(device), device_(p2p.device()) {
  const std::string where = "stragg: rank " + std::to_string(p2p.rank()) + ": gpu executor";
  try {
    DeviceGuard guard(dev_, device_);
    stream_ = dev_.create_stream();
    caller_ready_ = dev_.create_event();
  } catch (const Error& e) {
    if (stream_ != nullptr) dev_.destroy_stream(stream_);
    throw Error(where + ": " + e.what());
  }
}

GpuExecutor::~GpuExecutor() {
  // Best effort, never throws. Work still enqueued keeps running; the device releases the stream
  // and the scratch allocation once it is done.
  try {
    DeviceGuard guard(dev_, device_);
    if (scratch_ != nullptr) dev_.free_async(scratch_, stream_);
    if (caller_ready_ != nullptr) dev_.destroy_event(caller_ready_);
    if (stream_ != nullptr) dev_.destroy_stream(stream_);
  } catch (...) {
  }
}

void* GpuExecutor::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Stream-ordered: the old block is released after the work that uses it, and nothing here
  // waits for the device (a blocking free could hang on a stalled peer).
  size_t want = std::max(bytes, scratch_bytes_ * 2);
  want = (want + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
  if (scratch_ != nullptr) {
    dev_.free_async(scratch_, stream_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  scratch_ = dev_.alloc_async(want, stream_);
  scratch_bytes_ = want;
  return scratch_;
}

// One p2p group per step, then the kernels / copies of the receives that landed in scratch.
void GpuExecutor::enqueue_steps(const LoweredSchedule& plan, const CollectiveSpec& spec,
                                uint8_t* bytes, Clock::time_point deadline) {
  const size_t elem = dtype_size(spec.dtype);
  const size_t need = scratch_needed(plan, elem);
  auto* scratch_base = static_cast<uint8_t*>(need ? scratch(need) : nullptr);
  std::vector<ScratchRecv> scratch_recvs;
  for (const LoweredStep& step : plan.steps) {
    scratch_recvs.clear();
    p2p_.group_start();
    for (const LoweredOp& s : step.sends) {
      if (s.count == 0) continue;
      p2p_.send(bytes + s.offset * elem, s.count * elem, s.peer, stream_);
      stats_.bytes_sent += s.count * elem;
    }
    size_t pos = 0;
    for (size_t i = 0; i < step.recvs.size(); ++i) {
      const LoweredOp& r = step.recvs[i];
      if (r.count == 0) continue;
      if (lands_in_scratch(r)) {
        pos = align_like(pos, r.offset * elem);
        scratch_recvs.push_back({i, pos});
        p2p_.recv(scratch_base + pos, r.count * elem, r.peer, stream_);
        pos += r.count * elem;
      } else {
        p2p_.recv(bytes + r.offset * elem, r.count * elem, r.peer, stream_);
      }
      stats_.bytes_received += r.count * elem;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    p2p_.group_end(std::max(left, std::chrono::milliseconds(1)));
    // The group is complete on the stream: apply what landed in scratch.
    for (const ScratchRecv& sr : scratch_recvs) {
      const LoweredOp& r = step.recvs[sr.op_index];
      uint8_t* dst = bytes + r.offset * elem;
      const uint8_t* src = scratch_base + sr.scratch_offset;
      if (r.reduce) {
        dev_.reduce_into(spec.dtype, spec.op, dst, src, r.count, stream_);
        stats_.reduce_kernels += 1;
      } else {
        dev_.copy_async(dst, src, r.count * elem, stream_);  // staged overwrite
      }
    }
  }
}

GpuCompletion GpuExecutor::run(const LoweredSchedule& plan, const CollectiveSpec& spec, void* buf,
                               Stream caller_stream, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const std::string where = prefix(p2p_, spec);
  if (auto reason = p2p_.async_error()) {
    throw Error(where +
                ": the process group was aborted earlier and cannot be used any more: " + *reason);
  }
  p2p_.announce_arrival(spec.op_name, spec.seq);
  GpuCompletion done;
  try {
    DeviceGuard guard(dev_, device_);
    dev_.record(caller_ready_, caller_stream);
    dev_.wait_event(stream_, caller_ready_);
    enqueue_steps(plan, spec, static_cast<uint8_t*>(buf), start + timeout);
    Event ev = dev_.create_event();
    Device* dev = &dev_;
    done.event_.reset(ev, [dev](Event e) { dev->destroy_event(e); });
    done.device_ = dev;
    dev_.record(ev, stream_);
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
    if (auto reason = p2p_.async_error()) {
      p2p_.abort(*reason);
      throw Error(where + ": aborted: " + *reason);
    }
    if (finished) return;
    const auto now = Clock::now();
    if (now - start >= timeout) {
      std::ostringstream m;
      m << where << ": timed out after "
        << std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count() / 1000.0
        << " s waiting for the collective to finish on the device"
        << p2p_.missing_ranks(spec.op_name, spec.seq);
      p2p_.abort(m.str());
      throw TimeoutError(m.str());
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace stragg::gpu
