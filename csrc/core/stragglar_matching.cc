// StragglAR's deadline-driven matching heuristic (any n; run for n <= 64 and as a fallback).
//
// Each chunk c, fully reduced in round j, is due by round j + ceil(log2 n); every round the sends
// form a bipartite matching holders -> ranks lacking chunks (one send and one receive per rank,
// not necessarily pairwise), built by augmenting paths (RoundMatcher): first the receives each
// chunk needs to stay on a doubling track to its deadline (earliest deadline first), then any
// other useful receive. A small portfolio of deterministic variants (straggler partner fixed or
// adaptive, with or without the second tier, deadline slack, receiver order) runs and the schedule
// with the fewest rounds is kept.
#include <algorithm>

#include "core/stragglar_internal.h"

namespace stragg {
namespace core {
namespace stragglar_impl {
namespace {

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
    uint64_t z = seed ? seed * 0x9E3779B97F4A7C15ULL +
                            static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ULL
                      : i;
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

// One run of the heuristic for one variant.
class GeneralRun {
 public:
  GeneralRun(int n, const GeneralVariant& var)
      : n_(n), m_(n - 1), L_(detail::ceil_log2(n)), var_(var), ps_(n),
        partner_round_(n, kNone), tie_(tie_keys(n, var.seed)) {
    if (!var.adaptive_partner)
      for (int g = 0; g < m_; ++g) partner_round_[g] = g;
  }

  void append(Schedule& s, int phase) {
    const int sigma = n_ - 1, max_rounds = 4 * n_ + 8 * L_ + 8;
    for (int r = 0; !ps_.all_complete() || r < n_ - 1; ++r) {
      if (r > max_rounds) throw ScheduleError(internal(n_, r, "no progress"));
      std::vector<int> active;
      for (int c = 0; c < m_; ++c)
        if (ps_.active(c, r)) active.push_back(c);
      std::sort(active.begin(), active.end(), [&](int a, int b) {
        return deadline(a) != deadline(b) ? deadline(a) < deadline(b) : a < b;
      });
      const int partner = r <= n_ - 2 ? choose_partner(r, active) : kNone;
      Step& st = s.add_step(phase);
      std::vector<char> can_send(n_, 0), can_recv(n_, 0);
      for (int g = 0; g < m_; ++g) can_send[g] = can_recv[g] = 1;
      if (partner != kNone) {
        add_exchange_with_straggler(st, partner, sigma);
        can_send[partner] = can_recv[partner] = 0;
      } else {
        can_send[sigma] = 1;  // holds everything from now on
      }
      RoundMatcher match(ps_, n_, can_send);
      round_matching(match, r, active, can_recv);
      std::vector<std::pair<int, int>> gains;
      match.for_each([&](int from, int to, int c) {
        st.transfers.push_back({from, to, c, 1, RecvAction::kCopy});
        gains.push_back({to, c});
      });
      for (auto [g, c] : gains) ps_.give(g, c);
      if (partner != kNone) record_exchange(ps_, partner, sigma, r);
    }
  }

 private:
  // Chunk c is full after its straggler round; ceil(log2 n) rounds to reach everyone, one fewer
  // for the last chunk, which the (then free) straggler helps spread.
  int deadline(int c) const {
    return ps_.full_round(c) + var_.slack +
           (ps_.full_round(c) == m_ - 1 ? std::max(L_ - 1, 1) : L_);
  }

  int choose_partner(int r, const std::vector<int>& active) {
    if (!var_.adaptive_partner) return r;
    // The rank whose most urgent missing chunk is least urgent (it cannot receive now).
    int best_key = -1, partner = kNone;
    for (int g = 0; g < m_; ++g) {
      if (partner_round_[g] != kNone) continue;
      int key = 1 << 29;
      for (int c : active)
        if (!ps_.holds(g, c)) {
          key = deadline(c);
          break;
        }
      if (key > best_key || (key == best_key && tie_[g] < tie_[partner]))
        best_key = key, partner = g;
    }
    partner_round_[partner] = r;
    return partner;
  }

  void round_matching(RoundMatcher& match, int r, const std::vector<int>& active,
                      const std::vector<char>& can_recv) {
    // Active chunks held per rank (to prefer receivers that would otherwise idle as senders).
    std::vector<int> load(n_, 0);
    for (int c : active)
      for (int g = 0; g < m_; ++g)
        if (ps_.holds(g, c)) ++load[g];
    auto next_partner = [&](int g) { return partner_round_[g] == r + 1; };
    tier1(match, r, active, can_recv, load);
    if (!var_.fill) return;
    // Tier 2: any other useful receive, earliest deadline first.
    std::vector<int> order;
    for (int g = 0; g < m_; ++g)
      if (can_recv[g]) order.push_back(g);
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      if (next_partner(a) != next_partner(b)) return !next_partner(a);
      if (load[a] != load[b]) return load[a] < load[b];
      return tie_[a] < tie_[b];
    });
    for (int g : order) {
      if (match.matched_receiver(g)) continue;
      for (int c : active)
        if (!ps_.holds(g, c) && match.add(g, c)) break;
    }
  }

  // Tier 1: receives required to keep each chunk on schedule, earliest deadline first.
  void tier1(RoundMatcher& match, int r, const std::vector<int>& active,
             const std::vector<char>& can_recv, std::vector<int>& load) {
    auto personal_deadline = [&](int g, int c) {
      const int d = deadline(c), pr = partner_round_[g];
      return (pr != kNone && pr > r && d == pr) ? pr - 1 : d;
    };
    auto next_partner = [&](int g) { return partner_round_[g] == r + 1; };
    const bool sigma_free = r >= n_ - 2;
    for (int c : active) {
      const int left = std::max(deadline(c) - r, 0);
      const int target = m_ + (sigma_free ? 1 : 0);
      const int have = ps_.count(c) + (sigma_free ? 1 : 0);
      const long long reach = left >= 30 ? (1LL << 30) : (1LL << left);
      int need = static_cast<int>(std::max<long long>(0, (target + reach - 1) / reach - have));
      std::vector<int> cand;
      for (int g = 0; g < m_; ++g)
        if (can_recv[g] && !match.matched_receiver(g) && !ps_.holds(g, c)) cand.push_back(g);
      std::sort(cand.begin(), cand.end(), [&](int a, int b) {
        const int da = personal_deadline(a, c), db = personal_deadline(b, c);
        if (var_.load_first && load[a] != load[b]) return load[a] < load[b];
        if (da != db) return da < db;
        if (next_partner(a) != next_partner(b)) return !next_partner(a);
        if (load[a] != load[b]) return load[a] < load[b];
        return tie_[a] < tie_[b];
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
  }

  int n_, m_, L_;
  GeneralVariant var_;
  PropagationState ps_;
  std::vector<int> partner_round_;  // round in which rank g pairs with the straggler
  std::vector<uint64_t> tie_;
};

}  // namespace

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
    GeneralRun(s.n, v).append(trial, phase);
    if (!have || trial.num_rounds() < best.num_rounds()) {
      best = std::move(trial);
      have = true;
    }
    if (best.num_rounds() - s.num_rounds() == lb) break;
  }
  s = std::move(best);
}

}  // namespace stragglar_impl
}  // namespace core
}  // namespace stragg
