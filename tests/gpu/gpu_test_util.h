// Helpers for the GPU tests: a file-backed Rendezvous for forked ranks, a fork/join harness and a
// device-count probe that does not initialise CUDA in the calling process (a process that has
// initialised CUDA must not fork children that use CUDA).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/rendezvous.h"

// Skips the test without a GPU, or fails it when STRAGG_TEST_REQUIRE=1 (the GPU machine's run of
// tests/gpu/run_gpu_checks.sh: a check that silently skipped there would pass without running).
#define STRAGG_SKIP_WITHOUT_GPU(have_gpu)                                                  \
  do {                                                                                     \
    if (!(have_gpu)) {                                                                     \
      const char* req = std::getenv("STRAGG_TEST_REQUIRE");                                \
      if (req != nullptr && std::string(req) == "1") FAIL() << "no CUDA device (required)"; \
      GTEST_SKIP() << "no CUDA device";                                                    \
    }                                                                                      \
  } while (0)

namespace stragg::gpu::testing {

// Counters of the running test (elements compared, mismatches, ...), recorded as its properties
// when the Tally goes out of scope, so that they appear in GoogleTest's JSON report
// (tests/gpu/run_gpu_checks.sh sums them into summary.json). One Tally per test, in the test's
// own process; add() without one counts nothing.
class Tally {
 public:
  explicit Tally(std::initializer_list<const char*> keys) {
    for (const char* key : keys) counts_[key] = 0;
    current_ = this;
  }
  ~Tally() {
    current_ = nullptr;
    for (const auto& [key, value] : counts_) {
      ::testing::Test::RecordProperty(key, std::to_string(value));
    }
  }
  Tally(const Tally&) = delete;
  Tally& operator=(const Tally&) = delete;
  static void add(const std::string& key, size_t n) {
    if (current_ != nullptr) current_->counts_[key] += n;
  }
  size_t get(const std::string& key) const {
    const auto it = counts_.find(key);
    return it == counts_.end() ? 0 : it->second;
  }

 private:
  static inline Tally* current_ = nullptr;
  std::map<std::string, size_t> counts_;
};

// Keys are files in a directory (written to a temporary name, then renamed: readers never see a
// partial value). Works across fork()ed processes.
class FileRendezvous : public Rendezvous {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}
  void set(const std::string& key, const std::string& value) override {
    const std::string path = file(key);
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      f << value;
    }
    std::rename(tmp.c_str(), path.c_str());
  }
  std::optional<std::string> get(const std::string& key,
                                 std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      std::ifstream f(file(key), std::ios::binary);
      if (f) {
        std::stringstream s;
        s << f.rdbuf();
        return s.str();
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  bool check(const std::string& key) override {
    struct stat st;
    return ::stat(file(key).c_str(), &st) == 0;
  }

 private:
  std::string file(const std::string& key) const {
    std::string name = key;
    for (char& c : name)
      if (c == '/') c = '_';
    return dir_ + "/" + name;
  }
  std::string dir_;
};

inline std::string make_temp_dir() {
  char tmpl[] = "/tmp/stragg-gpu-test-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? std::string(d) : std::string("/tmp");
}

// Runs fn(rank) in `size` forked children; returns one line per failed rank ("" if all passed).
// A child reports failure by returning non-zero or throwing (the message goes to stderr).
inline std::string fork_ranks(int size, const std::function<int(int)>& fn, int timeout_s = 120) {
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int rc = 1;
      try {
        ::alarm(static_cast<unsigned>(timeout_s));  // a hung child dies instead of hanging CI
        rc = fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 3;
      }
      std::fflush(stderr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  std::string failures;
  for (int r = 0; r < size; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failures += "rank " + std::to_string(r) + ": " +
                  (WIFEXITED(status) ? "exit code " + std::to_string(WEXITSTATUS(status))
                                     : "killed by signal " + std::to_string(WTERMSIG(status))) +
                  "\n";
    }
  }
  return failures;
}

// Number of CUDA devices, probed in a child so that this process stays CUDA-free.
inline int device_count_without_init() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    ::_exit(n > 100 ? 100 : n);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// Number of CUDA devices (initialises CUDA in this process); 0 when there is no usable driver.
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace stragg::gpu::testing
