// StragglAR circulant designs: checking, completing, expanding into rounds, and the greedy tail.
//
// Ranks live on Z_m (m = n - 1); in round r rank g sits at position y = g - r (mod m), position 0
// being the straggler's partner. A design gives every position y != 0 a receive age beta(y): the
// rank there receives the chunk born beta(y) rounds ago (chunk r - beta(y)); and a send age
// alpha(y). Translation invariance makes every chunk spread identically: the rank at offset
// d = g - j from chunk j's birth rank receives it at age rho(d) with d = y + beta(y). Conditions:
// y -> y + beta(y) is a bijection of Z_m \ {0}; a rank sends age a only if it already holds that
// chunk (rho(y + a) < a, rho(0) = 0); senders and receivers of every age are equally many. Then
// every round is valid, chunk j is complete after round j + max(beta), and the schedule has
// m + max(beta) post-arrival rounds. Designs come from stragglar_stored.cc (found offline) or
// stragglar_two_chain.cc (constructed); alpha is recomputed here from beta by a bipartite
// b-matching (positions -> ages) when a design only stores beta.
#include <algorithm>
#include <functional>

#include "core/stragglar_internal.h"

namespace stragg {
namespace core {
namespace stragglar_impl {

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

bool complete_send_ages(int m, CirculantDesign& d) {
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

void append_circulant(Schedule& s, int phase, const CirculantDesign& d, PropagationState& ps,
                      int limit) {
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
        throw ScheduleError(
            internal(n, r, "circulant design unbalanced at age " + std::to_string(a)));
      for (size_t i = 0; i < senders[a].size(); ++i)
        st.transfers.push_back({senders[a][i], receivers[a][i], r - a, 1, RecvAction::kCopy});
    }
    for (int a = 1; a <= A; ++a)
      for (int g : receivers[a]) ps.give(g, r - a);
    if (r < m) record_exchange(ps, r, sigma, r);
  }
}

namespace {

// Tail: from round r0 >= n - 1 (every chunk fully reduced, the straggler free to send), tries to
// finish by round `target` (exclusive): each round, every chunk first gets the receives it needs
// to stay on a doubling track to the target (fewest holders first), then idle ports fill in.
bool finish_by(Schedule& s, int phase, PropagationState ps, int r0, int target) {
  const int n = s.n, m = n - 1;
  for (int r = r0; r < target; ++r) {
    if (ps.all_complete()) break;
    std::vector<int> active;
    for (int c = 0; c < m; ++c)
      if (!ps.complete(c)) active.push_back(c);
    std::sort(active.begin(), active.end(), [&](int a, int b) {
      return ps.count(a) != ps.count(b) ? ps.count(a) < ps.count(b) : a < b;
    });
    std::vector<char> can_send(n, 1);
    RoundMatcher match(ps, n, can_send);
    const int left = target - r;  // rounds left including this one
    std::vector<int> missing(n, 0);
    for (int g = 0; g < m; ++g)
      for (int c : active)
        if (!ps.holds(g, c)) ++missing[g];
    for (int c : active) {
      const long long reach = left - 1 >= 30 ? (1LL << 30) : (1LL << (left - 1));
      int need =
          static_cast<int>(std::max<long long>(0, (n + reach - 1) / reach - (ps.count(c) + 1)));
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
      st.transfers.push_back({from, to, c, 1, RecvAction::kCopy});
      gains.push_back({to, c});
    });
    for (auto [g, c] : gains) ps.give(g, c);
  }
  return ps.all_complete();
}

}  // namespace

// The design's rounds up to the straggler's last exchange (or a round later), then the shortest
// tail finish_by finds; the plain design when no tail beats it.
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

}  // namespace stragglar_impl
}  // namespace core
}  // namespace stragg
