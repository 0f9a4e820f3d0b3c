#include "common/rendezvous.h"

#include <sstream>

#include "common/error.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;


// What a timed-out rank can add when rank 0 hosts the store and is among the missing: rank 0
// waits in torch's TCPStore until every process connected, so the rank that never started is
// among the others.
std::string store_host_hint(const Rendezvous& rdv, const std::vector<int>& missing, int size) {
  if (!rdv.hosted_by_rank0() || missing.empty() || missing[0] != 0) return "";
  std::ostringstream m;
  m << " (rank 0 hosts " << rdv.describe() << " and enters stragg's setup only after all " << size
    << " processes connected to it; torch's TCPStore raises 'N/" << size
    << " clients joined' on rank 0 when one never does";
  if (missing.size() > 1) {
    m << ": the process that never started is "
      << ranks_list(std::vector<int>(missing.begin() + 1, missing.end()));
  }
  m << ")";
  return m.str();
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
      std::ostringstream msg;
      msg << head << " timed out after "
          << std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count() / 1000.0
          << " s: " << ranks_list(missing) << " did not join"
          << store_host_hint(rdv, missing, size);
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
