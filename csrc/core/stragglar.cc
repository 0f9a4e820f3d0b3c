// StragglAR (Devraj et al., "Efficient AllReduce with Stragglers"), canonical straggler n-1:
// public entry points, the choice of construction per n, and Algorithm 1 for powers of 2.
//
// Pre-arrival: ring reduce-scatter among the n-1 early ranks over n-1 chunks; afterwards rank g
// holds chunk g reduced over all non-stragglers ("partially reduced").
// Post-arrival, round r <= n-2: rank r and the straggler exchange chunk r and both reduce, which
// makes chunk r fully reduced on both. Fully reduced chunks are copied onwards; per round every
// rank sends at most one chunk and receives at most one.
//
// Power-of-2 n: Algorithm 1 / App. D (below). Phase 1 (rounds < log n) gives every rank one fully
// reduced chunk by doubling; from round log n on, the holders P of the oldest active chunk are
// matched with the holders Q of the other active chunks (every rank holds exactly one active
// chunk), with the ranks in the critical window (future straggler partners) served first with
// chunks old enough not to be active at their straggler round; after round n-2 the straggler
// joins Q with the last chunk. Exactly n + log2(n) - 2 post-arrival rounds (Theorem 1); the
// generator checks the invariants of the proof and throws if one breaks.
//
// Other n (even and odd; App. E leaves odd n out), one construction per file:
//  * stragglar_stored.cc: schedules found offline for n <= 255 (csrc/core/tools/
//    stragglar_search.py runs every construction below, the paper's App. E heuristic and CP-SAT
//    models, verifies each and stores the best: the lower bound for every such n, see
//    docs/schedules.md); generation is a table look-up and expansion;
//  * stragglar_circulant.cc: circulant designs (translation-invariant spreading of every chunk),
//    at most the lower bound + 2 rounds, with an optional greedy tail;
//  * stragglar_two_chain.cc: circulant designs constructed at generation time (n > 255);
//  * stragglar_matching.cc: the deadline-driven matching heuristic (n <= 64 without a stored
//    schedule, and the last resort).
// make_schedule takes the first that applies: Algorithm 1, a stored schedule, a stored circulant
// design (with the matching heuristic for n <= 64, the better kept), a constructed one, matching.
#include <algorithm>
#include <numeric>

#include "core/generators.h"
#include "core/stragglar_internal.h"

