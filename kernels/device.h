// The device interface of the GPU executor (no torch, no CUDA): streams, events, stream-ordered
// memory, copies and the reduction kernels. Two implementations:
//   * CudaDevice (cuda_device.h): the CUDA runtime and the kernels of reduce_kernels.cu;
//   * HostDevice (host/host_device.h): threads as in-order streams, host memory, events as
//     counters, and the same kernels' element loop run on the host. CI runs the executor and the
//     staged p2p protocol on it, with no GPU.
//
// Handles are CUDA's own types, declared here without CUDA's headers: Stream is cudaStream_t and
// Event is cudaEvent_t (both pointers to opaque structs), so CUDA code passes its handles through
// unchanged. The host implementation uses the same pointer types as opaque handles to its own
// objects. nullptr as a Stream is the device's default stream.
//
// Semantics (CUDA's): work enqueued on one stream runs in order; record(e, s) captures the work
// enqueued on s so far, wait_event(s, e) makes later work on s wait for the last capture of e at
// the time of the call (an event never recorded does not wait); query(e) says whether the last
// capture has completed. Errors throw stragg::Error: at enqueue time for invalid arguments, from
// query() for failures of work that ran asynchronously.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

struct CUstream_st;
struct CUevent_st;

namespace stragg::gpu {

using Stream = CUstream_st*;  // cudaStream_t
using Event = CUevent_st*;    // cudaEvent_t

class Device {
 public:
  virtual ~Device() = default;

  virtual const char* name() const = 0;

  // The device of the calling thread (CUDA: cudaGetDevice / cudaSetDevice).
  virtual int current_device() = 0;
  virtual void set_current_device(int device) = 0;

  // A stream that does not synchronise with the default stream (cudaStreamNonBlocking).
  virtual Stream create_stream() = 0;
  virtual void destroy_stream(Stream s) noexcept = 0;

  // An event without timing (cudaEventDisableTiming).
  virtual Event create_event() = 0;
  virtual void destroy_event(Event e) noexcept = 0;
  virtual void record(Event e, Stream s) = 0;
  virtual void wait_event(Stream s, Event e) = 0;
  // True once the last capture of e completed; throws stragg::Error for a failure of that work.
  virtual bool query(Event e) = 0;

  // Stream-ordered allocation: usable by work enqueued on s afterwards; freed after the work
  // enqueued on s before free_async.
  virtual void* alloc_async(size_t bytes, Stream s) = 0;
  virtual void free_async(void* p, Stream s) noexcept = 0;

  // dst = src (device memory, no overlap), enqueued on s.
  virtual void copy_async(void* dst, const void* src, size_t bytes, Stream s) = 0;

  // The reduction kernels (same contracts as gpu::reduce_into / scale / divide in
  // reduce_kernels.h), enqueued on s.
  virtual void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count,
                           Stream s) = 0;
  virtual void scale(DType t, void* buf, size_t count, double factor, Stream s) = 0;
  virtual void divide(DType t, void* buf, size_t count, int64_t divisor, Stream s) = 0;
};

// Makes `device` current on `dev` for the scope and restores the previous one afterwards.
class DeviceGuard {
 public:
  DeviceGuard(Device& dev, int device) : dev_(dev), previous_(dev.current_device()) {
    if (previous_ != device) dev_.set_current_device(device);
  }
  ~DeviceGuard() {
    try {
      dev_.set_current_device(previous_);
    } catch (...) {  // best effort: destructors do not throw
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Device& dev_;
  int previous_;
};

}  // namespace stragg::gpu
