// Ring reduce-scatter / allgather / allreduce (Patarasuk & Yuan 2009; StragglAR App. F):
// 2(n-1) rounds of s/n bytes.
#include <numeric>

#include "core/generators.h"

namespace stragg {
namespace core {

namespace detail {

int ceil_log2(int n) {
  int l = 0;
  while ((1 << l) < n) ++l;
  return l;
}

bool is_pow2(int n) { return n >= 1 && (n & (n - 1)) == 0; }

void append_ring_reduce_scatter(Schedule& s, const std::vector<int>& ranks,
                                const std::vector<int>& chunks, int count, int phase,
                                bool pre_arrival) {
  const int m = static_cast<int>(ranks.size());
  // Step t: ranks[g] sends chunk run (g - t - 1) mod m to ranks[g+1], which reduces it. Chunk
  // run c starts at ranks[c+1] and ends, after m-1 hops, fully reduced at ranks[c].
  for (int t = 0; t + 1 < m; ++t) {
    Step& st = s.add_step(phase, pre_arrival);
    for (int g = 0; g < m; ++g) {
      const int c = ((g - t - 1) % m + m) % m;
      st.transfers.push_back({ranks[g], ranks[(g + 1) % m], chunks[c], count, RecvAction::kReduce});
    }
  }
}

void append_ring_allgather(Schedule& s, const std::vector<int>& ranks,
                           const std::vector<int>& chunks, int count, int phase,
                           bool pre_arrival) {
  const int m = static_cast<int>(ranks.size());
  for (int t = 0; t + 1 < m; ++t) {
    Step& st = s.add_step(phase, pre_arrival);
    for (int g = 0; g < m; ++g) {
      const int c = ((g - t) % m + m) % m;
      st.transfers.push_back({ranks[g], ranks[(g + 1) % m], chunks[c], count, RecvAction::kCopy});
    }
  }
}

std::vector<int> iota_vec(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace detail

Schedule ring_reduce_scatter(int n) {
  Schedule s = Schedule::make("ring", Collective::kReduceScatter, n, n);
  s.phases = {"reduce_scatter"};
  s.chunk_owner = detail::iota_vec(n);
  detail::append_ring_reduce_scatter(s, detail::iota_vec(n), detail::iota_vec(n), 1, 0, false);
  return s;
}

Schedule ring_allgather(int n) {
  Schedule s = Schedule::make("ring", Collective::kAllGather, n, n);
  s.phases = {"allgather"};
  s.chunk_owner = detail::iota_vec(n);
  detail::append_ring_allgather(s, detail::iota_vec(n), detail::iota_vec(n), 1, 0, false);
  return s;
}

Schedule ring_allreduce(int n) {
  Schedule s = Schedule::make("ring", Collective::kAllReduce, n, n);
  s.phases = {"reduce_scatter", "allgather"};
  detail::append_ring_reduce_scatter(s, detail::iota_vec(n), detail::iota_vec(n), 1, 0, false);
  detail::append_ring_allgather(s, detail::iota_vec(n), detail::iota_vec(n), 1, 1, false);
  return s;
}

}  // namespace core
}  // namespace stragg