namespace stragg {
namespace core {
namespace stragglar_impl {

void add_exchange_with_straggler(Step& st, int rank, int sigma) {
  st.transfers.push_back({rank, sigma, rank, 1, RecvAction::kReduce});
  st.transfers.push_back({sigma, rank, rank, 1, RecvAction::kReduce});
}

void record_exchange(PropagationState& ps, int rank, int sigma, int round) {
  ps.give(rank, rank);
  ps.give(sigma, rank);
  ps.set_full(rank, round);
}

std::string internal(int n, int r, const std::string& what) {
  return "stragglar: internal error for n=" + std::to_string(n) + " in round " +
         std::to_string(r) + ": " + what;
}

bool RoundMatcher::add(int v, int c) {
  ++stamp_;
  chunk_of_[v] = c;
  if (augment(v)) return true;
  chunk_of_[v] = kNone;
  return false;
}

bool RoundMatcher::augment(int v) {
  const int c = chunk_of_[v];
  for (int s : ps_.holders(c)) {
    if (!can_send_[s] || seen_[s] == stamp_) continue;
    seen_[s] = stamp_;
    if (receiver_of_[s] == kNone || augment(receiver_of_[s])) {
      receiver_of_[s] = v;
      sender_of_[v] = s;
      return true;
    }
  }
  return false;
}

namespace {

// One round of Algorithm 1 in progress: the transfers, who is busy, what is received by copy.
struct Pow2Round {
  Step& st;
  std::vector<char> busy;
  std::vector<std::pair<int, int>> gains;  // (rank, chunk) received by copy this round
};

// Phase 1 (0 < r < log n): rank r-1 -> rank r-1+L; every other holder -> a chunk-less rank
// above 2(L-1).
void pow2_phase1(Pow2Round& rd, const PropagationState& ps, int n, int r, int L) {
  std::vector<int> senders;
  for (int g = 0; g < n - 1; ++g)
    if (!rd.busy[g] && g != r - 1)
      for (int c = 0; c < n - 1; ++c)
        if (ps.holds(g, c)) {
          senders.push_back(g);
          break;
        }
  auto send = [&](int from, int to) {
    int c = 0;
    while (!ps.holds(from, c)) ++c;
    rd.st.transfers.push_back({from, to, c, 1, RecvAction::kCopy});
    rd.busy[from] = rd.busy[to] = 1;
    rd.gains.push_back({to, c});
  };
  send(r - 1, r - 1 + L);
  int pool = 2 * (L - 1) + 1;
  for (int g : senders) {
    auto has_chunk = [&](int x) {
      for (int c = 0; c < n - 1; ++c)
        if (ps.holds(x, c)) return true;
      for (auto& gn : rd.gains)
        if (gn.first == x) return true;
      return false;
    };
    while (pool < n - 1 && (rd.busy[pool] || has_chunk(pool))) ++pool;
    if (pool >= n - 1) throw ScheduleError(internal(n, r, "phase-1 pool exhausted"));
    send(g, pool);
  }
}

// Phase 2/3 pairing: the critical window first (future straggler partners u in (r, r+L) may
// only receive chunks with index <= u - L: they must hold chunk u-L, and nothing newer, at round
// u), then the rest of P with the rest of Q in order.
std::vector<std::pair<int, int>> pow2_pairs(const std::vector<int>& P, const std::vector<int>& Q,
                                            const std::vector<int>& active_of, int n, int r,
                                            int L) {
  std::vector<int> crit, rest;
  for (int u : P) (u > r && u <= n - 2 && u - L < r - 1 ? crit : rest).push_back(u);
  std::sort(crit.begin(), crit.end());
  std::vector<char> used(Q.size(), 0);
  std::vector<std::pair<int, int>> pairs;
  for (int u : crit) {
    int best = kNone;
    for (size_t i = 0; i < Q.size(); ++i)
      if (!used[i] && active_of[Q[i]] <= u - L &&
          (best == kNone || active_of[Q[i]] < active_of[Q[best]]))
        best = static_cast<int>(i);
    if (best == kNone)
      throw ScheduleError(internal(n, r, "no partner for critical rank " + std::to_string(u)));
    used[best] = 1;
    pairs.push_back({u, Q[best]});
  }
  size_t qi = 0;
  for (int u : rest) {
    while (used[qi]) ++qi;
    used[qi] = 1;
    pairs.push_back({u, Q[qi]});
  }
  return pairs;
}

// Phase 2/3 (r >= log n): every non-straggler holds exactly one active chunk; the holders P of
// the oldest exchange it with the holders Q of the others.
void pow2_phase2(Pow2Round& rd, const PropagationState& ps, int n, int r, int L) {
  const int sigma = n - 1;
  std::vector<int> active_of(n, kNone);
  for (int g = 0; g < n - 1; ++g) {
    if (rd.busy[g]) continue;
    for (int c = 0; c < n - 1; ++c)
      if (ps.holds(g, c) && ps.active(c, r)) {
        if (active_of[g] != kNone)
          throw ScheduleError(
              internal(n, r, "rank " + std::to_string(g) + " holds two active chunks"));
        active_of[g] = c;
      }
  }
  const int oldest = r - L;
  std::vector<int> P, Q;
  for (int g = 0; g < n - 1; ++g) {
    if (rd.busy[g]) continue;
    if (active_of[g] == kNone) throw ScheduleError(internal(n, r, "rank without active chunk"));
    (active_of[g] == oldest ? P : Q).push_back(g);
  }
  if (r >= n - 1) {
    active_of[sigma] = n - 2;  // the straggler only ever sends the last chunk
    Q.push_back(sigma);
  }
  if (P.size() != Q.size())
    throw ScheduleError(internal(n, r, "|P| != |Q| (" + std::to_string(P.size()) + " vs " +
                                           std::to_string(Q.size()) + ")"));
  for (auto [u, v] : pow2_pairs(P, Q, active_of, n, r, L)) {
    if (v != sigma) {
      rd.st.transfers.push_back({u, v, oldest, 1, RecvAction::kCopy});
      rd.gains.push_back({v, oldest});
    }
    rd.st.transfers.push_back({v, u, active_of[v], 1, RecvAction::kCopy});
    rd.gains.push_back({u, active_of[v]});
  }
}

}  // namespace

void append_pow2(Schedule& s, int phase) {
  const int n = s.n, sigma = n - 1, L = detail::ceil_log2(n);
  PropagationState ps(n);
  const int total_rounds = n + L - 2;
  for (int r = 0; r < total_rounds; ++r) {
    Pow2Round rd{s.add_step(phase), std::vector<char>(n, 0), {}};
    if (r <= n - 2) {
      add_exchange_with_straggler(rd.st, r, sigma);
      rd.busy[r] = rd.busy[sigma] = 1;
    }
    if (r >= 1 && r < L)
      pow2_phase1(rd, ps, n, r, L);
    else if (r >= L)
      pow2_phase2(rd, ps, n, r, L);
    for (auto [g, c] : rd.gains) ps.give(g, c);
    if (r <= n - 2) record_exchange(ps, r, sigma, r);
  }
  if (!ps.all_complete())
    throw ScheduleError(internal(n, total_rounds, "chunks not fully propagated"));
}

namespace {

// Non-power-of-2 n up to this size also run the deadline heuristic and keep the better schedule.
constexpr int kHeuristicMaxN = 64;

// Builds the schedule for n; *construction names what built it (stragglar_construction).
Schedule make_schedule(int n, bool with_pre_arrival, std::string* construction) {
  if (n < 2) throw ScheduleError("stragglar: needs n >= 2, got " + std::to_string(n));
  Schedule s = Schedule::make("stragglar", Collective::kAllReduce, n, n - 1);
  s.stragglers = {n - 1};
  s.phases = {"pre_arrival_reduce_scatter", "stragglar"};
  if (with_pre_arrival) {
    std::vector<int> ranks(n - 1);
    std::iota(ranks.begin(), ranks.end(), 0);
    detail::append_ring_reduce_scatter(s, ranks, ranks, 1, 0, /*pre_arrival=*/true);
  }
  CirculantDesign design;
  if (detail::is_pow2(n)) {
    append_pow2(s, 1);
    *construction = "algorithm1";
  } else if (append_stored(s, 1, construction)) {
    // A stored schedule: the best of every construction and search, picked offline.
  } else if (load_design(n, design)) {
    Schedule circ = circulant_schedule(s, 1, design);
    *construction = "circulant_greedy_tail";
    if (n <= kHeuristicMaxN) {
      append_general_best(s, 1);
      if (circ.num_rounds() < s.num_rounds())
        s = std::move(circ);
      else
        *construction = "matching";
    } else {
      s = std::move(circ);
    }
  } else if (construct_design(n, design)) {
    // No tail compression here: its trials cost seconds at n ~ 1000 and did not pay off.
    PropagationState ps(n);
    append_circulant(s, 1, design, ps);
    *construction = "two_chain";
  } else {
    append_general_best(s, 1);
    *construction = "matching";
  }
  return s;
}

Schedule labelled(Schedule s, int straggler) {
  const int n = s.n;
  if (straggler < 0) straggler = n - 1;
  s.params_json = "{\"straggler\": " + std::to_string(straggler) + "}";
  return straggler == n - 1 ? s : relabel(s, straggler_permutation(n, straggler));
}

}  // namespace
}  // namespace stragglar_impl

int stragglar_round_lower_bound(int n) { return n - 2 + detail::ceil_log2(n); }

bool stragglar_builds_fast(int n) {
  using namespace stragglar_impl;
  CirculantDesign design;
  return n >= 2 && (detail::is_pow2(n) || n <= kHeuristicMaxN || has_stored(n) ||
                    construct_design(n, design));
}

std::string stragglar_construction(int n) {
  std::string name;
  stragglar_impl::make_schedule(n, false, &name);
  return name;
}

Schedule stragglar(int n, int straggler) {
  std::string name;
  return stragglar_impl::labelled(stragglar_impl::make_schedule(n, true, &name), straggler);
}

Schedule stragglar_post_arrival(int n, int straggler) {
  std::string name;
  return stragglar_impl::labelled(stragglar_impl::make_schedule(n, false, &name), straggler);
}

}  // namespace core
}  // namespace stragg
