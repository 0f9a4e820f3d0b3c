// StragglAR (Devraj et al., "Efficient AllReduce with Stragglers"), canonical straggler n-1.
//
// Pre-arrival: ring reduce-scatter among the n-1 early ranks over n-1 chunks; afterwards rank g
// holds chunk g reduced over all non-stragglers ("partially reduced").
// Post-arrival, round r <= n-2: rank r and the straggler exchange chunk r and both reduce, which
// makes chunk r fully reduced on both. Fully reduced chunks are copied onwards.
//
// Power-of-2 n: Algorithm 1 / App. D. Phase 1 (rounds < log n) gives every rank one fully reduced
// chunk by doubling; from round log n on, the holders P of the oldest active chunk are matched
// with the holders Q of the other active chunks (every rank holds exactly one active chunk), with
// the ranks in the critical window (future straggler partners) served first with chunks old
// enough not to be active at their straggler round; after round n-2 the straggler joins Q with
// the last chunk. Exactly n + log2(n) - 2 post-arrival rounds (Theorem 1); the generator checks
// the invariants of the proof and throws if one breaks.
//
// Other n (even and odd; App. E leaves odd n out): a circulant design (see "circulant designs"
// below; designs for n <= 255 precomputed offline in stragglar_designs.inc, larger n constructed
// at generation time by the two-chain construction) gives at most the lower bound + 2 rounds (+3
// for n = 507, 510, 511, 1019, 1022, 1023); for stored designs a deadline-driven tail after the
// straggler's last exchange often saves one. For n <= 64, and where no design can be had, the
// older deadline heuristic (append_general) also runs: each chunk c, fully reduced in round j, is
// due by round j + ceil(log2 n); every round the sends form a bipartite matching holders -> ranks
// lacking chunks (one send and one receive per rank, not necessarily pairwise), built by
// augmenting paths, urgent receives first. The schedule with fewer rounds is kept.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>

#include "core/generators.h"

namespace stragg {
namespace core {

namespace {

constexpr int kNone = -1;
// Non-power-of-2 n up to this size also run the deadline heuristic and keep the better schedule.
constexpr int kHeuristicMaxN = 64;

class PropagationState {
 public:
  PropagationState(int n) : n_(n), m_(n - 1), holds_(static_cast<size_t>(n) * (n - 1), 0),
                            count_(n - 1, 0), full_round_(n - 1, kNone), holders_(n - 1) {}
  bool holds(int rank, int chunk) const { return holds_[static_cast<size_t>(rank) * m_ + chunk]; }
  void give(int rank, int chunk) {
    char& h = holds_[static_cast<size_t>(rank) * m_ + chunk];
    if (!h) {
      h = 1;
      holders_[chunk].push_back(rank);
      if (rank != n_ - 1) ++count_[chunk];
    }
  }
  const std::vector<int>& holders(int chunk) const { return holders_[chunk]; }
  // Non-straggler holders of a fully reduced chunk.
  int count(int chunk) const { return count_[chunk]; }
  bool complete(int chunk) const { return count_[chunk] == m_; }
  int full_round(int chunk) const { return full_round_[chunk]; }
  void set_full(int chunk, int round) { full_round_[chunk] = round; }
  bool active(int chunk, int round) const {
    return full_round_[chunk] != kNone && full_round_[chunk] < round && !complete(chunk);
  }
  bool all_complete() const {
    for (int c = 0; c < m_; ++c)
      if (!complete(c)) return false;
    return true;
  }

