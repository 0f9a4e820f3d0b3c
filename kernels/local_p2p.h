// The point-to-point layer of a one-rank group (no torch; no CUDA headers): nothing to move, so
// the GPU executor of such a group only provides its stream. send() and recv() throw; abort()
// keeps the first reason for async_error().
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>

#include "common/error.h"
#include "kernels/gpu_p2p.h"

namespace stragg::gpu {

class LocalP2P final : public GpuP2P {
 public:
  explicit LocalP2P(int device) : device_(device) {}
  const char* name() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int device() const override { return device_; }
  void group_start() override {}
  void send(const void*, size_t, int peer, Stream) override {
    throw Error("stragg: local p2p: send to peer " + std::to_string(peer) + " in a one-rank group");
  }
  void recv(void*, size_t, int peer, Stream) override {
    throw Error("stragg: local p2p: recv from peer " + std::to_string(peer) + " in a one-rank group");
  }
  void group_end(std::chrono::milliseconds) override {}
  std::optional<std::string> async_error() override {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reason_) reason_ = reason;
  }

 private:
  int device_;
  std::mutex mu_;
  std::optional<std::string> reason_;
};

}  // namespace stragg::gpu
