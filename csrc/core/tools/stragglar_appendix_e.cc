// The StragglAR paper's App. E heuristic for non-power-of-2 n, as we read it (offline only;
// needs LEMON, Debian liblemon-dev). Round r < n-1: rank r and the straggler exchange chunk r (as
// in every StragglAR schedule). The other ranks (and the straggler from round n-1 on, when it
// holds everything) form a graph: u -- v with weight 2 if each holds a fully reduced chunk the
// other lacks, 1 if only one does. A maximum-weight matching (LEMON's MaxWeightedMatching,
// Edmonds' blossom algorithm; Boost 1.74's maximum_weighted_matching hangs or errs on such dense
// graphs, boostorg/graph #223, #399) picks the pairs; each side sends the oldest such chunk
// (earliest fully reduced: the most urgent; the paper does not say which). Randomisation: every
// edge weight gets a seeded pseudo-random perturbation below what could change the matching's
// integer weight, so restarts break ties differently; the schedule with the fewest rounds over
// `restarts` seeds is kept. Deterministic for a given seed.
#include "stragglar_appendix_e.h"

#include <lemon/list_graph.h>
#include <lemon/matching.h>

#include <cstdint>
#include <vector>

#include "core/stragglar_internal.h"

namespace stragg {
namespace core {
namespace tools {
namespace {

using stragglar_impl::PropagationState;
using Graph = lemon::ListGraph;
// Integer weight 1; perturbations stay below kUnit / (k + 1) per edge, so no matching's sum of
// perturbations reaches kUnit. Even weights keep LEMON's dual solution integral.
constexpr int64_t kUnit = int64_t{1} << 30;

// Oldest fully reduced chunk `from` holds and `to` lacks, or -1.
int oldest_missing(const PropagationState& ps, int m, int from, int to) {
  int best = -1;
  for (int c = 0; c < m; ++c)
    if (ps.full_round(c) != stragglar_impl::kNone && ps.holds(from, c) && !ps.holds(to, c) &&
        (best < 0 || ps.full_round(c) < ps.full_round(best)))
      best = c;
  return best;
}

// One round's matching among `avail` ranks; appends the copies to st and returns the gains.
std::vector<std::pair<int, int>> match_round(const PropagationState& ps, int n,
                                             const std::vector<int>& avail,
                                             stragglar_impl::SplitMix& rng, Step& st) {
  const int m = n - 1, k = static_cast<int>(avail.size());
  Graph g;
  std::vector<Graph::Node> node(k);
  for (int i = 0; i < k; ++i) node[i] = g.addNode();
  Graph::EdgeMap<int64_t> weight(g);
  std::vector<std::vector<int>> give(k, std::vector<int>(k, -1));  // chunk i sends to j
  for (int i = 0; i < k; ++i)
    for (int j = i + 1; j < k; ++j) {
      give[i][j] = oldest_missing(ps, m, avail[i], avail[j]);
      give[j][i] = oldest_missing(ps, m, avail[j], avail[i]);
      const int w = (give[i][j] >= 0) + (give[j][i] >= 0);
      if (w == 0) continue;
      const int64_t noise = static_cast<int64_t>(rng.next() % (kUnit / (k + 1)));
      weight[g.addEdge(node[i], node[j])] = 2 * (w * kUnit + noise);
    }
  lemon::MaxWeightedMatching<Graph, Graph::EdgeMap<int64_t>> matching(g, weight);
  matching.run();
  std::vector<std::pair<int, int>> gains;
  for (int i = 0; i < k; ++i) {
    const Graph::Node mate = matching.mate(node[i]);
    if (mate == lemon::INVALID) continue;
    const int j = g.id(mate);
    if (give[i][j] < 0) continue;
    st.transfers.push_back({avail[i], avail[j], give[i][j], 1, RecvAction::kCopy});
    gains.push_back({avail[j], give[i][j]});
  }
  return gains;
}

Schedule one_run(int n, uint64_t seed) {
  const int m = n - 1, sigma = n - 1;
  Schedule s = Schedule::make("stragglar", Collective::kAllReduce, n, m);
  s.stragglers = {sigma};
  s.phases = {"pre_arrival_reduce_scatter", "stragglar"};
  PropagationState ps(n);
  stragglar_impl::SplitMix rng{seed};
  for (int r = 0; r < m || !ps.all_complete(); ++r) {
    if (r > 8 * n) throw ScheduleError(stragglar_impl::internal(n, r, "appendix E: no progress"));
    Step& st = s.add_step(1);
    std::vector<int> avail;
    for (int g = 0; g < m; ++g)
      if (g != r) avail.push_back(g);
    if (r < m)
      stragglar_impl::add_exchange_with_straggler(st, r, sigma);
    else
      avail.push_back(sigma);
    for (auto [g, c] : match_round(ps, n, avail, rng, st)) ps.give(g, c);
    if (r < m) stragglar_impl::record_exchange(ps, r, sigma, r);
  }
  return s;
}

}  // namespace

Schedule appendix_e(int n, int restarts, uint64_t seed) {
  Schedule best;
  for (int i = 0; i < restarts; ++i) {
    Schedule s = one_run(n, seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL);
    if (i == 0 || s.num_rounds() < best.num_rounds()) best = std::move(s);
  }
  return best;
}

}  // namespace tools
}  // namespace core
}  // namespace stragg
