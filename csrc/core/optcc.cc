// OptCC (Chen et al., "Don't Let a Few Network Failures Slow the Entire AllReduce"): four-stage
// pipelined allreduce for ranks whose link is slower by a factor l.
//
// Buffer: k segments; segment j has one section per healthy rank (the section's owner) plus, with
// bubble filling, one "bubble" chunk of relative size (2-l)/l. Stages per section:
//   S1 reduce-scatter among healthy ranks, S2 upload to the straggler, S3 download from the
//   straggler, S4 allgather among healthy ranks.
// Orders (§4.1): "s3_first" = S3 -> S1 -> S4 -> S2 (patterns B/D: the straggler sends its raw
// contribution straight to the owner, which reduces it with the healthy ones; the owner later
// sends the global sum back), and "s1_first" = S1 -> S2 -> S3 -> S4 (patterns A/C).
//
// Construction (closed form, no solver): ranks sit on positions of Z_p; a parallel body is p-1
// windows, window d lets position x send to x+d (a one-port permutation). With the direct
// (pairwise) reduce-scatter/allgather among healthy ranks, every ordered pair of ranks meets
// exactly once per body, so in each window a healthy rank carries two sections on its fast link
// (S1 of one segment merged with S4 of an older one — the paper's merged flows) or one section of
// S2/S3 on the slow link; nobody idles in the steady state, which is what the paper's four
// interleaved patterns achieve on its ring (the pairwise version makes the offset patterns C/D
// unnecessary: one body per segment plus one drain body for s3_first, three for s1_first).
// Bubble filling (App. C, one straggler, l < 2): the straggler's slot is l*s < 2s, so every flow to
// or from the straggler also carries part of the bubble chunk (healthy contributions up in body b,
// the straggler's reduced result down in body b+1), sized so that flow takes exactly 2s.
// Multiple stragglers (App. D): stragglers sit at positions spaced p/m apart, so the m-1 windows
// whose shift is a multiple of p/m carry only fast healthy flows.
#include <algorithm>
#include <sstream>

#include "core/generators.h"

