// Host-level all_reduce: a two-level composition of ordinary schedules for groups whose ranks
// share hosts (torchrun --nnodes P --nproc-per-node K), so that each host's NIC carries
// 2(P-1)/P of the buffer each way instead of the flat Ring's 2(PK-1)/(PK).
//
// Hosts hold K ranks each; local index j of host h is its j-th lowest rank. The buffer is split
// into K blocks (lanes) of C chunks, C the cross-host schedule's chunk count; chunk j*C + c is
// chunk c of block j.
//  1. host_reduce_scatter: a ring reduce-scatter inside every host (K-1 steps on shared memory):
//     local j ends holding block j summed over its host.
//  2. cross_host: the cross-host schedule X (Ring, RHD, StragglAR-direct, OptCC, ... on P ranks)
//     run on every lane at once: lane j is local j of every host, working on block j. Every rank
//     is in exactly one lane, so the lanes' transfers share steps without breaking the one-port
//     rule, and each NIC carries K flows of 1/K of the buffer.
//  3. host_allgather: a ring allgather inside every host.
// A late rank r (on host H, local J): its host is X's straggler. Its host mates reduce-scatter
// among themselves before it arrives (block J goes to the mate next to it, A, merged with A's
// own block into one contiguous run), every other host does phase 1 and X's pre-arrival steps;
// once r arrives, host_late_merge (K-1 steps on shared memory) gives r's block l to mate l and
// A's partial block J to r, and the lanes run X's post-arrival steps. After r arrives only X's
// post-arrival part crosses the network: for StragglAR-direct about u = buffer / NIC rate, the
// bound for any schedule (every result depends on r's data, all of which must leave host H).
// Each chunk is reduced at one rank and copied from there: every rank holds bitwise the same
// result.
#include <algorithm>
#include <map>

#include "core/generators.h"

