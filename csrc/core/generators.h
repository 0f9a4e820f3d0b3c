// Schedule generators: pure functions (n, params) -> Schedule. Each lives in its own file
// (ring.cc, rhd.cc, direct.cc, bcast.cc, stragglar.cc, optcc.cc); registry.cc maps names to them.
#pragma once

#include <string>
#include <vector>

#include "core/algorithm.h"
#include "core/ir.h"

namespace stragg {
namespace core {

// ---- ring.cc: Ring (Patarasuk & Yuan). n chunks; rank r ends the reduce-scatter owning chunk r.
Schedule ring_allreduce(int n);
Schedule ring_reduce_scatter(int n);
Schedule ring_allgather(int n);

// ---- rhd.cc: recursive halving (reduce-scatter) + recursive doubling (allgather).
// Power-of-2 n: 2*log2(n) rounds, n chunks, distance-doubling order (step i pairs r with r^2^i,
// as in the short-circuit-rings cost model); rank r owns chunk bitreverse(r) after the halving.
// Other n (Rabenseifner): the first 2*(n-p') ranks fold pairwise into p' = 2^floor(log2 n)
// ranks, run the power-of-2 algorithm, and unfold: 2*log2(p') + 2 rounds.
Schedule rhd_allreduce(int n);
Schedule rhd_reduce_scatter(int n);  // power-of-2 n only
Schedule rhd_allgather(int n);       // power-of-2 n only

// ---- rd.cc: recursive doubling (Thakur, Rabenseifner & Gropp 2005) for small messages: one
// chunk; step i exchanges the whole buffer between virtual ranks v and v ^ 2^i, and both reduce
// it in the order lower (+) upper (RecvAction::kReduceFirst at the upper one), so every rank holds
// bitwise the same result: log2(n) rounds of the full size. Other n: the first 2*(n-p') ranks
// fold pairwise into p' = 2^floor(log2 n) (as rhd) and unfold at the end: log2(p') + 2 rounds.
Schedule rd_allreduce(int n);

// ---- direct.cc: MSCCL allpairs. n chunks; one round of n-1 concurrent steps for the
// reduce-scatter (every rank sends chunk j to rank j), one mirror round for the allgather.
Schedule direct_allreduce(int n);
Schedule direct_reduce_scatter(int n);
Schedule direct_allgather(int n);

// ---- stragglar*.cc: StragglAR (pre-arrival ring reduce-scatter among the n-1 early ranks, then
// the StragglAR schedule). n-1 chunks. Power-of-2 n: Algorithm 1, exactly n + log2(n) - 2
// post-arrival rounds. Other n: circulant designs + deadline-driven matching (see stragglar.cc,
// which lists the constructions and their files).
Schedule stragglar(int n, int straggler);
// Only the post-arrival part (precondition: rank g holds the reduce of all non-stragglers for
// chunk g, in canonical labelling). Used by tests and the CLI.
Schedule stragglar_post_arrival(int n, int straggler);
// Lower bound on post-arrival rounds: n - 2 + ceil(log2 n) (n >= 2).
int stragglar_round_lower_bound(int n);
// True if stragglar(n, .) is built quickly (power-of-2 n, n small enough for the matching
// heuristic, a stored design, or a constructed design); otherwise building it may take minutes
// (the runtime falls back to Ring).
bool stragglar_builds_fast(int n);
// Which construction builds stragglar(n, .): "algorithm1" (power-of-2 n), "stored:" and the name
// of what found a stored schedule offline (e.g. "stored:cpsat_circulant_chunks"; see
// csrc/core/tools/stragglar_search.py), or one built at generation time: "circulant_greedy_tail",
// "two_chain", "matching".
std::string stragglar_construction(int n);

// ---- stragglar_direct.cc: StragglAR's pre-arrival reduce-scatter among the n-1 early ranks,
// then k+1 pipelined direct rounds: the straggler sends its raw chunk of segment j to each
// owner, which reduces it and copies the final chunk of segment j-1 to every other rank.
// (n-1)*k chunks; post-arrival (k+1)(alpha + s*beta/k) in the lockstep model. n >= 2.
Schedule stragglar_direct(int n, int straggler, int segments);

// ---- bcast.cc: straggler-aware Broadcast baseline (StragglAR App. F): ring allreduce among
// the n-1 early ranks (pre-arrival), one whole-buffer exchange with the straggler, then a
// doubling broadcast of the whole buffer: ceil(log2 n) post-arrival rounds.
Schedule bcast(int n, int straggler);

// ---- optcc.cc: OptCC four-stage pipeline for stragglers with slow links.
struct OptccOptions {
  std::vector<int> stragglers;       // default {n-1}
  std::vector<double> slowdowns;     // per straggler, >= 1 (default 2)
  int segments = 8;                  // k pipelined segments
  bool bubble_fill = true;           // App. C, single straggler with slowdown < 2
  std::string order = "s3_first";    // "s3_first" (patterns B/D) or "s1_first" (patterns A/C)
};
Schedule optcc(int n, const OptccOptions& opt);

// ---- short_circuit.cc: Recursive Doubling on a ring with in-collective reconfiguration
// (short-circuit-rings §3). tau_rs: reduce-scatter steps >= tau_rs are reconfigured; tau_ag:
// allgather steps < tau_ag are reconfigured; -1 = use Ring for that half; -2 = choose by the
// paper's rule for the given cost parameters. Power-of-2 n.
Schedule short_circuit(int n, double nbytes, double alpha, double beta, double hop_delay,
                       double reconfig_delay, int tau_rs = -2, int tau_ag = -2);

// ---- registry.cc
// Typed parameters of the all_reduce generators (what the planner passes; the JSON form below is
// parsed into the same struct).
struct BuildParams {
  std::vector<int> stragglers;    // empty: none (straggler-aware algorithms take rank n-1)
  std::vector<double> slowdowns;  // OptCC: per straggler (or one for all); empty: 2
  int segments = 8;               // OptCC, StragglAR-direct: k pipelined segments
  bool bubble_fill = true;        // OptCC: App. C bubble filling for slowdown < 2
  std::string order = "s3_first";
};

// ---- host_level.cc: a two-level all_reduce for groups whose ranks share hosts: a ring
// reduce-scatter inside every host, the cross-host schedule `cross` (on the P hosts) run on K
// lanes at once (lane j: local rank j of every host, on 1/K of the buffer), a ring allgather
// inside every host. With `late_rank` >= 0 its host mates and the other hosts run everything
// that does not need its data before it arrives (its host is `cross`'s straggler). Hosts must
// hold the same number of ranks (else ScheduleError). K*C chunks, C = cross's chunks.
struct HostLevelOptions {
  Algorithm cross = Algorithm::Ring;
  BuildParams cross_params;  // stragglers / slowdowns by HOST index (OptCC's slow hosts)
  int late_rank = -1;        // a rank (not a host); -1: none
};
Schedule host_level(const std::vector<int>& host_of, const HostLevelOptions& opt);
// The ranks of each host, ascending, hosts numbered 0..P-1 as in host_of (ScheduleError if a
// host index is negative or skipped).
std::vector<std::vector<int>> host_ranks(const std::vector<int>& host_of);
// Builds the all_reduce schedule of `algo` (not Algorithm::Auto) for n ranks. Throws
// ScheduleError for bad parameters.
Schedule build(Algorithm algo, int n, const BuildParams& params);
// Builds a schedule by name. params_json is a JSON object of generator parameters, e.g.
// {"straggler": 3} or {"stragglers": [0], "slowdown": 2.0, "segments": 16}. Unknown algorithm
// names and unknown parameters raise ScheduleError.
Schedule build(const std::string& algo, int n, const std::string& params_json = "{}");
// Names accepted by build().
std::vector<std::string> algorithm_names();

namespace detail {
// 0, 1, ..., n-1.
std::vector<int> iota_vec(int n);
// Appends a ring reduce-scatter among `ranks` over chunk runs `chunks[i]` (one per rank, count
// each): afterwards ranks[g] holds the reduced chunk run chunks[g].
void append_ring_reduce_scatter(Schedule& s, const std::vector<int>& ranks,
                                const std::vector<int>& chunks, int count, int phase,
                                bool pre_arrival);
// Appends a ring allgather: before, ranks[g] holds chunks[g]; afterwards all hold all.
void append_ring_allgather(Schedule& s, const std::vector<int>& ranks,
                           const std::vector<int>& chunks, int count, int phase,
                           bool pre_arrival);
int ceil_log2(int n);
bool is_pow2(int n);
}  // namespace detail

}  // namespace core
}  // namespace stragg