namespace stragg {
namespace core {

Schedule optcc(int n, const OptccOptions& opt_in) {
  OptccOptions opt = opt_in;
  if (n < 2) throw ScheduleError("optcc: needs n >= 2, got " + std::to_string(n));
  if (opt.stragglers.empty()) opt.stragglers = {n - 1};
  const int m = static_cast<int>(opt.stragglers.size());
  if (m >= n) throw ScheduleError("optcc: needs at least one healthy rank");
  {
    std::vector<int> sorted = opt.stragglers;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] < 0 || sorted[i] >= n)
        throw ScheduleError("optcc: straggler rank " + std::to_string(sorted[i]) + " out of range");
      if (i && sorted[i] == sorted[i - 1]) throw ScheduleError("optcc: duplicate straggler rank");
    }
  }
  if (opt.slowdowns.empty()) opt.slowdowns.assign(m, 2.0);
  if (opt.slowdowns.size() == 1 && m > 1) opt.slowdowns.assign(m, opt.slowdowns[0]);
  if (static_cast<int>(opt.slowdowns.size()) != m)
    throw ScheduleError("optcc: give one slowdown per straggler (or a single value)");
  for (double l : opt.slowdowns)
    if (!(l >= 1.0)) throw ScheduleError("optcc: slowdown factors must be >= 1");
  if (opt.segments < 1) throw ScheduleError("optcc: segments must be >= 1");
  const bool s3_first = opt.order == "s3_first";
  if (!s3_first && opt.order != "s1_first")
    throw ScheduleError("optcc: order must be \"s3_first\" or \"s1_first\", got \"" + opt.order + "\"");
  if (!s3_first && m != 1) throw ScheduleError("optcc: order s1_first supports one straggler only");

  const int p = n, k = opt.segments, h = n - m;
  const double l = opt.slowdowns[0];
  const bool bubble = opt.bubble_fill && m == 1 && l < 2.0;

  // Positions: stragglers spread evenly over Z_p, healthy ranks fill the rest in rank order.
  std::vector<int> rank_at(p, -1), is_straggler(p, 0);
  for (int i = 0; i < m; ++i) {
    const int pos = static_cast<int>(static_cast<long long>(i) * p / m);
    rank_at[pos] = opt.stragglers[i];
    is_straggler[opt.stragglers[i]] = 1;
  }
  std::vector<int> healthy, section_of(p, -1);
  for (int r = 0; r < p; ++r)
    if (!is_straggler[r]) {
      section_of[r] = static_cast<int>(healthy.size());
      healthy.push_back(r);
    }
  for (int pos = 0, next = 0; pos < p; ++pos)
    if (rank_at[pos] < 0) rank_at[pos] = healthy[next++];

  const int per_seg = h + (bubble ? 1 : 0);
  Schedule s = Schedule::make("optcc", Collective::kAllReduce, n, k * per_seg);
  s.segments = k;
  s.stragglers = opt.stragglers;
  for (int i = 0; i < m; ++i) s.rank_slowdown[opt.stragglers[i]] = opt.slowdowns[i];
  if (bubble)
    for (int j = 0; j < k; ++j) s.chunk_weights[j * per_seg + h] = (2.0 - l) / l;
  // Step phases: the reducing step of a window carries S1 (and the straggler uploads), the copying
  // step S4 (and the straggler downloads); the third step carries bubble-filling flows.
  if (s3_first)
    s.phases = {"S3+S1_reduce_scatter", "S4+S2_allgather", "bubble_fill"};
  else
    s.phases = {"S1_reduce_scatter+S2_upload", "S4_allgather+S3_download", "bubble_fill"};
  const int kReducePhase = 0, kCopyPhase = 1, kBubble = 2;
  auto section = [&](int seg, int owner) { return seg * per_seg + section_of[owner]; };
  auto bubble_chunk = [&](int seg) { return seg * per_seg + h; };
  const int sigma = opt.stragglers[0];

  const int bodies = k + (s3_first ? 1 : 3);
  // The output is Theta(k p^2) transfers (~136M for p = 1024, k = 64): reserve every vector once
  // (no growth reallocations) and size each step's transfer list exactly.
  s.steps.reserve(static_cast<size_t>(bodies) * (p - 1) * (bubble ? 3 : 2));
  std::vector<Transfer> fast_a, fast_b, extra;
  fast_a.reserve(p);
  fast_b.reserve(p);
  extra.reserve(p);
  for (int b = 0; b < bodies; ++b) {
    for (int d = 1; d < p; ++d) {
      // Each window is one round of up to three concurrent one-port steps.
      fast_a.clear();
      fast_b.clear();
      extra.clear();
      for (int x = 0; x < p; ++x) {
        const int u = rank_at[x], v = rank_at[(x + d) % p];
        const bool hu = !is_straggler[u], hv = !is_straggler[v];
        if (s3_first) {
          // Reduce-scatter of segment b into owners (straggler contributions included: S3->S1).
          if (b < k && hv) fast_a.push_back({u, v, section(b, v), 1, RecvOp::kReduce});
          // Allgather of segment b-1 from owners (to stragglers: S4->S2).
          if (b >= 1 && b - 1 < k && hu) fast_b.push_back({u, v, section(b - 1, u), 1, RecvOp::kCopy});
        } else {
          if (hu && hv) {
            if (b < k) fast_a.push_back({u, v, section(b, v), 1, RecvOp::kReduce});  // S1
            if (b >= 3 && b - 3 < k)
              fast_b.push_back({u, v, section(b - 3, u), 1, RecvOp::kCopy});  // S4
          } else if (hu && v == sigma) {
            if (b >= 1 && b - 1 < k)
              fast_a.push_back({u, v, section(b - 1, u), 1, RecvOp::kReduce});  // S2
          } else if (u == sigma && hv) {
            if (b >= 2 && b - 2 < k)
              fast_b.push_back({u, v, section(b - 2, v), 1, RecvOp::kCopy});  // S3
          }
        }
        if (bubble) {
          if (hu && v == sigma && b < k)
            extra.push_back({u, v, bubble_chunk(b), 1, RecvOp::kReduce});
          if (u == sigma && hv && b >= 1 && b - 1 < k)
            extra.push_back({u, v, bubble_chunk(b - 1), 1, RecvOp::kCopy});
        }
      }
      bool first = true;
      auto emit = [&](std::vector<Transfer>& t, int phase) {
        if (t.empty()) return;
        Step& st = s.add_step(phase, false, /*same_round=*/!first);
        st.transfers.assign(t.begin(), t.end());  // exact capacity; t keeps its buffer
        first = false;
      };
      emit(fast_a, kReducePhase);
      emit(fast_b, kCopyPhase);
      emit(extra, kBubble);
    }
  }
  std::ostringstream ps;
  ps << "{\"stragglers\": [";
  for (int i = 0; i < m; ++i) ps << (i ? ", " : "") << opt.stragglers[i];
  ps << "], \"slowdowns\": [";
  for (int i = 0; i < m; ++i) ps << (i ? ", " : "") << opt.slowdowns[i];
  ps << "], \"segments\": " << k << ", \"bubble_fill\": " << (opt.bubble_fill ? "true" : "false")
     << ", \"order\": \"" << opt.order << "\"}";
  s.params_json = ps.str();
  return s;
}

}  // namespace core
}  // namespace stragg
