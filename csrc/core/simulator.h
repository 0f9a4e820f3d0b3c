// Cost model / simulator: completion time of a schedule.
//
// Transfer time (flat alpha-beta, Hockney): a message of b bytes between ranks u and v occupies
// u's send port and v's receive port for b * beta * max(slowdown[u], slowdown[v]); the alpha term
// is paid once per round. In a round with several concurrent steps a rank's port time is the sum
// over its messages (bandwidth is shared).
//
// Two execution modes:
//  * kLockstep (default; the papers' model): rounds run one after another; a round starts when
//    the previous round has ended and every rank it involves has arrived. Its duration is
//    alpha + the largest port time in the round. Pre-arrival rounds never wait for the straggler.
//  * kDataflow: no global barrier; a rank starts its part of a round as soon as its ports are
//    free, it has arrived and the chunks it sends are final; a message ends when both endpoints
//    are done. Gives a lower (more optimistic) time for schedules with uneven rounds.
//
// Optional two-level model (SimOptions::host_of): the ranks of a host share its NIC, host mates
// talk over shared memory at their own alpha and beta.
//
// Optional ring-topology model (short-circuit-rings §2.3, lockstep only): rank i sits at position
// i of a bidirectional ring; a message is routed on the shortest path (ties clockwise) and pays
// hop_delay per hop; the transmission term of a round is beta times the bytes on its busiest
// directed link (congestion). Rounds marked in `reconfigure` instead get direct circuits: one hop,
// no congestion, plus reconfig_delay.
#pragma once

#include <string>
#include <vector>

#include "core/ir.h"

namespace stragg {
namespace core {

enum class SimMode { kLockstep = 0, kDataflow = 1 };

struct SimOptions {
  double nbytes = 0.0;  // buffer size s (bytes), split over chunks by weight
  double alpha = 0.0;   // per-round latency (seconds)
  double beta = 0.0;    // seconds per byte
  std::vector<double> arrival;   // per-rank arrival time; empty = all 0
  std::vector<double> slowdown;  // per-rank link slowdown; empty = the schedule's rank_slowdown
  SimMode mode = SimMode::kLockstep;
  // Ring topology model.
  bool ring_topology = false;
  double hop_delay = 0.0;          // delta: propagation delay per hop
  double reconfig_delay = 0.0;     // circuit reconfiguration delay
  std::vector<bool> reconfigure;   // per round; empty = static ring throughout
  // Two-level model (hosts with several ranks behind one NIC each; lockstep only): host_of[r] is
  // rank r's host (empty: every rank is its own host, the flat model above). A transfer between
  // hosts loads the sending host's NIC send side and the receiving host's NIC receive side
  // (bytes * the slower endpoint's slowdown, at beta); one between host mates loads the two
  // ranks' own ports at local_beta. A round pays alpha when it crosses the network, else
  // local_alpha, plus its busiest port's time.
  std::vector<int> host_of;
  double local_alpha = 0.0;
  double local_beta = 0.0;
};

struct SimResult {
  double time = 0.0;                 // completion time (last message or last arrival)
  double pre_arrival_time = 0.0;     // end of the last pre-arrival round (0 if none)
  std::vector<double> rank_finish;   // per rank: end of its last message (or arrival)
  std::vector<double> round_end;     // lockstep: end time of each round
  double max_bytes_sent = 0.0;       // largest total bytes sent by one rank
  int rounds = 0;
};

SimResult simulate(const Schedule& s, const SimOptions& opt);

SimMode sim_mode_from_string(const std::string& m);

}  // namespace core
}  // namespace stragg
