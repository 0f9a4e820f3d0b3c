// StragglAR-direct: StragglAR's pre-arrival phase, then a pipelined direct post-arrival phase
// that keeps every link busy instead of StragglAR's chain of one-chunk rounds.
//
// Canonical straggler sigma = n-1; chunk (g, j) = g*k + j, for owner g < n-1 and segment j < k.
// Pre-arrival: ring reduce-scatter among the n-1 early ranks (rank g ends holding its k chunks
// reduced over all early ranks), exactly as StragglAR.
// Post-arrival, k+1 rounds; round j carries
//   A_j: the straggler sends its raw chunk (g, j) to every owner g, which reduces it (x += recv):
//        chunk (g, j) is then final at g;
//   B_{j-1}: every owner g copies its final chunk (g, j-1) to every other rank, the straggler too.
// Each round is n-1 one-port steps: in step d every rank r sends to (r + d) mod n (the straggler
// its A message, the others their B message), so every rank sends and receives at most one
// message per step. Per round every rank sends and receives 1/k of the buffer: the post-arrival
// phase takes (k+1)(alpha + s*beta/k) in the lockstep model, against StragglAR's
// (n + log2 n - 2)(alpha + s*beta/(n-1)), i.e. about s*beta (every link busy all the time: the
// straggler must send its whole buffer once) where StragglAR needs 1.29 s*beta at n = 8.
// Every element is reduced once in the ring order and once with the straggler's value (owner
// side), then copied: all ranks hold bitwise the same result.
// The direct steps share each rank's link among n-1 concurrent messages, which suits a network
// (the planner offers it only over one); on shared memory with few cores they serialise.
#include <numeric>

#include "core/generators.h"

namespace stragg {
namespace core {

Schedule stragglar_direct(int n, int straggler, int segments) {
  if (n < 2) throw ScheduleError("stragglar_direct: needs n >= 2, got " + std::to_string(n));
  if (segments < 1) {
    throw ScheduleError("stragglar_direct: segments must be >= 1, got " +
                        std::to_string(segments));
  }
  if (straggler < 0) straggler = n - 1;
  if (straggler >= n) {
    throw ScheduleError("straggler rank " + std::to_string(straggler) + " out of range");
  }
  const int sigma = n - 1, k = segments;
  Schedule s = Schedule::make("stragglar_direct", Collective::kAllReduce, n, (n - 1) * k);
  s.stragglers = {sigma};
  s.phases = {"pre_arrival_reduce_scatter", "post_arrival_direct"};
  std::vector<int> early(n - 1), runs(n - 1);
  std::iota(early.begin(), early.end(), 0);
  for (int g = 0; g < n - 1; ++g) runs[g] = g * k;
  detail::append_ring_reduce_scatter(s, early, runs, k, 0, true);
  for (int j = 0; j <= k; ++j) {
    for (int d = 1; d < n; ++d) {
      Step& st = s.add_step(1, false, /*same_round=*/d > 1);
      if (j < k) st.transfers.push_back({sigma, d - 1, (d - 1) * k + j, 1, RecvAction::kReduce});
      if (j > 0) {
        for (int g = 0; g < n - 1; ++g) {
          const int dst = (g + d) % n;
          st.transfers.push_back({g, dst, g * k + j - 1, 1, RecvAction::kCopy});
        }
      }
    }
  }
  s.params_json = "{\"straggler\": " + std::to_string(straggler) +
                  ", \"segments\": " + std::to_string(k) + "}";
  return straggler == sigma ? s : relabel(s, straggler_permutation(n, straggler));
}

}  // namespace core
}  // namespace stragg
