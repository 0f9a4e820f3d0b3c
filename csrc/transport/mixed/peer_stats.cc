#include "transport/mixed/peer_stats.h"

#include <cstring>

#include "transport/mixed/mixed_transport.h"

namespace stragg {

void add_peer_transport_stats(Transport* t, std::map<std::string, int64_t>& stats) {
  if (t == nullptr) return;
  auto* mixed = dynamic_cast<MixedTransport*>(t);
  const bool all_shm = std::strcmp(t->name(), "shm") == 0;
  if (mixed == nullptr && !all_shm && std::strcmp(t->name(), "tcp") != 0) return;
  int64_t shm = 0;
  int64_t tcp = 0;
  for (int q = 0; q < t->size(); ++q) {
    if (q == t->rank()) continue;
    const bool via_shm = mixed ? std::strcmp(mixed->peer_transport(q), "shm") == 0 : all_shm;
    stats["peer_transport." + std::to_string(q)] = via_shm ? kPeerViaShm : kPeerViaTcp;
    (via_shm ? shm : tcp) += 1;
  }
  stats["shm_peers"] = shm;
  stats["tcp_peers"] = tcp;
  if (mixed != nullptr) {
    stats["host_index"] = mixed->layout().host_of(t->rank());
    stats["hosts"] = mixed->layout().num_hosts();
    stats["relayed_wakeups"] = static_cast<int64_t>(mixed->relayed_wakeups());
    stats["helper_handbacks"] = static_cast<int64_t>(mixed->helper_handbacks());
  }
}

}  // namespace stragg
