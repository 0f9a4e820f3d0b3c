// Recursive doubling all_reduce for small messages (Thakur, Rabenseifner & Gropp 2005): log2(n)
// rounds instead of RHD's 2*log2(n) or Ring's 2(n-1), each moving the whole buffer, so it wins
// where the per-message latency dominates. Bitwise identical results on every rank: in every
// exchange both partners compute lower (+) upper (the upper one reduces with kReduceFirst), so
// every rank evaluates the same expression tree in the same operand order.
#include "core/generators.h"

namespace stragg {
namespace core {

Schedule rd_allreduce(int n) {
  if (n < 1) throw ScheduleError("rd: n must be >= 1");
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  Schedule s = Schedule::make("rd", Collective::kAllReduce, n, 1);
  s.phases = {"exchange"};
  // Virtual rank -> real rank, increasing, so "lower virtual rank" is "lower real rank".
  std::vector<int> ranks;
  for (int j = 0; j < rem; ++j) ranks.push_back(2 * j + 1);
  for (int r = 2 * rem; r < n; ++r) ranks.push_back(r);
  if (rem > 0) {
    // As rhd's fold: ranks 2j hand their buffer to 2j+1 (one computes it) and sit out.
    Step& st = s.add_step(s.phase_index("fold"));
    for (int j = 0; j < rem; ++j) {
      st.transfers.push_back({2 * j, 2 * j + 1, 0, 1, RecvAction::kReduce});
    }
  }
  for (int bit = 1; bit < p; bit *= 2) {
    Step& st = s.add_step(0);
    for (int v = 0; v < p; ++v) {
      const int peer = v ^ bit;
      // The receiver v reduces peer's data; v's own data goes first iff v is the lower one.
      st.transfers.push_back(
          {ranks[peer], ranks[v], 0, 1, v < peer ? RecvAction::kReduce : RecvAction::kReduceFirst});
    }
  }
  if (rem > 0) {
    Step& st = s.add_step(s.phase_index("unfold"));
    for (int j = 0; j < rem; ++j) {
      st.transfers.push_back({2 * j + 1, 2 * j, 0, 1, RecvAction::kCopy});
    }
  }
  return s;
}

}  // namespace core
}  // namespace stragg
