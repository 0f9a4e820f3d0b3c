// Heartbeats of the TCP transport and what a rank concludes from them (no sockets here).
//
// Every rank's transport runs a heartbeat thread that sends a BEAT control frame (control.h) to
// every peer every kBeatEvery, whatever the rank is doing (computing, waiting, idle): the frame
// carries the rank's published Progress and the peers it has not heard from for kSilentAfter.
// A SIGSTOPped process, a frozen host or a cut cable stops the beats; a busy rank does not. So a
// rank that hears nothing from a peer for kSilentAfter tells apart:
//   * Unreachable: some other rank it still hears from does hear that peer (its last beat does
//     not list it): the peer is alive, the link between the two is down;
//   * Stopped: nobody it hears from hears the peer either (or there is nobody else to ask): the
//     process stopped or its host is gone.
// A partitioned network (two sides that each hear only their own) is seen by each side as the
// other side having stopped; the message then names both possibilities.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace stragg::tcp {

constexpr auto kBeatEvery = std::chrono::milliseconds(250);
constexpr auto kSilentAfter = std::chrono::milliseconds(2000);

// What this rank knows of one peer's liveness.
struct PeerView {
  std::chrono::steady_clock::time_point last_heard;  // bytes last arrived on its control link
  bool dead = false;                                 // its data connection ended
  std::vector<int> cannot_hear;                      // from its last beat
};

// Peers (not `rank`, not dead) this rank has not heard from for kSilentAfter, sorted.
std::vector<int> silent_peers(const std::vector<PeerView>& views, int rank,
                              std::chrono::steady_clock::time_point now);

// Liveness of `peer` as `rank` sees it (see above); *evidence says why when not Alive.
Liveness judge_peer(const std::vector<PeerView>& views, int rank, int peer,
                    std::chrono::steady_clock::time_point now, std::string* evidence);

}  // namespace stragg::tcp
