// Key-value rendezvous used to set up transports (no torch here). The backend implements it on
// top of the c10d Store; tests implement it in memory.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace stragg {

// Every operation throws stragg::StoreError (naming the store and the underlying error) when the
// store itself fails; only get() running out of time is not an error.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until `key` exists, then returns its value; std::nullopt on timeout.
  virtual std::optional<std::string> get(const std::string& key,
                                         std::chrono::milliseconds timeout) = 0;
  // True if `key` exists now (never blocks).
  virtual bool check(const std::string& key) = 0;
  // For messages: "the TCPStore at 10.0.0.1:29500".
  virtual std::string describe() const { return "the rendezvous store"; }
  // True when rank 0's process hosts the store (MASTER_ADDR or a tcp:// init_method without
  // torchrun's agent store) and this is the default group's setup: then rank 0 enters stragg's
  // setup only after every process connected to the store, so while a process never starts
  // rank 0 is missing too (it waits in torch's TCPStore); exchange_all names only the absent
  // process then, until rank 0's first record arrived (rank0_joined).
  virtual bool hosted_by_rank0() const { return false; }

  // Whether a record of rank 0 arrived through this rendezvous (exchange_all notes it): rank 0
  // is past torch's TCPStore wait, so later exchanges name it like any other rank.
  bool rank0_joined() const { return rank0_joined_.load(std::memory_order_relaxed); }
  void note_rank0_joined() { rank0_joined_.store(true, std::memory_order_relaxed); }

 private:
  // Atomic: in-memory test rendezvous are shared by the threads that play the ranks.
  std::atomic<bool> rank0_joined_{false};
};

// Every rank publishes `value` under "<prefix>/<rank>" and collects everybody's values, in rank
// order. Throws stragg::TimeoutError naming the ranks that did not publish in time (never this
// rank), e.g. "stragg: rank 0: <what> timed out after 30 s: rank 3 did not join" (where rank 0
// hosts the store and is missing with others, only the others: see hosted_by_rank0), and
// stragg::StoreError at once when the store fails, naming it and the underlying error.
std::vector<std::string> exchange_all(Rendezvous& rdv, const std::string& prefix, int rank,
                                      int size, const std::string& value,
                                      std::chrono::milliseconds timeout, const std::string& what);

// "rank 3" or "ranks [1, 3]" (setup and transport messages).
std::string ranks_list(const std::vector<int>& ranks);

}  // namespace stragg