namespace stragg {
namespace core {
namespace {

struct Run {
  int chunk = 0;
  int count = 0;
};

// Ring reduce-scatter step t among `ranks` over `runs` (one per rank): ranks[g] sends run
// (g - t - 1) mod m to ranks[g + 1]; after m - 1 steps ranks[g] holds run g reduced.
void ring_rs_step(Step& st, const std::vector<int>& ranks, const std::vector<Run>& runs, int t) {
  const int m = static_cast<int>(ranks.size());
  if (t + 1 >= m) return;
  for (int g = 0; g < m; ++g) {
    const Run& r = runs[((g - t - 1) % m + m) % m];
    st.transfers.push_back({ranks[g], ranks[(g + 1) % m], r.chunk, r.count, RecvAction::kReduce});
  }
}

// Ring allgather step t: ranks[g] holds run g; ranks[g] forwards run (g - t) mod m.
void ring_ag_step(Step& st, const std::vector<int>& ranks, const std::vector<Run>& runs, int t) {
  const int m = static_cast<int>(ranks.size());
  if (t + 1 >= m) return;
  for (int g = 0; g < m; ++g) {
    const Run& r = runs[((g - t) % m + m) % m];
    st.transfers.push_back({ranks[g], ranks[(g + 1) % m], r.chunk, r.count, RecvAction::kCopy});
  }
}

}  // namespace

std::vector<std::vector<int>> host_ranks(const std::vector<int>& host_of) {
  const int n = static_cast<int>(host_of.size());
  std::map<int, std::vector<int>> by_host;
  for (int r = 0; r < n; ++r) {
    if (host_of[r] < 0) {
      throw ScheduleError("host_level: rank " + std::to_string(r) + " has host index " +
                          std::to_string(host_of[r]));
    }
    by_host[host_of[r]].push_back(r);
  }
  std::vector<std::vector<int>> hosts;
  int expect = 0;
  for (auto& [h, ranks] : by_host) {
    if (h != expect++) {
      throw ScheduleError("host_level: host indices must be 0..P-1 (host " + std::to_string(h) +
                          " follows host " + std::to_string(expect - 2) + ")");
    }
    hosts.push_back(std::move(ranks));
  }
  return hosts;
}

Schedule host_level(const std::vector<int>& host_of, const HostLevelOptions& opt) {
  const int n = static_cast<int>(host_of.size());
  const std::vector<std::vector<int>> hosts = host_ranks(host_of);
  const int P = static_cast<int>(hosts.size());
  if (P < 2) throw ScheduleError("host_level: needs ranks on at least 2 hosts, got " +
                                 std::to_string(P));
  const int K = static_cast<int>(hosts[0].size());
  for (int h = 1; h < P; ++h) {
    if (static_cast<int>(hosts[h].size()) != K) {
      throw ScheduleError("host_level: hosts hold different numbers of ranks (host 0: " +
                          std::to_string(K) + ", host " + std::to_string(h) + ": " +
                          std::to_string(hosts[h].size()) + ")");
    }
  }
  const int late = opt.late_rank;
  if (late >= n) {
    throw ScheduleError("host_level: late rank " + std::to_string(late) + " out of range");
  }
  const int late_host = late >= 0 ? host_of[late] : -1;
  int late_local = -1;
  if (late >= 0) {
    late_local = static_cast<int>(std::find(hosts[late_host].begin(), hosts[late_host].end(), late) -
                                  hosts[late_host].begin());
  }

  BuildParams xp = opt.cross_params;
  if (algorithm_has_one_straggler(opt.cross)) {
    if (late < 0 && xp.stragglers.empty()) {
      throw ScheduleError(std::string("host_level: cross-host ") + algorithm_name(opt.cross) +
                          " needs a late rank");
    }
    if (late >= 0) xp.stragglers = {late_host};
  }
  for (int h : xp.stragglers) {
    if (h < 0 || h >= P) throw ScheduleError("host_level: cross-host straggler host out of range");
  }
  const Schedule x = build(opt.cross, P, xp);
  const int C = x.num_chunks;

  Schedule s = Schedule::make("host_level", Collective::kAllReduce, n, K * C);
  s.segments = x.segments;
  for (int j = 0; j < K; ++j) {
    for (int c = 0; c < C; ++c) s.chunk_weights[j * C + c] = x.chunk_weights[c];
  }
  for (int r = 0; r < n; ++r) s.rank_slowdown[r] = x.rank_slowdown[host_of[r]];
  if (late >= 0) s.stragglers = {late};
  s.phases = {"host_reduce_scatter"};
  const int cross_phase0 = 1;
  for (const std::string& p : x.phases) s.phases.push_back("cross_host_" + p);
  const int merge_phase = s.phase_index("host_late_merge");
  const int ag_phase = s.phase_index("host_allgather");

  // Phase 1 (pre-arrival when a rank is late: it never involves the late rank).
  std::vector<std::vector<int>> rs_ranks(P);
  std::vector<std::vector<Run>> rs_runs(P);
  int merged_mate = -1;  // local index A of the late rank's mate that holds block J before it
  for (int h = 0; h < P; ++h) {
    for (int j = 0; j < K; ++j) {
      if (h == late_host && j == late_local) continue;
      rs_ranks[h].push_back(hosts[h][j]);
      rs_runs[h].push_back({j * C, C});
    }
    if (h == late_host && K > 1) {
      merged_mate = late_local + 1 < K ? late_local + 1 : late_local - 1;
      for (size_t g = 0; g < rs_ranks[h].size(); ++g) {
        if (rs_ranks[h][g] == hosts[h][merged_mate]) {
          rs_runs[h][g] = {std::min(merged_mate, late_local) * C, 2 * C};
        }
      }
    }
  }
  const bool pre = late >= 0;
  for (int t = 0; t + 1 < K; ++t) {
    Step& st = s.add_step(0, pre);
    for (int h = 0; h < P; ++h) ring_rs_step(st, rs_ranks[h], rs_runs[h], t);
    if (st.transfers.empty()) s.steps.pop_back();
  }

  // Phase 2: X on every lane; the late host's merge before X's first post-arrival step.
  auto add_merge = [&] {
    if (late < 0 || K < 2) return;
    const std::vector<int>& mates = hosts[late_host];
    for (int j = 0; j < K; ++j) {
      if (j == late_local) continue;
      Step& st = s.add_step(merge_phase, false);
      st.transfers.push_back({late, mates[j], j * C, C, RecvAction::kReduce});
      if (j == merged_mate) {
        st.transfers.push_back({mates[j], late, late_local * C, C, RecvAction::kReduce});
      }
    }
  };
  // Every step of X, once per lane: X's rank p is local j of host p, its chunk c is j*C + c.
  std::vector<Transfer> scratch;
  bool merged = false;
  for (size_t i = 0; i < x.steps.size(); ++i) {
    const Step& xs = x.steps[i];
    if (!xs.pre_arrival && !merged) {
      add_merge();
      merged = true;
    }
    const bool same_round = i > 0 && x.steps[i - 1].round == xs.round &&
                            x.steps[i - 1].pre_arrival == xs.pre_arrival;
    Step& st = s.add_step(cross_phase0 + xs.phase, xs.pre_arrival, same_round);
    for (const Transfer& t : x.transfers_of(i, scratch)) {
      for (int j = 0; j < K; ++j) {
        st.transfers.push_back({hosts[t.src][j], hosts[t.dst][j], j * C + t.chunk, t.count, t.op});
      }
    }
  }
  if (!merged) add_merge();

  // Phase 3.
  std::vector<Run> blocks(K);
  for (int j = 0; j < K; ++j) blocks[j] = {j * C, C};
  for (int t = 0; t + 1 < K; ++t) {
    Step& st = s.add_step(ag_phase, false);
    for (int h = 0; h < P; ++h) ring_ag_step(st, hosts[h], blocks, t);
  }

  std::string params = "{\"cross\": \"" + std::string(algorithm_name(opt.cross)) +
                       "\", \"ranks_per_host\": " + std::to_string(K);
  if (late >= 0) params += ", \"straggler\": " + std::to_string(late);
  params += ", \"cross_params\": " + x.params_json + "}";
  s.params_json = params;
  return s;
}

}  // namespace core
}  // namespace stragg
