#include "transport/mixed/peer_stats.h"

#include <string>

namespace stragg {

void add_peer_transport_stats(int rank, int size, const std::function<bool(int)>& via_shm,
                              TransportStats& stats) {
  int64_t shm = 0;
  int64_t tcp = 0;
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    const bool local = via_shm(q);
    stats["peer_transport." + std::to_string(q)] = local ? kPeerViaShm : kPeerViaTcp;
    (local ? shm : tcp) += 1;
  }
  stats["shm_peers"] = shm;
  stats["tcp_peers"] = tcp;
}

}  // namespace stragg
