#include "common/rendezvous.h"

#include <sstream>

#include "common/error.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;


// When rank 0's process hosts the store (Rendezvous::hosted_by_rank0), it enters stragg's setup
// only after every process connected to the store: torch's TCPStore waits for them in its
// constructor there. Rank 0 missing together with other ranks, before any record of rank 0
// arrived, is then rank 0 waiting for them, not a second fault: only the others are named, and
// the hint says why rank 0 is not (torch raises 'N/size clients joined' on rank 0 itself).
// Rank 0 missing alone, or after it joined an earlier exchange, is named as such.
struct Absent {
  std::vector<int> ranks;
  std::string hint;
};

Absent absent_ranks(const Rendezvous& rdv, const std::vector<int>& missing, int size) {
  Absent a{missing, ""};
  if (!rdv.hosted_by_rank0() || rdv.rank0_joined() || missing.size() < 2 || missing[0] != 0) {
    return a;
  }
  a.ranks.erase(a.ranks.begin());
  std::ostringstream m;
  m << " (rank 0 hosts " << rdv.describe() << " and enters stragg's setup only after all " << size
    << " processes connected to it, so it waits for "
    << (a.ranks.size() == 1 ? "that one" : "those") << " in torch's TCPStore, which raises 'N/"
    << size << " clients joined' there: the process that never started is "
    << (a.ranks.size() == 1 ? "" : "among ") << ranks_list(a.ranks) << ")";
  a.hint = m.str();
  return a;
}

}  // namespace

std::string ranks_list(const std::vector<int>& ranks) {
  std::ostringstream m;
  if (ranks.size() == 1) {
    m << "rank " << ranks[0];
    return m.str();
  }
  m << "ranks [";
  for (size_t i = 0; i < ranks.size(); ++i) m << (i ? ", " : "") << ranks[i];
  m << "]";
  return m.str();
}

std::vector<std::string> exchange_all(Rendezvous& rdv, const std::string& prefix, int rank,
                                      int size, const std::string& value,
                                      std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = Clock::now() + timeout;
  const std::string head = "stragg: rank " + std::to_string(rank) + ": " + what;
  auto key = [&](int q) { return prefix + "/" + std::to_string(q); };
  std::vector<std::string> values(size);
  std::vector<bool> have(size, false);
  values[rank] = value;
  have[rank] = true;
  if (rank == 0) rdv.note_rank0_joined();
  int waiting_for = -1;  // for a store error's message
  try {
    rdv.set(key(rank), value);
    for (int peer = 0; peer < size; ++peer) {
      if (have[peer]) continue;
      waiting_for = peer;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() < 1) left = std::chrono::milliseconds(1);
      if (auto got = rdv.get(key(peer), left)) {
        values[peer] = std::move(*got);
        have[peer] = true;
        if (peer == 0) rdv.note_rank0_joined();
        continue;
      }
      // Out of time: name the ranks whose records are still not there (some may just have come).
      std::vector<int> missing;
      for (int q = 0; q < size; ++q) {
        if (have[q]) continue;
        if (rdv.check(key(q))) {
          auto late = rdv.get(key(q), std::chrono::milliseconds(1000));
          if (late) {
            values[q] = std::move(*late);
            have[q] = true;
            continue;
          }
        }
        missing.push_back(q);
      }
      if (missing.empty()) break;
      const Absent absent = absent_ranks(rdv, missing, size);
      std::ostringstream msg;
      msg << head << " timed out after "
          << std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count() / 1000.0
          << " s: " << ranks_list(absent.ranks) << " did not join" << absent.hint;
      throw TimeoutError(msg.str());
    }
  } catch (const StoreError& e) {
    std::string m = head + ": " + e.what();
    if (waiting_for >= 0) m += " (while waiting for rank " + std::to_string(waiting_for) + ")";
    if (rdv.hosted_by_rank0() && rank != 0) {
      m += "; rank 0 hosts it: see rank 0's error (torch's TCPStore raises 'N/" +
           std::to_string(size) + " clients joined' there when a process never started)";
    }
    throw StoreError(m);
  }
  return values;
}

}  // namespace stragg
