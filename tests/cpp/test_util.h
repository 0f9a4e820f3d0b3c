// Helpers for runtime tests: an in-memory rendezvous shared by threads that play the ranks.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/rendezvous.h"

namespace stragg::testing {

class InMemoryRendezvous : public Rendezvous {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
    cv_.notify_all();
  }
  std::optional<std::string> get(const std::string& key,
                                 std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return kv_.count(key) > 0; })) return std::nullopt;
    return kv_[key];
  }
  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return kv_.count(key) > 0;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

// Runs fn(rank) on `size` threads and joins them.
inline void run_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

}  // namespace stragg::testing
