// Straggler-aware Broadcast baseline (StragglAR App. F). Pre-arrival: Ring allreduce among the
// n-1 early ranks. Post-arrival: the straggler and rank 0 exchange their whole buffers (both end
// fully reduced), then every holder sends the whole buffer to a rank that lacks it, doubling the
// holders each round: ceil(log2 n) post-arrival rounds of s bytes.
#include <numeric>

#include "core/generators.h"

namespace stragg {
namespace core {

Schedule bcast(int n, int straggler) {
  if (n < 2) throw ScheduleError("bcast: needs n >= 2, got " + std::to_string(n));
  if (straggler < 0) straggler = n - 1;
  const int sigma = n - 1, C = n - 1;
  Schedule s = Schedule::make("bcast", Collective::kAllReduce, n, C);
  s.stragglers = {sigma};
  s.phases = {"pre_arrival_reduce_scatter", "pre_arrival_allgather", "exchange", "broadcast"};
  std::vector<int> early(n - 1);
  std::iota(early.begin(), early.end(), 0);
  detail::append_ring_reduce_scatter(s, early, early, 1, 0, true);
  detail::append_ring_allgather(s, early, early, 1, 1, true);
  Step& ex = s.add_step(2);
  ex.transfers.push_back({0, sigma, 0, C, RecvAction::kReduce});
  ex.transfers.push_back({sigma, 0, 0, C, RecvAction::kReduce});
  std::vector<int> holders = {0, sigma};
  int next = 1;  // next rank without the result
  while (next < n - 1) {
    Step& st = s.add_step(3);
    const size_t h = holders.size();
    for (size_t i = 0; i < h && next < n - 1; ++i) {
      st.transfers.push_back({holders[i], next, 0, C, RecvAction::kCopy});
      holders.push_back(next++);
    }
  }
  s.params_json = "{\"straggler\": " + std::to_string(straggler) + "}";
  return straggler == sigma ? s : relabel(s, straggler_permutation(n, straggler));
}

}  // namespace core
}  // namespace stragg
