// MSCCL "allpairs" (StragglAR App. F): one reduce-scatter round in which every rank sends
// chunk j to rank j (n-1 concurrent one-port steps sharing the link), and one mirror allgather
// round. Cost 2*alpha + 2(n-1)/n * s * beta.
#include <numeric>

#include "core/generators.h"

namespace stragg {
namespace core {

namespace {

void append_rs_round(Schedule& s, int phase) {
  const int n = s.n;
  for (int d = 1; d < n; ++d) {
    Step& st = s.add_step(phase, false, /*same_round=*/d > 1);
    for (int r = 0; r < n; ++r) {
      const int peer = (r + d) % n;
      st.transfers.push_back({r, peer, peer, 1, RecvAction::kReduce});
    }
  }
}

void append_ag_round(Schedule& s, int phase) {
  const int n = s.n;
  for (int d = 1; d < n; ++d) {
    Step& st = s.add_step(phase, false, /*same_round=*/d > 1);
    for (int r = 0; r < n; ++r) st.transfers.push_back({r, (r + d) % n, r, 1, RecvAction::kCopy});
  }
}

}  // namespace

Schedule direct_reduce_scatter(int n) {
  Schedule s = Schedule::make("direct", Collective::kReduceScatter, n, n);
  s.phases = {"reduce_scatter"};
  s.chunk_owner = detail::iota_vec(n);
  append_rs_round(s, 0);
  return s;
}

Schedule direct_allgather(int n) {
  Schedule s = Schedule::make("direct", Collective::kAllGather, n, n);
  s.phases = {"allgather"};
  s.chunk_owner = detail::iota_vec(n);
  append_ag_round(s, 0);
  return s;
}

Schedule direct_allreduce(int n) {
  Schedule s = Schedule::make("direct", Collective::kAllReduce, n, n);
  s.phases = {"reduce_scatter", "allgather"};
  append_rs_round(s, 0);
  append_ag_round(s, 1);
  return s;
}

}  // namespace core
}  // namespace stragg
