// stragg::Rendezvous on top of a c10d Store (the one torch.distributed hands to the backend).
// A wait that runs out of time is a timeout (std::nullopt); every other store failure
// (connection refused, reset or closed: the store's host is gone) raises stragg::StoreError at
// once, naming the store and torch's error. StoreInfo: what the Python creator knows of that store.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "common/error.h"
#include "common/rendezvous.h"

namespace stragg {

// What the Python creator knows about the store behind the group's.
struct StoreInfo {
  std::string host;              // TCPStore host / MASTER_ADDR (picks the TCP address); may be ""
  std::string description;       // "the TCPStore at host:port", for messages
  bool hosted_by_rank0 = false;  // rank 0's process hosts it (see Rendezvous::hosted_by_rank0)
};

class StoreRendezvous final : public Rendezvous {
 public:
  // `description`: "the TCPStore at host:port" (for messages); `hosted_by_rank0`: see
  // Rendezvous::hosted_by_rank0().
  explicit StoreRendezvous(c10::intrusive_ptr<c10d::Store> store, std::string description = "",
                           bool hosted_by_rank0 = false)
      : store_(std::move(store)),
        description_(description.empty() ? "the rendezvous store" : std::move(description)),
        hosted_by_rank0_(hosted_by_rank0) {}

  void set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const c10::Error& e) {
      throw failed(e);
    }
  }

  std::optional<std::string> get(const std::string& key,
                                 std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
    } catch (const c10::DistStoreError& e) {
      if (is_timeout(e)) return std::nullopt;  // the caller names who is missing
      throw failed(e);
    } catch (const c10::Error& e) {
      throw failed(e);
    }
    try {
      auto v = store_->get(key);
      return std::string(v.begin(), v.end());
    } catch (const c10::Error& e) {
      throw failed(e);
    }
  }

  bool check(const std::string& key) override {
    try {
      return store_->check({key});
    } catch (const c10::Error& e) {
      throw failed(e);
    }
  }

  std::string describe() const override { return description_; }
  bool hosted_by_rank0() const override { return hosted_by_rank0_; }

 private:
  static bool is_timeout(const c10::Error& e) {
    std::string m = e.msg();
    std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
    return m.find("timeout") != std::string::npos || m.find("timed out") != std::string::npos;
  }

  // torch's message without its backtrace, first line only.
  StoreError failed(const c10::Error& e) const {
    std::string m = e.msg();
    m = m.substr(0, m.find('\n'));
    return StoreError("lost " + description_ + ": " + m);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string description_;
  bool hosted_by_rank0_;
};

}  // namespace stragg
