// What a rank does while it waits and nothing moves (no torch here): the one place where an
// executor decides that a collective failed because of another rank's abort, a dead peer or the
// deadline, and the diagnosis that names who stopped the group.
//
// Naming the right rank. At the deadline a rank does not blame the peer it happens to wait for
// (in a Ring every rank waits for its left neighbour, so a stopped rank's victims would blame
// each other). It reads every peer's published Progress and PeerStatus (transport.h) and follows
// the wait-for graph from the peers it waits for until it reaches a root cause:
//   * a rank that died, or has not called the collective yet (its published seq is behind);
//   * a rank that stopped responding (its process is stopped, or no heartbeat for long);
//   * a link that is down (a rank that is alive for others but not for one peer);
//   * a rank that already finished the collective although a waiter still expects its data.
// Every rank reads the same published state, so every survivor names the same root; the first
// to time out aborts the group with its diagnosis and the others report that abort. If no root
// is found (every rank alive and waiting for another), the message lists the wait-for chain.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "transport/transport.h"

namespace stragg {

struct CollectiveSpec {
  const char* op_name = "all_reduce";  // used in error messages
  uint64_t seq = 0;  // collective sequence number in the group (same on all ranks)
  // The collective as the user counts it: the session's call number (CallRecord::seq) of the
  // user's call, or of the call an internal collective belongs to; -1: use `seq`.
  int64_t call = -1;
  bool internal = false;  // run by stragg itself (profiler exchange, link probe)
  // A collective between the user's calls (a barrier): labelled "barrier after call #5" (or
  // "barrier before the first call") rather than by a call number of its own.
  bool between_calls = false;
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;
  size_t numel = 0;
};

// "all_reduce #5", for internal collectives "profiler exchange at call #5", between calls
// "barrier after call #5".
std::string collective_label(const CollectiveSpec& spec);
// "stragg: rank 2: all_reduce #5", the start of every message the executor raises.
std::string collective_prefix(int rank, const CollectiveSpec& spec);

// Everything a timed-out rank knows when it diagnoses a stall.
struct StallFacts {
  int rank = 0;
  CollectiveSpec spec;
  std::string doing;              // "in step 3" or "agreeing on the straggler"
  std::vector<int> awaited;       // peers this rank waits for, sorted
  std::vector<PeerStatus> peers;  // by rank (this rank's entry is not read)
};

// The root cause of a stall in words, e.g. "rank 3 stopped responding (its process is stopped:
// SIGSTOP or a debugger) in step 2; rank 1 was in step 3, waiting for rank 0". Pure.
std::string diagnose_stall(const StallFacts& facts);

// "1, 3" and "rank 3" / "ranks 1, 3".
std::string join_ints(const std::vector<int>& v);
std::string ranks_text(const std::vector<int>& ranks);

// What a rank checks while it waits and nothing moves: another rank's abort, peers that died,
// the deadline. Shared by Executor::run and Executor::agree_on_straggler, so there is one abort
// path; the caller's catch signals the abort to the peers.
class Stall {
 public:
  using Clock = std::chrono::steady_clock;

  Stall(Transport& t, const CollectiveSpec& spec, Clock::time_point start,
        std::chrono::milliseconds timeout)
      : t_(t), spec_(spec), deadline_(start + timeout), timeout_(timeout), last_health_(start),
        last_check_(start) {}

  Clock::time_point deadline() const { return deadline_; }

  // Throws if the group was aborted (Error naming the aborting rank's reason; not while every
  // awaited peer is past this collective: its data is on the way), a peer in
  // `awaited` died (TimeoutError), or the deadline passed (TimeoutError with diagnose_stall).
  // `doing` says what this rank waits for ("in step 3", "agreeing on the straggler").
  void check(Clock::time_point now, const std::vector<int>& awaited, const std::string& doing);

 private:
  bool peers_are_past(const std::vector<int>& awaited);
  // Throws the peers' abort, if one arrived and applies to this collective.
  void throw_if_aborted(const std::vector<int>& awaited);
  [[noreturn]] void timed_out(bool was_stopped, const std::vector<int>& awaited,
                              const std::string& doing);

  Transport& t_;
  const CollectiveSpec& spec_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  Clock::time_point last_health_;
  Clock::time_point last_check_;  // waits between checks are <= 100 ms unless the rank stopped
};

// Throws stragg::Error if the group was aborted before this collective started.
void check_not_aborted(Transport& t, const CollectiveSpec& spec);

}  // namespace stragg
