// Per-link alpha/beta estimation (AdapCC §IV-B) and what it says about each rank (no torch).
//
// Probes. On each directed link a -> b, a sends `messages` messages of `bytes_each` bytes back to
// back, then waits for a one-element acknowledgement from b; then it sends one message of
// messages*bytes_each bytes, followed by the acknowledgement; then one element and the
// acknowledgement (t_tiny, a round trip). With t = alpha + bytes * beta per message (the
// acknowledgement costs about one alpha):
//   t_many = m alpha + m s beta + alpha,   t_one = 2 alpha + m s beta,   t_tiny = 2 alpha
//   => alpha = max((t_many - t_one) / (m - 1), t_tiny / 2),  beta = (t_one - 2 alpha) / (m s).
// Beta comes from the whole transfer, not from the difference of a whole and a half one: that
// difference, meant to cancel a shaper's burst, reads noisier.
// The sender times both, so the estimate belongs to the direction a -> b. All ranks probe
// concurrently in the rounds of a round-robin tournament, each round in two halves (the lower
// rank of each pair sends, then the higher), so every directed link is measured exactly once with
// each rank busy on one link at a time.
//
// Analysis. A transfer a -> b runs at the slower of a's send side and b's receive side, so a
// rank's send time per byte is read from its outgoing links with healthy partners: their lower
// median (most partners are healthy; the fastest link alone would follow one probe that read a
// link too fast), and likewise for receiving. A rank's slowdown l = (its slower side) / (the median
// rank's); ranks with l >= the threshold are degraded (OptCC's stragglers, §2).
#pragma once

#include <cstddef>
#include <vector>

#include "plan/link_model.h"
#include "plan/settings.h"
#include "runtime/lowered_schedule.h"

namespace stragg {

// Rounds of a round-robin pairing of n ranks: n-1 for even n, n for odd n (one rank idle per
// round), 0 for n <= 1. Throws stragg::Error for n < 1.
int probe_rounds(int n);

// Partner of `rank` in `round` (0 <= round < probe_rounds(n)), -1 if the rank is idle in that
// round. Symmetric (partner(partner(r)) == r); over all rounds every pair meets exactly once.
// Circle method: for odd n, r and p meet in the round with r + p = 2 round (mod n); for even n,
// the ranks 0..n-2 do the same modulo n-1 and the rank left alone meets rank n-1.
int probe_partner(int n, int round, int rank);

// True if `rank` sends (and times the link) in half `direction` (0: the lower rank of each pair
// sends, 1: the higher) of `round`.
bool probe_sends(int n, int round, int direction, int rank);

// What one probe transfer sends: `messages` messages of `elems` (kMany), one of
// messages*elems (kOne), or one of a single element (kTiny: a round trip, see estimate_link).
enum class ProbeShape { kMany, kOne, kTiny };

// Plan for `rank` in half `direction` of `round`: the sender sends the payload of `shape`, then
// receives a one-element acknowledgement; the receiver mirrors it. Buffer: 2*messages*elems
// elements, payload read from [0, messages*elems) and received into [messages*elems,
// 2*messages*elems); the acknowledgement is element 0, landing at element messages*elems. Idle
// ranks get no steps. Step ids are the same on both partners and differ between the shapes.
// Tagged kLinkProbeTag. Throws stragg::Error for messages < 1, elems < 1, a bad round, rank or
// direction.
LoweredSchedule link_probe_schedule(int n, int rank, int round, int direction, int messages,
                                    size_t elems, ProbeShape shape);

// The same for a given pair: `peer` (-1: an idle rank, no steps) and whether this rank sends.
LoweredSchedule link_probe_pair_schedule(int peer, bool sender, int messages, size_t elems,
                                         ProbeShape shape);

// Who probes whom. Every rank pair (probe_partner), unless the group spans several hosts and
// some hold several ranks: then the hosts' first ranks probe each other (a round-robin of the P
// hosts: one flow per NIC, the NIC's own rate, where K mates probing at once would each read a
// share of it), and a last round probes each host's first two ranks (its shared memory); the
// others idle. expand() turns what was measured into the n x n matrix: a link between hosts is
// their first ranks' link, a link between host mates their host's measured one.
class ProbePairing {
 public:
  ProbePairing(int n, const std::vector<int>& host_of);
  bool by_host() const { return !hosts_.empty(); }
  int rounds() const;
  int partner(int round, int rank) const;  // -1: idle in that round
  bool sends(int round, int direction, int rank) const;
  std::vector<LinkModel> expand(const std::vector<LinkModel>& measured) const;

