// Which transport carries messages to each peer, as counters for backend_stats (each
// transport's stats(), shown by Session::stats):
//   "peer_transport.<q>": 1 = shared memory, 2 = TCP, for every peer q of this rank (Python's
//                         backend_stats turns them into {"peer_transports": {q: "shm"|"tcp"}});
//   "shm_peers", "tcp_peers": how many peers each carries;
// and, from the mixed transport, "host_index" (this rank's host, numbered by lowest rank),
// "hosts" (hosts in the group), "relayed_wakeups" (wake-ups its helper thread passed between
// the two sub-transports) and "helper_handbacks" (times the executor waited for the helper to
// leave TCP's wait before using TCP itself), with the TCP part's "tcp_*" counters (re-dials,
// tcp_transport.h).
#pragma once

#include <cstdint>
#include <functional>

#include "transport/transport.h"

namespace stragg {

constexpr int64_t kPeerViaShm = 1;
constexpr int64_t kPeerViaTcp = 2;

// Adds "peer_transport.<q>" for every peer q of `rank` in a group of `size` (kPeerViaShm where
// via_shm(q), else kPeerViaTcp) and the "shm_peers" / "tcp_peers" counts.
void add_peer_transport_stats(int rank, int size, const std::function<bool(int)>& via_shm,
                              TransportStats& stats);

}  // namespace stragg
