#include "transport/tcp/heartbeat.h"

#include <algorithm>
#include <cstdio>

namespace stragg::tcp {
namespace {

using Clock = std::chrono::steady_clock;

bool silent(const PeerView& v, Clock::time_point now) {
  return !v.dead && now - v.last_heard >= kSilentAfter;
}

std::string seconds(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace

std::vector<int> silent_peers(const std::vector<PeerView>& views, int rank, Clock::time_point now) {
  std::vector<int> out;
  for (int q = 0; q < static_cast<int>(views.size()); ++q) {
    if (q != rank && silent(views[q], now)) out.push_back(q);
  }
  return out;
}

Liveness judge_peer(const std::vector<PeerView>& views, int rank, int peer, Clock::time_point now,
                    std::string* evidence) {
  const PeerView& v = views[peer];
  if (v.dead) return Liveness::Dead;
  if (!silent(v, now)) return Liveness::Alive;
  // Witnesses: ranks this rank hears from. One that does not report the peer silent hears it.
  std::vector<int> hear_it;
  for (int r = 0; r < static_cast<int>(views.size()); ++r) {
    if (r == rank || r == peer || views[r].dead || silent(views[r], now)) continue;
    const auto& deaf = views[r].cannot_hear;
    if (std::find(deaf.begin(), deaf.end(), peer) == deaf.end()) hear_it.push_back(r);
  }
  if (!hear_it.empty()) {
    std::string who;
    for (size_t i = 0; i < hear_it.size(); ++i) who += (i ? ", " : "") + std::to_string(hear_it[i]);
    *evidence = "rank " + std::to_string(peer) + " is alive: rank" +
                (hear_it.size() > 1 ? "s " : " ") + who + " still hear" +
                (hear_it.size() > 1 ? "" : "s") + " from it, rank " + std::to_string(rank) +
                " has heard nothing for " + seconds(now - v.last_heard);
    return Liveness::Unreachable;
  }
  *evidence = "no heartbeat for " + seconds(now - v.last_heard) +
              ": its process is stopped, its host is down, or the network to it is cut";
  return Liveness::Stopped;
}

}  // namespace stragg::tcp
