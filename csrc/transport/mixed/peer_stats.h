// Which transport carries messages to each peer, as counters for backend_stats (session.cc):
//   "peer_transport.<q>": 1 = shared memory, 2 = TCP, for every peer q of this rank (Python's
//                         backend_stats turns them into {"peer_transports": {q: "shm"|"tcp"}});
//   "shm_peers", "tcp_peers": how many peers each carries;
// and, for the mixed transport, "host_index" (this rank's host, numbered by lowest rank),
// "hosts" (hosts in the group), "relayed_wakeups" (wake-ups its helper thread passed between
// the two sub-transports) and "helper_handbacks" (times the executor waited for the helper to
// leave TCP's wait before using TCP itself).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "transport/transport.h"

namespace stragg {

constexpr int64_t kPeerViaShm = 1;
constexpr int64_t kPeerViaTcp = 2;

// Adds the counters above for `t` (nothing for a null transport or an unknown kind).
void add_peer_transport_stats(Transport* t, std::map<std::string, int64_t>& stats);

}  // namespace stragg