 private:
  int n_;
  std::vector<int> host_of_;
  std::vector<std::vector<int>> hosts_;  // empty: every rank pair
};

// Smallest values estimate_link returns (the link's latency / time per byte are never zero).
constexpr double kMinProbeAlpha = 1e-9;  // s
constexpr double kMinProbeBeta = 1e-15;  // s per byte (1 PB/s)

// alpha = the larger of (t_many - t_one)/(messages - 1) (the cost of one more message in a
// stream) and t_tiny / 2 (half the round trip of one element and its acknowledgement), clamped
// to >= kMinProbeAlpha; beta = (t_one - t_tiny)/(messages * bytes_each) (t_one/bytes if that
// is not positive), clamped to >= kMinProbeBeta: a noisy stream moves alpha, never beta.
// The cost model charges alpha per round, and a round waits for its peer: a stream's messages
// overlap (on shared memory the difference read ~0 and Auto ran Ring's 6 rounds for a 4 KiB
// call at 4 ranks, where recursive doubling needs 2), a round trip does not.
// Throws stragg::Error for messages < 2, bytes_each < 1 or negative / non-finite times.
LinkModel estimate_link(double t_many, double t_one, double t_tiny, int messages,
                        size_t bytes_each);

struct LinkAnalysis {
  LinkModel reference;             // median alpha and beta over links between healthy ranks
  std::vector<double> send_beta;   // per rank: lower median of its outgoing links (s/B), -1 unknown
  std::vector<double> recv_beta;   // per rank: lower median of its incoming links (s/B), -1 unknown
  std::vector<double> slowdown;    // per rank, >= 1 (1 for healthy or unknown ranks)
  std::vector<Slowdown> degraded;  // ranks with slowdown >= threshold, by rank
};

// Analyses an n x n matrix of directed links (links[i*n + j] = i -> j; the diagonal and
// unmeasured entries, flagged by alpha < 0 or non-finite values, are ignored). Nothing measured:
// the default LinkModel and no degraded rank. Throws stragg::Error if links.size() != n*n or
// threshold < 1.
LinkAnalysis analyze_links(const std::vector<LinkModel>& links, int n, double threshold);

// True if `fresh` names a degraded rank that `current` does not, with a factor below `sure`, or
// drops a rank that `current` names, or reads a named rank's factor more than `sure` times
// higher or lower: one probe's noise reaches that far (a host briefly short of CPU reads slow),
// so such a change is confirmed by a second probe before the planner acts on it.
bool needs_confirmation(const LinkAnalysis& fresh, const std::vector<Slowdown>& current,
                        double sure);

// What a probe that needs confirmation may act on already: `current`, plus the ranks `fresh`
// newly names at `sure` or above (a slow NIC at l = 2 need not wait for a second probe that a
// healthy rank's noise asked for). Known ranks keep their current factor. Sorted by rank.
std::vector<Slowdown> sure_degraded(const LinkAnalysis& fresh, const std::vector<Slowdown>& current,
                                    double sure);

// The verdict of a probe and its confirming probe: a rank's verdict changes from `current` only
// where both agree. Ranks both name are degraded at the lower of their two factors; a rank only
// one names stays degraded if `current` names it (at the factor that one read), else healthy.
// One probe's noise (a host short of CPU while it ran) reads a healthy rank slow often enough
// at p = 8 that the mean of the two readings can still cross the threshold. Sorted by rank.
std::vector<Slowdown> confirmed_degraded(const LinkAnalysis& first, const LinkAnalysis& second,
                                         const std::vector<Slowdown>& current);

// Two probes of the same n x n links combined: every link's mean of the two readings (alpha and
// beta each; unmeasured where either is). Noise of either sign averages out; the faster reading
// would not do, since a shaper's burst makes a slow link read fast too. Throws stragg::Error if the sizes differ.
std::vector<LinkModel> average_links(const std::vector<LinkModel>& a,
                                     const std::vector<LinkModel>& b);

}  // namespace stragg
