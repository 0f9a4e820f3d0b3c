// Recursive halving (reduce-scatter) / recursive doubling (allgather) (Thakur, Rabenseifner &
// Gropp 2005; StragglAR App. F): 2*log2(n) rounds, 2(n-1)/n * s bytes per rank.
#include <numeric>

#include "core/generators.h"

namespace stragg {
namespace core {

namespace {

int bit_reverse(int x, int bits) {
  int y = 0;
  for (int b = 0; b < bits; ++b)
    if (x & (1 << b)) y |= 1 << (bits - 1 - b);
  return y;
}

// Power-of-2 halving over virtual ranks 0..p-1 mapped to real ranks `ranks`, chunks 0..p-1.
// Step i pairs v with v ^ 2^i (distance 2^i) and halves the chunk range each holds.
void append_halving(Schedule& s, const std::vector<int>& ranks, int phase) {
  const int p = static_cast<int>(ranks.size());
  const int L = detail::ceil_log2(p);
  std::vector<int> lo(p, 0);
  int len = p;
  for (int i = 0; i < L; ++i) {
    Step& st = s.add_step(phase);
    const int half = len / 2;
    for (int v = 0; v < p; ++v) {
      const int peer = v ^ (1 << i);
      const bool keep_low = ((v >> i) & 1) == 0;
      const int send_lo = keep_low ? lo[v] + half : lo[v];
      st.transfers.push_back({ranks[v], ranks[peer], send_lo, half, RecvAction::kReduce});
    }
    for (int v = 0; v < p; ++v)
      if (((v >> i) & 1) != 0) lo[v] += half;
    len = half;
  }
}

// Mirror image: step i = L-1..0 pairs v with v ^ 2^i; each sends the range it holds (copy).
void append_doubling(Schedule& s, const std::vector<int>& ranks, int phase) {
  const int p = static_cast<int>(ranks.size());
  const int L = detail::ceil_log2(p);
  std::vector<int> lo(p);
  for (int v = 0; v < p; ++v) lo[v] = bit_reverse(v, L);
  int len = 1;
  for (int i = L - 1; i >= 0; --i) {
    Step& st = s.add_step(phase);
    for (int v = 0; v < p; ++v)
      st.transfers.push_back({ranks[v], ranks[v ^ (1 << i)], lo[v], len, RecvAction::kCopy});
    for (int v = 0; v < p; ++v)
      if (((v >> i) & 1) != 0) lo[v] -= len;
    len *= 2;
  }
}

void require_pow2(int n, const char* what) {
  if (!detail::is_pow2(n))
    throw ScheduleError(std::string("rhd ") + what + ": needs a power-of-2 n, got " +
                        std::to_string(n) + " (use rhd allreduce, which handles any n)");
}

}  // namespace

Schedule rhd_reduce_scatter(int n) {
  require_pow2(n, "reduce_scatter");
  Schedule s = Schedule::make("rhd", Collective::kReduceScatter, n, n);
  s.phases = {"reduce_scatter"};
  for (int v = 0; v < n; ++v) s.chunk_owner[bit_reverse(v, detail::ceil_log2(n))] = v;
  append_halving(s, detail::iota_vec(n), 0);
  return s;
}

Schedule rhd_allgather(int n) {
  require_pow2(n, "allgather");
  Schedule s = Schedule::make("rhd", Collective::kAllGather, n, n);
  s.phases = {"allgather"};
  for (int v = 0; v < n; ++v) s.chunk_owner[bit_reverse(v, detail::ceil_log2(n))] = v;
  append_doubling(s, detail::iota_vec(n), 0);
  return s;
}

Schedule rhd_allreduce(int n) {
  if (n < 1) throw ScheduleError("rhd: n must be >= 1");
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  Schedule s = Schedule::make("rhd", Collective::kAllReduce, n, p);
  s.phases = {"reduce_scatter", "allgather"};
  std::vector<int> ranks;  // virtual rank -> real rank
  for (int j = 0; j < rem; ++j) ranks.push_back(2 * j + 1);
  for (int r = 2 * rem; r < n; ++r) ranks.push_back(r);
  if (rem > 0) {
    // Rabenseifner's fold: ranks 2j hand their whole buffer to 2j+1 and sit out.
    const int fold = s.phase_index("fold");
    Step& st = s.add_step(fold);
    for (int j = 0; j < rem; ++j) {
      st.transfers.push_back({2 * j, 2 * j + 1, 0, p, RecvAction::kReduce});
    }
  }
  append_halving(s, ranks, 0);
  append_doubling(s, ranks, 1);
  if (rem > 0) {
    const int unfold = s.phase_index("unfold");
    Step& st = s.add_step(unfold);
    for (int j = 0; j < rem; ++j) {
      st.transfers.push_back({2 * j + 1, 2 * j, 0, p, RecvAction::kCopy});
    }
  }
  return s;
}

}  // namespace core
}  // namespace stragg
