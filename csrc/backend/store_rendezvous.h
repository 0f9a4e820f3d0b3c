// stragg::Rendezvous on top of a c10d Store (the one torch.distributed hands to the backend).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "runtime/rendezvous.h"

namespace stragg {

class StoreRendezvous final : public Rendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  std::optional<std::string> get(const std::string& key,
                                 std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
    } catch (const c10::DistError&) {
      return std::nullopt;  // timed out (or the store went away): the caller names who is missing
    }
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }

  bool check(const std::string& key) override {
    try {
      return store_->check({key});
    } catch (const c10::DistError&) {
      return false;
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace stragg
