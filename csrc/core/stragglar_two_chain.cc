// StragglAR two-chain construction: circulant designs built at generation time (n > 255, where
// no stored design exists; milliseconds). The circulant model is in stragglar_circulant.cc.
//
// In the frame of one rank (slot k = round minus the rank's straggler round, position y = -k),
// the chunk born k' slots after the rank's own is born in slot k' and received in some slot
// k' + beta, beta in 1..A. We look for designs in which every rank holds exactly two "young"
// chunks (of age <= A, received at a smaller age) at the start of every slot. They are two
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

#include <algorithm>
#include <functional>

#include "core/stragglar_internal.h"

namespace stragg {
namespace core {
namespace stragglar_impl {
namespace {

// Enumerates profiles S[1..A] with z as above (z: slots in which Y sends instead of X, see
// arrange_chains), most doubling first, until `use` accepts one (true) or a search budget runs out.
bool find_profile(int m, int A,
                  const std::function<bool(const std::vector<long long>&, long long)>& use) {
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
// Where the chains' intervals lie on Z_m (slots 0 .. m-1; slot m is slot 0).
struct ChainLayout {
  std::vector<int> next_len;   // slot -> length of X's interval starting after it
  std::vector<char> xend;      // slot is the end of an X interval
  std::vector<int> xnext;      // slot -> end of the X interval containing it
  std::vector<int> ynext_len;  // slot -> length of Y's interval starting after it
  std::vector<char> yend, swap;
};

// X: the own interval [1, A], then the others interleaved by length (least placed fraction first,
// or random), ending at slot m = 0.
bool place_x(int m, int A, const std::vector<int>& xcount, int attempt, SplitMix& rng,
             ChainLayout& lay) {
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
  lay.next_len.assign(m, 0);
  lay.xend.assign(m + 1, 0);
  lay.xnext.assign(m + 1, 0);
  int t = A;
  lay.xend[0] = lay.xend[A % m] = 1;
  for (int l : xlen) {
    lay.next_len[t % m] = l;
    t += l;
    lay.xend[t % m] = 1;
  }
  if (t != m) return false;
  int e = m;
  for (int k = m; k >= 1; --k) {
    if (lay.xend[k % m]) e = k;
    lay.xnext[k] = e;
  }
  lay.next_len[0] = A;
  return true;
}

// Y's next interval length from slot p (unwrapped): while swaps are due, end just after X's next
// end; otherwise a length whose end avoids X's ends (largest remaining fraction, sometimes
// random). Returns -1 if none fits; *swapped tells whether it is a swap.
int next_y_length(int m, int A, const std::vector<int>& ycount, const std::vector<int>& left,
                  long long zleft, int p, int attempt, SplitMix& rng, const ChainLayout& lay,
                  bool* swapped) {
  int best = -1;
  const int e = lay.xnext[p % m + 1] + (p - p % m);  // X's next end after p (unwrapped)
  if (zleft > 0) {
    const int l = e + 1 - p;
    if (e % m != 0 && l >= 2 && l <= A && left[l] > 0 && !lay.xend[(p + l) % m]) best = l;
  }
  *swapped = best > 0;
  if (*swapped) return best;
  int total = 0;
  for (int l = 1; l <= A; ++l) {
    if (left[l] == 0 || lay.xend[(p + l) % m]) continue;
    total += left[l];
    if (best < 0 || static_cast<long long>(left[l]) * ycount[best] >
                        static_cast<long long>(left[best]) * ycount[l])
      best = l;
  }
  if (attempt >= kGreedyAttempts && total > 0 && rng.below(4) == 0) {
    int k = rng.below(total);
    for (int l = 1; l <= A; ++l) {
      if (left[l] == 0 || lay.xend[(p + l) % m]) continue;
      if (k < left[l]) return l;
      k -= left[l];
    }
  }
  return best;
}

// Y: from a start slot o (not an end of X), intervals by next_y_length until it closes at o + m.
bool place_y(int m, int A, const std::vector<int>& ycount, long long z, int attempt,
             SplitMix& rng, ChainLayout& lay) {
  int ytotal = 0;
  for (int l = 1; l <= A; ++l) ytotal += ycount[l];
  int o = attempt < kGreedyAttempts ? 1 : 1 + rng.below(m - 1);
  for (int skip = attempt < kGreedyAttempts ? attempt / 2 : 0;; ++o) {
    if (o >= m) return false;
    if (!lay.xend[o] && skip-- == 0) break;
  }
  std::vector<int> left(ycount);
  lay.yend.assign(m, 0);
  lay.swap.assign(m, 0);
  lay.ynext_len.assign(m, 0);
  long long zleft = z;
  int p = o;
  for (int i = 0; i < ytotal; ++i) {
    bool swapped = false;
    const int best = next_y_length(m, A, ycount, left, zleft, p, attempt, rng, lay, &swapped);
    if (best < 0) return false;
    --left[best];
    lay.ynext_len[p % m] = best;
    p += best;
    lay.yend[p % m] = 1;
    if (swapped) {
      lay.swap[(p - 1) % m] = 1;
      --zleft;
    }
  }
  return p == o + m && zleft == 0;
}

// Orders X's and Y's intervals (counts by length) on Z_m; fills per-slot receive and send ages.
// In z of X's interval ends t, Y's interval ends at t + 1 and Y sends (age A - 1) instead of X.
// Attempt 0 is greedy (largest remaining fraction first); later attempts randomize the choices.
bool arrange_chains(int m, int A, const std::vector<int>& xcount, const std::vector<int>& ycount,
                    long long z, int attempt, std::vector<int>& recv, std::vector<int>& send) {
  SplitMix rng{0x5EEDULL + static_cast<uint64_t>(attempt) * 7919};
  ChainLayout lay;
  if (!place_x(m, A, xcount, attempt, rng, lay)) return false;
  if (!place_y(m, A, ycount, z, attempt, rng, lay)) return false;
  recv.assign(m, 0);
  send.assign(m, 0);
  for (int k = 1; k < m; ++k) {
    recv[k] = lay.xend[k] ? A - lay.next_len[k] : (lay.yend[k] ? A - lay.ynext_len[k] : A);
    send[k] = lay.swap[k] ? A - 1 : A - (lay.xnext[k] - k);
  }
  return true;
}

}  // namespace

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

}  // namespace stragglar_impl
}  // namespace core
}  // namespace stragg
