// Key-value rendezvous used to set up transports (no torch here). The backend implements it on
// top of the c10d Store; tests implement it in memory.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace stragg {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists, then returns its value; std::nullopt on timeout.
  virtual std::optional<std::string> get(const std::string& key,
                                         std::chrono::milliseconds timeout) = 0;
  // True if `key` exists now (never blocks).
  virtual bool check(const std::string& key) = 0;
};

// Every rank publishes `value` under "<prefix>/<rank>" and collects everybody's values, in rank
// order. Throws stragg::TimeoutError naming the ranks that did not publish in time, e.g.
// "stragg: rank 0: <what> timed out after 30 s: ranks [3] did not join".
std::vector<std::string> exchange_all(Rendezvous& rdv, const std::string& prefix, int rank,
                                      int size, const std::string& value,
                                      std::chrono::milliseconds timeout, const std::string& what);

}  // namespace stragg