 private:
  int n_, m_;
  std::vector<char> holds_;
  std::vector<int> count_, full_round_;
  std::vector<std::vector<int>> holders_;
};

void add_exchange_with_straggler(Step& st, int rank, int sigma) {
  st.transfers.push_back({rank, sigma, rank, 1, RecvOp::kReduce});
  st.transfers.push_back({sigma, rank, rank, 1, RecvOp::kReduce});
}

std::string internal(int n, int r, const std::string& what) {
  return "stragglar: internal error for n=" + std::to_string(n) + " in round " +
         std::to_string(r) + ": " + what;
}

// ---------------------------------------------------------------- power of 2 (Algorithm 1)
void append_pow2(Schedule& s, int phase) {
  const int n = s.n, sigma = n - 1, L = detail::ceil_log2(n);
  PropagationState ps(n);
  const int total_rounds = n + L - 2;
  for (int r = 0; r < total_rounds; ++r) {
    Step& st = s.add_step(phase);
    std::vector<char> busy(n, 0);
    std::vector<std::pair<int, int>> gains;  // (rank, chunk) received by copy this round
    if (r <= n - 2) {
      add_exchange_with_straggler(st, r, sigma);
      busy[r] = busy[sigma] = 1;
    }
    if (r >= 1 && r < L) {
      // Phase 1: rank r-1 -> rank r-1+L; every other holder -> a chunk-less rank > 2(L-1).
      std::vector<int> senders;
      for (int g = 0; g < n - 1; ++g)
        if (!busy[g] && g != r - 1)
          for (int c = 0; c < n - 1; ++c)
            if (ps.holds(g, c)) {
              senders.push_back(g);
              break;
            }
      auto send = [&](int from, int to) {
        int c = 0;
        while (!ps.holds(from, c)) ++c;
        st.transfers.push_back({from, to, c, 1, RecvOp::kCopy});
        busy[from] = busy[to] = 1;
        gains.push_back({to, c});
      };
      send(r - 1, r - 1 + L);
      int pool = 2 * (L - 1) + 1;
      for (int g : senders) {
        auto has_chunk = [&](int x) {
          for (int c = 0; c < n - 1; ++c)
            if (ps.holds(x, c)) return true;
          for (auto& gn : gains)
            if (gn.first == x) return true;
          return false;
        };
        while (pool < n - 1 && (busy[pool] || has_chunk(pool))) ++pool;
        if (pool >= n - 1) throw ScheduleError(internal(n, r, "phase-1 pool exhausted"));
        send(g, pool);
      }
    } else if (r >= L) {
      // Phase 2/3: every non-straggler holds exactly one active chunk.
      std::vector<int> active_of(n, kNone);
      for (int g = 0; g < n - 1; ++g) {
        if (busy[g]) continue;
        for (int c = 0; c < n - 1; ++c)
          if (ps.holds(g, c) && ps.active(c, r)) {
            if (active_of[g] != kNone)
              throw ScheduleError(internal(n, r, "rank " + std::to_string(g) +
                                                     " holds two active chunks"));
            active_of[g] = c;
          }
      }
      const int oldest = r - L;
      std::vector<int> P, Q;
      for (int g = 0; g < n - 1; ++g) {
        if (busy[g]) continue;
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
      // Critical window: future straggler partners u in (r, r+L) may only receive chunks with
      // index <= u - L (they must hold chunk u-L, and nothing newer, at round u).
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
      for (auto [u, v] : pairs) {
        if (v != sigma) {
          st.transfers.push_back({u, v, oldest, 1, RecvOp::kCopy});
          gains.push_back({v, oldest});
        }
        st.transfers.push_back({v, u, active_of[v], 1, RecvOp::kCopy});
        gains.push_back({u, active_of[v]});
      }
    }
    for (auto [g, c] : gains) ps.give(g, c);
    if (r <= n - 2) {
      ps.give(r, r);
      ps.give(sigma, r);
      ps.set_full(r, r);
    }
  }
  if (!ps.all_complete())
    throw ScheduleError(internal(n, total_rounds, "chunks not fully propagated"));
}

// ---------------------------------------------------------------- general n
// Bipartite matching senders -> receivers, receivers carry the chunk they get.
class RoundMatcher {
 public:
  RoundMatcher(const PropagationState& ps, int n, const std::vector<char>& can_send)
      : ps_(ps), n_(n), can_send_(can_send), sender_of_(n, kNone), chunk_of_(n, kNone),
        receiver_of_(n, kNone), seen_(n, 0) {}

  bool matched_receiver(int v) const { return sender_of_[v] != kNone; }

  // Tries to let receiver v get chunk c, re-routing other receivers' senders if needed.
  bool add(int v, int c) {
    ++stamp_;
    chunk_of_[v] = c;
    if (augment(v)) return true;
    chunk_of_[v] = kNone;
    return false;
  }

  template <typename F>
  void for_each(F f) const {
    for (int v = 0; v < n_; ++v)
      if (sender_of_[v] != kNone) f(sender_of_[v], v, chunk_of_[v]);
  }

 private:
  bool augment(int v) {
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

  const PropagationState& ps_;
  int n_;
  const std::vector<char>& can_send_;
  std::vector<int> sender_of_, chunk_of_, receiver_of_, seen_;
  int stamp_ = 0;
};

struct GeneralVariant {
  bool adaptive_partner = false;  // choose the straggler's partner each round (else rank r)
  bool fill = true;               // tier 2: use idle ports for receives ahead of schedule
  bool load_first = false;        // order tier-1 receivers by load before personal deadline
  int slack = 0;                  // extra rounds allowed per chunk beyond ceil(log2 n)
  uint64_t seed = 0;              // 0: ties broken by rank; else a fixed pseudo-random order
};

// Deterministic tie-break keys (splitmix64), so every variant is a pure function of its seed.
std::vector<uint64_t> tie_keys(int n, uint64_t seed) {
  std::vector<uint64_t> k(n);
  for (int i = 0; i < n; ++i) {
    uint64_t z = seed ? seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ULL : i;
    if (seed) {
      z ^= z >> 30;
      z *= 0xBF58476D1CE4E5B9ULL;
      z ^= z >> 27;
      z *= 0x94D049BB133111EBULL;
      z ^= z >> 31;
    }
    k[i] = z;
  }
  return k;
}

void append_general(Schedule& s, int phase, const GeneralVariant& var) {
  const int n = s.n, sigma = n - 1, m = n - 1, L = detail::ceil_log2(n);
  PropagationState ps(n);
  std::vector<int> partner_round(n, kNone);  // round in which rank g pairs with the straggler
  if (!var.adaptive_partner)
    for (int g = 0; g < m; ++g) partner_round[g] = g;
  std::vector<int> chunk_of_round(n, kNone);
  const std::vector<uint64_t> tie = tie_keys(n, var.seed);
  auto deadline = [&](int c) {
    // Chunk c is full after its straggler round; ceil(log2 n) rounds to reach everyone, one
    // fewer for the last chunk, which the (then free) straggler helps spread.
    return ps.full_round(c) + var.slack + (ps.full_round(c) == m - 1 ? std::max(L - 1, 1) : L);
  };
  const int max_rounds = 4 * n + 8 * L + 8;
  for (int r = 0; !ps.all_complete() || r < n - 1; ++r) {
    if (r > max_rounds) throw ScheduleError(internal(n, r, "no progress"));
    std::vector<int> active;
    for (int c = 0; c < m; ++c)
      if (ps.active(c, r)) active.push_back(c);
    std::sort(active.begin(), active.end(), [&](int a, int b) {
      return deadline(a) != deadline(b) ? deadline(a) < deadline(b) : a < b;
    });
    int partner = kNone;
    if (r <= n - 2) {
      if (var.adaptive_partner) {
        // The rank whose most urgent missing chunk is least urgent (it cannot receive now).
        int best_key = -1;
        for (int g = 0; g < m; ++g) {
          if (partner_round[g] != kNone) continue;
          int key = 1 << 29;
          for (int c : active)
            if (!ps.holds(g, c)) {
              key = deadline(c);
              break;
            }
          if (key > best_key || (key == best_key && tie[g] < tie[partner]))
            best_key = key, partner = g;
        }
        partner_round[partner] = r;
      } else {
        partner = r;
      }
      chunk_of_round[r] = partner;
    }
    Step& st = s.add_step(phase);
    std::vector<char> can_send(n, 0), can_recv(n, 0);
    for (int g = 0; g < m; ++g) can_send[g] = can_recv[g] = 1;
    if (partner != kNone) {
      add_exchange_with_straggler(st, partner, sigma);
      can_send[partner] = can_recv[partner] = 0;
    } else {
      can_send[sigma] = 1;  // holds everything from now on
    }
    // Active chunks held per rank (to prefer receivers that would otherwise idle as senders).
    std::vector<int> load(n, 0);
    for (int c : active)
      for (int g = 0; g < m; ++g)
        if (ps.holds(g, c)) ++load[g];
    auto personal_deadline = [&](int g, int c) {
      const int d = deadline(c);
      const int pr = partner_round[g];
      return (pr != kNone && pr > r && d == pr) ? pr - 1 : d;
    };
    auto next_partner = [&](int g) { return partner_round[g] == r + 1; };

    RoundMatcher match(ps, n, can_send);
    const bool sigma_free = r >= n - 2;
    // Tier 1: receives required to keep each chunk on schedule, earliest deadline first.
    for (int c : active) {
      const int left = std::max(deadline(c) - r, 0);
      const int target = m + (sigma_free ? 1 : 0);
      const int have = ps.count(c) + (sigma_free ? 1 : 0);
      const long long reach = left >= 30 ? (1LL << 30) : (1LL << left);
      int need = static_cast<int>(std::max<long long>(0, (target + reach - 1) / reach - have));
      std::vector<int> cand;
      for (int g = 0; g < m; ++g)
        if (can_recv[g] && !match.matched_receiver(g) && !ps.holds(g, c)) cand.push_back(g);
      std::sort(cand.begin(), cand.end(), [&](int a, int b) {
        const int da = personal_deadline(a, c), db = personal_deadline(b, c);
        if (var.load_first && load[a] != load[b]) return load[a] < load[b];
        if (da != db) return da < db;
        if (next_partner(a) != next_partner(b)) return !next_partner(a);
        if (load[a] != load[b]) return load[a] < load[b];
        return tie[a] < tie[b];
      });
      for (int g : cand) {
        const bool must = personal_deadline(g, c) <= r;
        if (need <= 0 && !must) continue;
        if (match.add(g, c)) {
          --need;
          ++load[g];
        }
      }
    }
    if (var.fill) {
      // Tier 2: any other useful receive, earliest deadline first.
      std::vector<int> order;
      for (int g = 0; g < m; ++g)
        if (can_recv[g]) order.push_back(g);
      std::sort(order.begin(), order.end(), [&](int a, int b) {
        if (next_partner(a) != next_partner(b)) return !next_partner(a);
        if (load[a] != load[b]) return load[a] < load[b];
        return tie[a] < tie[b];
      });
      for (int g : order) {
        if (match.matched_receiver(g)) continue;
        for (int c : active)
          if (!ps.holds(g, c) && match.add(g, c)) break;
      }
    }
    std::vector<std::pair<int, int>> gains;
    match.for_each([&](int from, int to, int c) {
      st.transfers.push_back({from, to, c, 1, RecvOp::kCopy});
      gains.push_back({to, c});
    });
    for (auto [g, c] : gains) ps.give(g, c);
    if (partner != kNone) {
      ps.give(partner, partner);
      ps.give(sigma, partner);
      ps.set_full(partner, r);
    }
  }
}

// ---------------------------------------------------------------- circulant designs
// Ranks live on Z_m (m = n - 1); in round r rank g sits at position y = g - r (mod m), position 0
// being the straggler's partner. A design gives every position y != 0 a receive age beta(y): the
// rank there receives the chunk born beta(y) rounds ago (chunk r - beta(y)); and a send age
// alpha(y). Translation invariance makes every chunk spread identically: the rank at offset
// d = g - j from chunk j's birth rank receives it at age rho(d) with d = y + beta(y). Conditions:
// y -> y + beta(y) is a bijection of Z_m \ {0}; a rank sends age a only if it already holds that
// chunk (rho(y + a) < a, rho(0) = 0); senders and receivers of every age are equally many. Then
// every round is valid, chunk j is complete after round j + max(beta), and the schedule has
// m + max(beta) post-arrival rounds. For n <= 255 beta comes from csrc/core/stragglar_designs.inc
// (found offline by csrc/core/tools/stragglar_designs.py, an ILP); alpha is recomputed here by a
// bipartite b-matching (positions -> ages), which the ILP guarantees to exist. Larger n: see the
// two-chain construction below (beta and alpha together).
struct CirculantDesign {
  int A = 0;                     // largest age
  std::vector<int> beta, alpha;  // per position, index 0 unused
};

#include "core/stragglar_designs.inc"

bool load_design(int n, CirculantDesign& d) {
  const int m = n - 1;
  const char* enc = nullptr;
  for (const auto& e : kStragglarDesigns)
    if (e.n == n) {
      d.A = e.max_age;
      enc = e.beta;
      break;
    }
  if (!enc) return false;
  d.beta.assign(m, 0);
  for (int y = 1; y < m; ++y) d.beta[y] = enc[y - 1] - '0';
  // rho per offset and the receive counts per age.
  std::vector<int> rho(m, 0), cap(d.A + 1, 0);
  for (int y = 1; y < m; ++y) {
    rho[(y + d.beta[y]) % m] = d.beta[y];
    ++cap[d.beta[y]];
  }
  // b-matching positions -> ages by augmenting paths.
  d.alpha.assign(m, 0);
  std::vector<std::vector<int>> at_age(d.A + 1);
  std::vector<int> seen(m, 0);
  int stamp = 0;
  auto can = [&](int y, int a) { return rho[(y + a) % m] < a; };
  std::function<bool(int)> augment = [&](int y) -> bool {
    for (int a = d.A; a >= 1; --a) {
      if (!can(y, a)) continue;
      if (static_cast<int>(at_age[a].size()) < cap[a]) {
        at_age[a].push_back(y);
        d.alpha[y] = a;
        return true;
      }
    }
    for (int a = d.A; a >= 1; --a) {
      if (!can(y, a)) continue;
      for (int& z : at_age[a]) {
        if (seen[z] == stamp) continue;
        seen[z] = stamp;
        const int old = z;
        z = y;  // y takes z's place; z looks for another age
        d.alpha[y] = a;
        d.alpha[old] = 0;
        if (augment(old)) return true;
        z = old;
        d.alpha[old] = a;
        d.alpha[y] = 0;
      }
    }
    return false;
  };
  for (int y = 1; y < m; ++y) {
    ++stamp;
    if (!augment(y)) return false;
  }
  return true;
}

// Two-chain construction (n > 255 without a stored design; milliseconds). In the frame of one rank
// (slot k = round minus the rank's straggler round, position y = -k), the chunk born k' slots
// after the rank's own is born in slot k' and received in some slot k' + beta, beta in 1..A. We
// look for designs in which every rank holds exactly two "young" chunks (of age <= A, received at
// a smaller age) at the start of every slot. They are two
// chains X and Y, each tiling Z_m with intervals: the interval [t+1, t+l] is the life of the chunk
// received in slot t at age A - l (at slot t + i it has age A - l + i); the own chunk's interval
// is [1, A] in chain X (received at age 0 in slot 0). Interval ends of X and Y never coincide; a
// slot in which neither chain's interval ends receives the chunk of age A. Chain X sends its young
// chunk in every slot k != 0 (inner nodes of every chunk's spanning tree, forwarding at every age
// up to A) except in z "swap" slots: an end t of X followed by an end of Y at t + 1, where Y sends
// its chunk at age A - 1 instead; otherwise Y never sends (leaves). With S_a (a < A) = receives at
// age a and S_A = number of X intervals, X has S_{a+1} - S_a intervals of length A - a and Y has
// 2 S_a - S_{a+1} of them (plus z of length 1), and per age the sends equal the receives. Both
// chains tile Z_m iff P_A = m and P_1 + ... + P_{A-1} + z = 2m - A (P_a = S_1 + ... + S_a), with
// S_1 = 1, S_a <= S_{a+1} <= 2 S_a. find_profile enumerates such S (most doubling first) for the
// smallest A, arrange_chains orders the intervals so that no ends coincide (greedy variants, then
// seeded random ones: deterministic), and check_design re-checks the circulant conditions. For
// 257 <= n <= 1023 this gives A = ceil(log2 n) + 1 (lower bound + 2, as the stored designs) except
// n = 507, 510, 511, 1019, 1022, 1023 (A one larger).

// Enumerates profiles S[1..A] with z as above (z: slots in which Y sends instead of X, see
// arrange_chains), most doubling first, until `use` accepts one (true) or a search budget runs out.
bool find_profile(int m, int A, const std::function<bool(const std::vector<long long>&, long long)>& use) {
  const long long target = 2LL * m - A;
  std::vector<long long> S(A + 1, 0);
  S[1] = 1;
  long long nodes = 0;
  std::function<bool(int, long long, long long, long long)> go =
      [&](int a, long long s, long long P, long long Sig) -> bool {
    if (++nodes > 100000) return false;
    if (a == A - 2) {
      // S_{A-1} = u = T - z, S_A = v = m - P - u; smallest z that keeps every count >= 0.
      const long long T = target - Sig - P;
      long long z0 = std::max<long long>({0, T - 2 * s, (2 * T - m + P + 1) / 2});
      const long long u = T - z0, v = m - P - u;
      if (s <= u && u <= 2 * s && u <= v && v - u <= u + z0 && z0 <= v - 1) {
        S[a + 1] = u;
        S[a + 2] = v;
        return use(S, z0);
      }
      return false;
    }
    const int r = A - a;  // ages a+1 .. A remain
    for (long long s2 = 2 * s; s2 >= s; --s2) {
      // Smallest continuation: S constant; largest: doubling.
      if (P + s2 * r > m) continue;
      long long pmax = P, smax = 0, smin = 0, x = s2;
      for (int i = 0; i < r; ++i) {
        pmax += x;
        if (i < r - 1) smax += pmax, smin += P + s2 * (i + 1);
        x = std::min<long long>(2 * x, 1LL << 40);
      }
      if (pmax < m) break;
      if (Sig + smin > target) continue;
      if (Sig + smax + m < target) break;
      S[a + 1] = s2;
      if (go(a + 1, s2, P + s2, Sig + P + s2)) return true;
    }
    return false;
  };
  return A >= 4 && go(1, 1, 1, 1);
}

constexpr int kGreedyAttempts = 64;
constexpr int kArrangeAttempts = 256;     // for the first profile of an A
constexpr int kArrangeAttemptsLater = 16;  // for further profiles
constexpr int kMaxProfiles = 200;

// Deterministic pseudo-random numbers (splitmix64).
struct SplitMix {
  uint64_t x;
  uint64_t next() {
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  int below(int k) { return static_cast<int>(next() % static_cast<uint64_t>(k)); }
};

// Orders X's and Y's intervals (counts by length) on Z_m; fills per-slot receive and send ages.
// In z of X's interval ends t, Y's interval ends at t + 1 and Y sends (age A - 1) instead of X.
// Attempt 0 is greedy (largest remaining fraction first); later attempts randomize the choices.
bool arrange_chains(int m, int A, const std::vector<int>& xcount, const std::vector<int>& ycount,
                    long long z, int attempt, std::vector<int>& recv, std::vector<int>& send) {
  SplitMix rng{0x5EEDULL + static_cast<uint64_t>(attempt) * 7919};
  // X: the own interval [1, A], then the others interleaved by length (least placed fraction
  // first, or random), ending at slot m = 0.
  std::vector<int> xlen, xplaced(A + 1, 0);
  int xtotal = 0;
  for (int l = 1; l <= A; ++l) xtotal += xcount[l];
  for (int i = 0; i < xtotal; ++i) {
    int best = -1;
    if (attempt >= kGreedyAttempts && attempt % 4 == 3) {
      int k = rng.below(xtotal - i);
      for (int l = 1; l <= A && best < 0; ++l) {
        if (k < xcount[l] - xplaced[l]) best = l;
        k -= xcount[l] - xplaced[l];
      }
    } else {
      for (int l = 1; l <= A; ++l)
        if (xplaced[l] < xcount[l] &&
            (best < 0 || static_cast<long long>(xplaced[l]) * xcount[best] <
                             static_cast<long long>(xplaced[best]) * xcount[l]))
          best = l;
    }
    xlen.push_back(best);
    ++xplaced[best];
  }
  if (attempt & 1) std::reverse(xlen.begin(), xlen.end());
  std::vector<int> next_len(m, 0);   // slot -> length of X's interval starting after it
  std::vector<char> xend(m + 1, 0);  // slot is the end of an X interval
  std::vector<int> xnext(m + 1, 0);  // slot -> end of the X interval containing it
  {
    int t = A;
    xend[0] = xend[A % m] = 1;
    for (int l : xlen) {
      next_len[t % m] = l;
      t += l;
      xend[t % m] = 1;
    }
    if (t != m) return false;
    int e = m;
    for (int k = m; k >= 1; --k) {
      if (xend[k % m]) e = k;
      xnext[k] = e;
    }
    next_len[0] = A;
  }
  // Y: from a start slot o (an end of Y); while swaps are due, end just after X's next end;
  // otherwise a length whose end avoids X's ends.
  int ytotal = 0;
  for (int l = 1; l <= A; ++l) ytotal += ycount[l];
  int o = attempt < kGreedyAttempts ? 1 : 1 + rng.below(m - 1);
  for (int skip = attempt < kGreedyAttempts ? attempt / 2 : 0;; ++o) {
    if (o >= m) return false;
    if (!xend[o] && skip-- == 0) break;
  }
  std::vector<int> left(ycount);
  std::vector<char> yend(m, 0), swap(m, 0);
  std::vector<int> ynext_len(m, 0);
  long long zleft = z;
  int p = o;
  for (int i = 0; i < ytotal; ++i) {
    int best = -1;
    const int e = xnext[p % m + 1] + (p - p % m);  // X's next end after p (unwrapped)
    if (zleft > 0) {
      const int l = e + 1 - p;
      if (e % m != 0 && l >= 2 && l <= A && left[l] > 0 && !xend[(p + l) % m]) best = l;
    }
    const bool swapped = best > 0;
    if (!swapped) {
      int total = 0;
      for (int l = 1; l <= A; ++l) {
        if (left[l] == 0 || xend[(p + l) % m]) continue;
        total += left[l];
        if (best < 0 || static_cast<long long>(left[l]) * ycount[best] >
                            static_cast<long long>(left[best]) * ycount[l])
          best = l;
      }
      if (attempt >= kGreedyAttempts && total > 0 && rng.below(4) == 0) {
        int k = rng.below(total);
        for (int l = 1; l <= A; ++l) {
          if (left[l] == 0 || xend[(p + l) % m]) continue;
          if (k < left[l]) {
            best = l;
            break;
          }
          k -= left[l];
        }
      }
    }
    if (best < 0) return false;
    --left[best];
    ynext_len[p % m] = best;
    p += best;
    yend[p % m] = 1;
    if (swapped) {
      swap[(p - 1) % m] = 1;
      --zleft;
    }
  }
  if (p != o + m || zleft != 0) return false;
  recv.assign(m, 0);
  send.assign(m, 0);
  for (int k = 1; k < m; ++k) {
    recv[k] = xend[k] ? A - next_len[k] : (yend[k] ? A - ynext_len[k] : A);
    send[k] = swap[k] ? A - 1 : A - (xnext[k] - k);
  }
  return true;
}

// Checks the circulant conditions (bijection, send feasibility, per-age balance).
bool check_design(int m, const CirculantDesign& d) {
  std::vector<int> rho(m, -1);
  rho[0] = 0;
  std::vector<int> bal(d.A + 1, 0);
  for (int y = 1; y < m; ++y) {
    if (d.beta[y] < 1 || d.beta[y] > d.A || d.alpha[y] < 1 || d.alpha[y] > d.A) return false;
    const int off = (y + d.beta[y]) % m;
    if (rho[off] != -1) return false;
    rho[off] = d.beta[y];
    ++bal[d.beta[y]];
    --bal[d.alpha[y]];
  }
  for (int y = 1; y < m; ++y)
    if (rho[(y + d.alpha[y]) % m] >= d.alpha[y]) return false;
  for (int a = 1; a <= d.A; ++a)
    if (bal[a] != 0) return false;
  return true;
}

bool construct_design(int n, CirculantDesign& d) {
  const int m = n - 1, L = detail::ceil_log2(n);
  if (n < 8 || detail::is_pow2(n)) return false;
  for (int A = L + 1; A <= L + 4; ++A) {
    int profiles = 0;
    auto use = [&](const std::vector<long long>& S, long long z) -> bool {
      const int attempts = profiles++ == 0 ? kArrangeAttempts : kArrangeAttemptsLater;
      if (profiles > kMaxProfiles) return true;  // give up on this A
      std::vector<int> xcount(A + 1, 0), ycount(A + 1, 0);
      for (int a = 1; a < A; ++a) {
        xcount[A - a] = static_cast<int>(S[a + 1] - S[a]);
        ycount[A - a] = static_cast<int>(2 * S[a] - S[a + 1] + (a == A - 1 ? z : 0));
      }
      for (int attempt = 0; attempt < attempts; ++attempt) {
        std::vector<int> recv, send;
        if (!arrange_chains(m, A, xcount, ycount, z, attempt, recv, send)) continue;
        d.A = A;
        d.beta.assign(m, 0);
        d.alpha.assign(m, 0);
        for (int k = 1; k < m; ++k) {
          d.beta[m - k] = recv[k];
          d.alpha[m - k] = send[k];
        }
        if (check_design(m, d)) return true;
      }
      return false;
    };
    if (find_profile(m, A, use) && profiles <= kMaxProfiles) return true;
  }
  return false;
}

// Appends the design's rounds 0 .. min(limit, m + A) - 1 and records them in ps.
void append_circulant(Schedule& s, int phase, const CirculantDesign& d, PropagationState& ps,
                      int limit = 1 << 30) {
  const int n = s.n, m = n - 1, sigma = n - 1;
  int A = 0;
  for (int y = 1; y < m; ++y) A = std::max(A, d.beta[y]);
  const int total = std::min(limit, m + A);
  std::vector<std::vector<int>> senders(A + 1), receivers(A + 1);
  for (int r = 0; r < total; ++r) {
    Step& st = s.add_step(phase);
    if (r < m) add_exchange_with_straggler(st, r, sigma);
    for (int a = 1; a <= A; ++a) senders[a].clear(), receivers[a].clear();
    for (int y = 1; y < m; ++y) {
      const int g = (r + y) % m;
      const int jr = r - d.beta[y], js = r - d.alpha[y];
      if (jr >= 0 && jr < m) receivers[d.beta[y]].push_back(g);
      if (d.alpha[y] > 0 && js >= 0 && js < m) senders[d.alpha[y]].push_back(g);
    }
    for (int a = 1; a <= A; ++a) {
      if (senders[a].size() != receivers[a].size())
        throw ScheduleError(internal(n, r, "circulant design unbalanced at age " + std::to_string(a)));
      for (size_t i = 0; i < senders[a].size(); ++i)
        st.transfers.push_back({senders[a][i], receivers[a][i], r - a, 1, RecvOp::kCopy});
    }
    for (int a = 1; a <= A; ++a)
      for (int g : receivers[a]) ps.give(g, r - a);
    if (r < m) {
      ps.give(r, r);
      ps.give(sigma, r);
      ps.set_full(r, r);
    }
  }
}

// Tail: from round r0 >= n - 1 (every chunk fully reduced, the straggler free to send), tries to
// finish by round `target` (exclusive): each round, every chunk first gets the receives it needs to
// stay on a doubling track to the target (fewest holders first), then idle ports fill in.
bool finish_by(Schedule& s, int phase, PropagationState ps, int r0, int target) {
  const int n = s.n, m = n - 1;
  for (int r = r0; r < target; ++r) {
    if (ps.all_complete()) break;
    std::vector<int> active;
    for (int c = 0; c < m; ++c)
      if (!ps.complete(c)) active.push_back(c);
    std::sort(active.begin(), active.end(),
              [&](int a, int b) { return ps.count(a) != ps.count(b) ? ps.count(a) < ps.count(b) : a < b; });
    std::vector<char> can_send(n, 1);
    RoundMatcher match(ps, n, can_send);
    const int left = target - r;  // rounds left including this one
    std::vector<int> missing(n, 0);
    for (int g = 0; g < m; ++g)
      for (int c : active)
        if (!ps.holds(g, c)) ++missing[g];
    for (int c : active) {
      const long long reach = left - 1 >= 30 ? (1LL << 30) : (1LL << (left - 1));
      int need = static_cast<int>(std::max<long long>(0, (n + reach - 1) / reach - (ps.count(c) + 1)));
      if (need == 0) continue;
      std::vector<int> cand;
      for (int g = 0; g < m; ++g)
        if (!match.matched_receiver(g) && !ps.holds(g, c)) cand.push_back(g);
      std::sort(cand.begin(), cand.end(), [&](int a, int b) {
        return missing[a] != missing[b] ? missing[a] > missing[b] : a < b;
      });
      for (int g : cand) {
        if (need == 0) break;
        if (match.add(g, c)) --need;
      }
      if (need > 0) return false;
    }
    for (int g = 0; g < m; ++g) {
      if (match.matched_receiver(g)) continue;
      for (int c : active)
        if (!ps.holds(g, c) && match.add(g, c)) break;
    }
    Step& st = s.add_step(phase);
    std::vector<std::pair<int, int>> gains;
    match.for_each([&](int from, int to, int c) {
      st.transfers.push_back({from, to, c, 1, RecvOp::kCopy});
      gains.push_back({to, c});
    });
    for (auto [g, c] : gains) ps.give(g, c);
  }
  return ps.all_complete();
}

// The design's rounds up to the straggler's last exchange (or a few rounds earlier), then the
// shortest tail finish_by finds; the plain design when no tail beats it.
Schedule circulant_schedule(const Schedule& base, int phase, const CirculantDesign& d) {
  const int n = base.n, m = n - 1;
  Schedule best = base;
  {
    PropagationState ps(n);
    append_circulant(best, phase, d, ps);
  }
  const int plain = best.num_rounds() - base.num_rounds();
  const int lb = stragglar_round_lower_bound(n);
  for (int target = lb; target < plain; ++target) {
    for (int r0 = m; r0 <= m + 1 && r0 < target; ++r0) {
      Schedule s = base;
      PropagationState ps(n);
      append_circulant(s, phase, d, ps, r0);
      if (finish_by(s, phase, ps, r0, target)) return s;
    }
  }
  return best;
}

// Runs a small portfolio of deterministic variants and keeps the one with the fewest rounds.
void append_general_best(Schedule& s, int phase) {
  Schedule best;
  bool have = false;
  const int lb = stragglar_round_lower_bound(s.n);
  const int trials = s.n <= 128 ? 12 : 4;
  for (int bits = 0; bits < trials; ++bits) {
    GeneralVariant v;
    v.adaptive_partner = bits & 1;
    v.fill = !(bits & 2);
    v.slack = bits < 4 ? 1 : (bits < 8 ? 0 : 2);
    v.load_first = bits >= 8;
    Schedule trial = s;
    append_general(trial, phase, v);
    if (!have || trial.num_rounds() < best.num_rounds()) {
      best = std::move(trial);
      have = true;
    }
    if (best.num_rounds() - s.num_rounds() == lb) break;
  }
  s = std::move(best);
}

Schedule make_schedule(int n, bool with_pre_arrival) {
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
  } else if (load_design(n, design)) {
    Schedule circ = circulant_schedule(s, 1, design);
    if (n <= kHeuristicMaxN) {
      append_general_best(s, 1);
      if (circ.num_rounds() < s.num_rounds()) s = std::move(circ);
    } else {
      s = std::move(circ);
    }
  } else if (construct_design(n, design)) {
    // No tail compression here: its trials cost seconds at n ~ 1000 and did not pay off.
    PropagationState ps(n);
    append_circulant(s, 1, design, ps);
  } else {
    append_general_best(s, 1);
  }
  return s;
}

}  // namespace

int stragglar_round_lower_bound(int n) { return n - 2 + detail::ceil_log2(n); }

bool stragglar_builds_fast(int n) {
  CirculantDesign design;
  return n >= 2 && (detail::is_pow2(n) || n <= kHeuristicMaxN || load_design(n, design) ||
                    construct_design(n, design));
}

Schedule stragglar(int n, int straggler) {
  Schedule s = make_schedule(n, true);
  if (straggler < 0) straggler = n - 1;
  s.params_json = "{\"straggler\": " + std::to_string(straggler) + "}";
  return straggler == n - 1 ? s : relabel(s, straggler_permutation(n, straggler));
}

Schedule stragglar_post_arrival(int n, int straggler) {
  Schedule s = make_schedule(n, false);
  if (straggler < 0) straggler = n - 1;
  s.params_json = "{\"straggler\": " + std::to_string(straggler) + "}";
  return straggler == n - 1 ? s : relabel(s, straggler_permutation(n, straggler));
}

}  // namespace core
}  // namespace stragg
