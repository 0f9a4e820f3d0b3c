// Helpers for the tests that run the GPU executor on host devices: a group of in-process ranks
// (one HostDevice each, one HostP2PGroup), rank threads whose failures are collected instead of
// terminating the process, and a latch to hold a stream's work until the test releases it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/gpu_executor.h"
#include "kernels/host/host_device.h"
#include "kernels/host/host_p2p.h"

namespace stragg::gpu::testing {

using namespace std::chrono_literals;

// The group outlives the devices (declared first): streams may copy into staging until the
// devices stop them.
struct HostGroup {
  explicit HostGroup(int n, size_t slot_bytes = 4096, int slots = 2, host::VirtualGrid grid = {})
      : group(n, slot_bytes, slots) {
    for (int r = 0; r < n; ++r) devices.push_back(std::make_unique<host::HostDevice>(r, grid));
  }
  // Every device stops before any is destroyed: their streams wait on each other's events.
  ~HostGroup() {
    for (auto& d : devices) d->stop();
  }
  host::HostP2PGroup group;
  std::vector<std::unique_ptr<host::HostDevice>> devices;
};

// Runs fn(rank) on n threads; returns each rank's failure ("" when it returned normally).
inline std::vector<std::string> run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty exception message)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// A gate that stream work can block on until the test opens it.
class Latch {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Blocks until open() or `limit` passed (so a failing test cannot hang the suite).
  void wait(std::chrono::milliseconds limit = 30s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, limit, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace stragg::gpu::testing
