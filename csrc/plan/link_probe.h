// Per-link alpha/beta estimation (AdapCC §IV-B): on each link, time `messages` messages of
// `bytes_each` bytes sent back to back against one message of messages*bytes_each bytes. With
// t = alpha + bytes * beta per message,
//   t_many = m (alpha + s beta),  t_one = alpha + m s beta  =>  alpha = (t_many - t_one)/(m - 1).
// All ranks probe concurrently in the rounds of a round-robin tournament, so every link is
// measured exactly once with each rank busy on at most one link at a time (no torch here).
#pragma once

#include <cstddef>
#include <vector>

#include "plan/straggler_profiler.h"
#include "runtime/plan.h"

namespace stragg {

// Rounds of a round-robin pairing of n ranks: n-1 for even n, n for odd n (one rank idle per
// round), 0 for n <= 1. Throws stragg::Error for n < 1.
int probe_rounds(int n);

// Partner of `rank` in `round` (0 <= round < probe_rounds(n)), -1 if the rank is idle in that
// round. Symmetric (partner(partner(r)) == r); over all rounds every pair meets exactly once.
// Circle method: for odd n, r and p meet in the round with r + p = 2 round (mod n); for even n,
// the ranks 0..n-2 do the same modulo n-1 and the rank left alone meets rank n-1.
int probe_partner(int n, int round, int rank);

// Plan for `rank` exchanging with its partner (copy, no reduce) in one round: either `messages`
// steps each exchanging `elems` elements (many = true), or one step exchanging messages*elems
// elements (many = false). The buffer has 2*messages*elems elements: sends read
// [0, messages*elems), receives write [messages*elems, 2*messages*elems) (no overlap). Empty plan
// (no steps) for an idle rank. Step ids are unique within the plan and the same on both
// partners (many: 0..messages-1; one: messages, so partners that disagree on `many` notice).
// Tagged kLinkProbeTag. Throws stragg::Error for messages < 1, elems < 1 or a bad round/rank.
RankPlan link_probe_plan(int n, int rank, int round, int messages, size_t elems, bool many);

// Smallest values estimate_link returns (the link's latency / time per byte are never zero).
constexpr double kMinProbeAlpha = 1e-9;   // s
constexpr double kMinProbeBeta = 1e-15;   // s per byte (1 PB/s)

// alpha = (t_many - t_one)/(messages - 1), clamped to >= kMinProbeAlpha;
// beta = (t_one - alpha)/(messages * bytes_each), clamped to >= kMinProbeBeta.
// Throws stragg::Error for messages < 2, bytes_each < 1 or negative / non-finite times.
LinkModel estimate_link(double t_many, double t_one, int messages, size_t bytes_each);

// Combines an n x n matrix of per-link models (row-major, links[i*n + j] = link i -> j; entries
// with i == j and unmeasured ones, flagged by alpha < 0 or non-finite values, are ignored) into
// one LinkModel for the cost model: the median alpha and the median beta over measured links
// (mean of the two middle values for an even count). No measured link: LinkModel{} (defaults).
// Throws stragg::Error if links.size() != n*n.
LinkModel combine_links(const std::vector<LinkModel>& links, int n);

}  // namespace stragg
