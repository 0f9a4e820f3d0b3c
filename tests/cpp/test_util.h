// Helpers for runtime tests: an in-memory rendezvous shared by threads that play the ranks.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/rendezvous.h"

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

// A rendezvous in a directory, for ranks in different processes.
class FileRendezvous : public Rendezvous {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}
  void set(const std::string& key, const std::string& value) override {
    const std::string tmp = path(key) + ".tmp" + std::to_string(getpid());
    { std::ofstream(tmp) << value; }
    std::rename(tmp.c_str(), path(key).c_str());
  }
  std::optional<std::string> get(const std::string& key,
                                 std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!check(key)) {
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::ifstream in(path(key));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bool check(const std::string& key) override {
    struct stat st;
    return ::stat(path(key).c_str(), &st) == 0;
  }

 private:
  std::string path(const std::string& key) const {
    std::string k = key;
    for (char& ch : k) ch = ch == '/' ? '_' : ch;
    return dir_ + "/" + k;
  }
  std::string dir_;
};

// Polls `pred` for up to 30 s; true once it holds.
template <class Pred>
bool eventually_true(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

// Runs fn(rank) on `size` threads and joins them.
inline void run_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

}  // namespace stragg::testing
