#include "kernels/host/host_device.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>

#include "common/error.h"
#include "kernels/reduce_launch.h"

namespace stragg::gpu::host {

struct HostEvent {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records enqueued
  uint64_t completed = 0;  // the latest record the streams have reached
};

struct HostStream {
  struct Task {
    std::function<void()> fn;
    bool always;  // runs even after a fault (frees)
  };
  std::mutex mu;
  std::condition_variable cv;  // new tasks, finished tasks, stop
  std::deque<Task> queue;
  uint64_t pushed = 0;
  uint64_t finished = 0;
  bool stop = false;
  std::thread worker;
};

namespace {

HostEvent* event_of(Event e) { return reinterpret_cast<HostEvent*>(e); }

constexpr size_t kAlign = 256;  // like cudaMalloc's alignment

}  // namespace

HostDevice::HostDevice(int index, VirtualGrid grid) : index_(index), grid_(grid) {
  default_stream_ = stream_of(create_stream());
}

HostDevice::~HostDevice() { stop(); }

void HostDevice::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  // Streams stop before waits are released, so no stream runs work queued after a released wait.
  for (auto& hs : streams_) {
    {
      std::lock_guard<std::mutex> l(hs->mu);
      hs->stop = true;
    }
    hs->cv.notify_all();
  }
  stopping_.store(true);
  for (auto& hs : streams_) {
    if (hs->worker.joinable()) hs->worker.join();
  }
}

void HostDevice::set_current_device(int device) {
  if (device != index_) {
    throw Error("stragg: host device " + std::to_string(index_) + ": cannot switch to device " +
                std::to_string(device) + " (one host device per rank)");
  }
}

HostStream* HostDevice::stream_of(Stream s) {
  return s == nullptr ? default_stream_ : reinterpret_cast<HostStream*>(s);
}

Stream HostDevice::create_stream() {
  if (stopping_.load()) {
    throw Error("stragg: host device " + std::to_string(index_) + ": stopped");
  }
  auto hs = std::make_unique<HostStream>();
  HostStream* p = hs.get();
  p->worker = std::thread(&HostDevice::run_stream, this, p);
  std::lock_guard<std::mutex> lock(mu_);
  streams_.push_back(std::move(hs));
  return reinterpret_cast<Stream>(p);
}

// Streams and events live as long as the device (work of other ranks may still refer to them).
void HostDevice::destroy_stream(Stream) noexcept {}
void HostDevice::destroy_event(Event) noexcept {}

Event HostDevice::create_event() {
  auto ev = std::make_unique<HostEvent>();
  HostEvent* p = ev.get();
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(ev));
  return reinterpret_cast<Event>(p);
}

void HostDevice::run_stream(HostStream* hs) {
  while (true) {
    HostStream::Task task;
    bool skip = false;
    {
      std::unique_lock<std::mutex> lock(hs->mu);
      hs->cv.wait(lock, [&] { return hs->stop || !hs->queue.empty(); });
      if (hs->stop) {
        // Remaining work is dropped, like a destroyed GPU context's; its memory is released
        // (the frees queued behind it), as the driver does at context teardown.
        std::deque<HostStream::Task> left;
        left.swap(hs->queue);
        lock.unlock();
        for (auto& t : left) {
          if (t.always) t.fn();
        }
        return;
      }
      task = std::move(hs->queue.front());
      hs->queue.pop_front();
    }
    {
      std::lock_guard<std::mutex> lock(fault_mu_);
      skip = fault_.has_value() && !task.always;
    }
    if (!skip) {
      try {
        task.fn();
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(fault_mu_);
        if (!fault_) fault_ = e.what();
      }
    }
    tasks_run_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(hs->mu);
      hs->finished += 1;
    }
    hs->cv.notify_all();
  }
}

void HostDevice::push(HostStream* hs, std::function<void()> fn, bool always) {
  {
    std::lock_guard<std::mutex> lock(hs->mu);
    hs->queue.push_back({std::move(fn), always});
    hs->pushed += 1;
  }
  hs->cv.notify_all();
}

void HostDevice::record(Event e, Stream s) {
  HostEvent* ev = event_of(e);
  uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    gen = ++ev->recorded;
  }
  push(
      stream_of(s),
      [ev, gen] {
        {
          std::lock_guard<std::mutex> lock(ev->mu);
          ev->completed = std::max(ev->completed, gen);
        }
        ev->cv.notify_all();
      },
      /*always=*/false);
}

void HostDevice::wait_event(Stream s, Event e) {
  HostEvent* ev = event_of(e);
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    target = ev->recorded;
  }
  if (target == 0) return;  // never recorded: nothing to wait for
  push(
      stream_of(s),
      [this, ev, target] {
        std::unique_lock<std::mutex> lock(ev->mu);
        while (ev->completed < target && !stopping_.load()) {
          ev->cv.wait_for(lock, std::chrono::milliseconds(10));
        }
      },
      /*always=*/false);
}

void HostDevice::throw_if_faulted() {
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (fault_) throw Error("stragg: host device " + std::to_string(index_) + ": " + *fault_);
}

bool HostDevice::query(Event e) {
  throw_if_faulted();
  HostEvent* ev = event_of(e);
  std::lock_guard<std::mutex> lock(ev->mu);
  return ev->completed >= ev->recorded;
}

void* HostDevice::alloc_async(size_t bytes, Stream) {
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p == nullptr) {
    throw Error("stragg: host device " + std::to_string(index_) + ": out of memory allocating " +
                std::to_string(bytes) + " bytes");
  }
  return p;
}

void HostDevice::free_async(void* p, Stream s) noexcept {
  try {
    push(stream_of(s), [p] { std::free(p); }, /*always=*/true);
  } catch (...) {  // out of memory queueing the free: leak rather than free too early
  }
}

void HostDevice::copy_async(void* dst, const void* src, size_t bytes, Stream s) {
  push(stream_of(s), [dst, src, bytes] { std::memcpy(dst, src, bytes); }, /*always=*/false);
}

void HostDevice::reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count,
                             Stream s) {
  check_reduce_args(t, op, dst, dst, src, count);  // at enqueue time, like a CUDA launch
  if (count == 0) return;
  const VirtualGrid g = grid_;
  push(stream_of(s), [=] { host::reduce_into(t, op, dst, src, count, g); }, /*always=*/false);
}

void HostDevice::scale(DType t, void* buf, size_t count, double factor, Stream s) {
  check_scale_args(t, buf, count);
  if (count == 0) return;
  const VirtualGrid g = grid_;
  push(stream_of(s), [=] { host::scale(t, buf, count, factor, g); }, /*always=*/false);
}

void HostDevice::divide(DType t, void* buf, size_t count, int64_t divisor, Stream s) {
  check_divide_args(t, buf, count, divisor);
  if (count == 0) return;
  const VirtualGrid g = grid_;
  push(stream_of(s), [=] { host::divide(t, buf, count, divisor, g); }, /*always=*/false);
}

void HostDevice::enqueue(Stream s, std::function<void()> fn) {
  push(stream_of(s), std::move(fn), /*always=*/false);
}

void HostDevice::synchronize(Stream s) {
  HostStream* hs = stream_of(s);
  std::unique_lock<std::mutex> lock(hs->mu);
  const uint64_t target = hs->pushed;
  hs->cv.wait(lock, [&] { return hs->stop || hs->finished >= target; });
  lock.unlock();
  throw_if_faulted();
}

}  // namespace stragg::gpu::host
