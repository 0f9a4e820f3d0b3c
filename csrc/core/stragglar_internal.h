// Private to the StragglAR generator (stragglar*.cc): the propagation state every construction
// tracks, the per-round sender matching, the circulant design type, and each construction's entry
// point. The model is described in stragglar.cc; docs/schedules.md has the round counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/generators.h"

namespace stragg {
namespace core {
namespace stragglar_impl {

constexpr int kNone = -1;

// Which non-straggler ranks hold which fully reduced chunks, and when each chunk became fully
// reduced (its straggler round). The straggler is rank n - 1, chunks are 0 .. n - 2.
class PropagationState {
 public:
  explicit PropagationState(int n)
      : n_(n), m_(n - 1), holds_(static_cast<size_t>(n) * (n - 1), 0), count_(n - 1, 0),
        full_round_(n - 1, kNone), holders_(n - 1) {}
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

// Round r < n - 1: rank `rank` and the straggler exchange chunk `rank` and both reduce.
void add_exchange_with_straggler(Step& st, int rank, int sigma);
// Records that exchange in ps (chunk `rank` fully reduced in `round` on both).
void record_exchange(PropagationState& ps, int rank, int sigma, int round);
// "stragglar: internal error for n=.. in round ..: what" (a broken invariant, never user error).
std::string internal(int n, int r, const std::string& what);

// Bipartite matching senders -> receivers for one round; each receiver carries the chunk it gets
// and is served by a holder of that chunk that may send (Kuhn's augmenting paths: adding every
// receiver in turn yields a maximum matching).
class RoundMatcher {
 public:
  RoundMatcher(const PropagationState& ps, int n, const std::vector<char>& can_send)
      : ps_(ps), n_(n), can_send_(can_send), sender_of_(n, kNone), chunk_of_(n, kNone),
        receiver_of_(n, kNone), seen_(n, 0) {}

  bool matched_receiver(int v) const { return sender_of_[v] != kNone; }

  // Tries to let receiver v get chunk c, re-routing other receivers' senders if needed.
  bool add(int v, int c);

  template <typename F>
  void for_each(F f) const {
    for (int v = 0; v < n_; ++v)
      if (sender_of_[v] != kNone) f(sender_of_[v], v, chunk_of_[v]);
  }

 private:
  bool augment(int v);

  const PropagationState& ps_;
  int n_;
  const std::vector<char>& can_send_;
  std::vector<int> sender_of_, chunk_of_, receiver_of_, seen_;
  int stamp_ = 0;
};

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

// ---- stragglar.cc: Algorithm 1 (power-of-2 n), exactly n + log2(n) - 2 rounds.
void append_pow2(Schedule& s, int phase);

// ---- stragglar_matching.cc: the deadline-driven matching heuristic (any n), best of a small
// portfolio of deterministic variants.
void append_general_best(Schedule& s, int phase);

// ---- stragglar_circulant.cc: circulant designs (see there). beta/alpha: receive and send age
// per position y = 1 .. m-1 (index 0 unused), A the largest age.
struct CirculantDesign {
  int A = 0;
  std::vector<int> beta, alpha;
};
// Checks the circulant conditions (bijection, send feasibility, per-age balance).
bool check_design(int m, const CirculantDesign& d);
// Fills d.alpha for d.beta (a bipartite b-matching positions -> ages); false if none exists.
bool complete_send_ages(int m, CirculantDesign& d);
// Appends the design's rounds 0 .. min(limit, m + A) - 1 and records them in ps.
void append_circulant(Schedule& s, int phase, const CirculantDesign& d, PropagationState& ps,
                      int limit = 1 << 30);
// The design's rounds, then the shortest greedy tail (finish_by) that beats the plain design.
Schedule circulant_schedule(const Schedule& base, int phase, const CirculantDesign& d);

// ---- stragglar_stored.cc: designs found offline (stragglar_designs.inc).
// True if stragglar_designs.inc has an entry for n.
bool has_stored(int n);
// The circulant part of the stored entry for n, if it has one.
bool load_design(int n, CirculantDesign& d);
// Appends the stored schedule for s.n if its entry has explicit rounds (a tail); sets
// *construction to "stored:" and the name of what found it. False if there is none.
bool append_stored(Schedule& s, int phase, std::string* construction);
// Expands a design in the stored form (see stragglar_stored.cc): circulant receive ages `beta`
// (one character per position 1 .. n-2, "" for none) for rounds < tail_from, then `tail`, n-1
// characters per round. Throws ScheduleError naming the round and rank if it is not feasible.
void expand_design(Schedule& s, int phase, const std::string& beta, int max_age, int tail_from,
                   const std::string& tail);
// Stored age characters: '.' -> 0 (none), '1'-'9', 'a'-'z', 'A'-'Z' -> 1 .. 61; else -1.
int decode_age(char ch);

// ---- stragglar_two_chain.cc: circulant designs constructed at generation time (n >= 8).
bool construct_design(int n, CirculantDesign& d);

}  // namespace stragglar_impl
}  // namespace core
}  // namespace stragg
