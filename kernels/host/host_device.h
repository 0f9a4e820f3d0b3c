// The Device interface (kernels/device.h) on the host, so that the GPU executor and the staged p2p
// protocol run in CI without a GPU (no torch, no CUDA).
//
//  * A stream is a thread running an in-order queue of tasks. Work enqueued on it (copies,
//    kernels, event records and waits, frees) runs in order, asynchronously to the caller.
//  * An event is a pair of counters: record() bumps `recorded` at enqueue time and the stream
//    sets `completed` when it reaches the record; wait_event() makes the stream block until
//    `completed` reaches the value `recorded` had at the call (CUDA's "last capture" rule); query()
//    compares them. Events work across HostDevices (in-process ranks wait on each other's).
//  * Memory is host memory; "kernels" run kernels/host/host_kernels.h (the CUDA kernels' element
//    loop over the shared functors) on the stream thread.
//  * A task that throws is a kernel fault and puts the device in an error state (CUDA's sticky
//    error): its streams skip all remaining work, event records included (so other devices
//    waiting on its events wait until they are aborted, as across CUDA processes), and query()
//    and synchronize() throw the fault.
// Handles are pointers to this device's objects cast to CUDA's handle types (device.h). Streams
// and events live until the device is destroyed. stop() (also run by the destructor) stops every
// stream, dropping the work still queued and releasing waits that would never end (like a GPU's
// queue after an abort), and joins the threads. Devices whose streams wait on each other's events
// (in-process ranks) must all be stopped before any of them is destroyed.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/host/host_kernels.h"

namespace stragg::gpu::host {

struct HostStream;
struct HostEvent;

class HostDevice final : public Device {
 public:
  explicit HostDevice(int index = 0, VirtualGrid grid = {});
  ~HostDevice() override;
  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;

  const char* name() const override { return "host"; }
  int current_device() override { return index_; }
  void set_current_device(int device) override;

  Stream create_stream() override;
  void destroy_stream(Stream s) noexcept override;
  Event create_event() override;
  void destroy_event(Event e) noexcept override;
  void record(Event e, Stream s) override;
  void wait_event(Stream s, Event e) override;
  bool query(Event e) override;

  void* alloc_async(size_t bytes, Stream s) override;
  void free_async(void* p, Stream s) noexcept override;
  void copy_async(void* dst, const void* src, size_t bytes, Stream s) override;

  void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count,
                   Stream s) override;
  void scale(DType t, void* buf, size_t count, double factor, Stream s) override;
  void divide(DType t, void* buf, size_t count, int64_t divisor, Stream s) override;

  // Host-only, for tests: enqueue arbitrary work (a "kernel" of the caller: a producer that
  // fills a buffer, a consumer, a fault that throws), and block until a stream ran everything
  // enqueued so far (throws the stream's error, if any).
  void enqueue(Stream s, std::function<void()> fn);
  void synchronize(Stream s);  // throws the device's fault, if any
  // Stops every stream (idempotent); the device accepts no new streams afterwards.
  void stop();
  // Tasks run so far on all streams of this device.
  uint64_t tasks_run() const { return tasks_run_.load(); }

 private:
  HostStream* stream_of(Stream s);
  void push(HostStream* hs, std::function<void()> fn, bool always);
  void run_stream(HostStream* hs);
  void throw_if_faulted();

  int index_;
  VirtualGrid grid_;
  std::mutex mu_;  // guards the lists below
  std::vector<std::unique_ptr<HostStream>> streams_;
  std::vector<std::unique_ptr<HostEvent>> events_;
  HostStream* default_stream_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::mutex fault_mu_;
  std::optional<std::string> fault_;  // sticky: the first task that threw
  std::atomic<uint64_t> tasks_run_{0};
};

}  // namespace stragg::gpu::host
