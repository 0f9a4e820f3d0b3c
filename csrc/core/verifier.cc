#include "core/verifier.h"

#include <cstdint>
#include <vector>

namespace stragg {
namespace core {

namespace {

class ContributionState {
 public:
  ContributionState(int n, int chunks) : n_(n), chunks_(chunks), words_((n + 63) / 64) {
    const uint64_t total = static_cast<uint64_t>(n) * chunks * words_;
    if (total > (uint64_t{1} << 28))
      throw ScheduleError("verifier: schedule too large to verify symbolically (n=" +
                          std::to_string(n) + ", chunks=" + std::to_string(chunks) + ")");
    bits_.assign(total, 0);
  }
  uint64_t* at(int rank, int chunk) {
    return &bits_[(static_cast<uint64_t>(rank) * chunks_ + chunk) * words_];
  }
  int words() const { return words_; }
  bool empty(const uint64_t* b) const {
    for (int w = 0; w < words_; ++w)
      if (b[w]) return false;
    return true;
  }
  bool full(const uint64_t* b) const {
    for (int r = 0; r < n_; ++r)
      if (!((b[r / 64] >> (r % 64)) & 1)) return false;
    return true;
  }
  int first_missing(const uint64_t* b) const {
    for (int r = 0; r < n_; ++r)
      if (!((b[r / 64] >> (r % 64)) & 1)) return r;
    return -1;
  }
  int first_common(const uint64_t* a, const uint64_t* b) const {
    for (int w = 0; w < words_; ++w) {
      const uint64_t x = a[w] & b[w];
      if (x) return w * 64 + __builtin_ctzll(x);
    }
    return -1;
  }
  void set(uint64_t* b, int r) { b[r / 64] |= uint64_t{1} << (r % 64); }
  void set_all(uint64_t* b) {
    for (int r = 0; r < n_; ++r) set(b, r);
  }

 private:
  int n_, chunks_, words_;
  std::vector<uint64_t> bits_;
};

struct Pending {
  int dst, chunk, src, step;
  RecvAction op;
  size_t offset;  // into the round's copy buffer
};

std::string ctx(const Schedule& s, int step) {
  return s.algorithm + " (n=" + std::to_string(s.n) + ") step " + std::to_string(step) + ": ";
}

// Symbolic replay of a schedule: per (rank, chunk), the set of ranks whose contributions it holds.
// Each method returns false after writing the first violation into the result.
class Replay {
 public:
  // Allocates the state (throws ScheduleError if the schedule is too large to replay).
  Replay(const Schedule& s, VerifyResult& res)
      : s_(s), res_(res), st_(s.n, s.num_chunks), words_(st_.words()) {}

  // Initial data: allgather owners hold their whole chunk, otherwise every rank its own part.
  bool seed() {
    if (s_.collective == Collective::kAllGather) {
      for (int c = 0; c < s_.num_chunks; ++c) {
        if (s_.chunk_owner[c] < 0) {
          res_.error = s_.algorithm + ": allgather chunk " + std::to_string(c) + " has no owner";
          return false;
        }
        st_.set_all(st_.at(s_.chunk_owner[c], c));
      }
    } else {
      for (int r = 0; r < s_.n; ++r)
        for (int c = 0; c < s_.num_chunks; ++c) st_.set(st_.at(r, c), r);
    }
    return true;
  }

  // Replays every round: all sends of a round read the state before any of its receives land.
  bool run_rounds() {
    size_t i = 0;
    while (i < s_.steps.size()) {
      pending_.clear();
      buffer_.clear();
      size_t j = i;
      if (!collect_round(i, &j) || !apply_round()) return false;
      i = j;
    }
    res_.steps_checked = static_cast<int>(s_.steps.size());
    return true;
  }

  // Checks that every rank (reduce-scatter: every owner) ends with all contributions.
  bool check_complete() {
    for (int c = 0; c < s_.num_chunks; ++c) {
      for (int r = 0; r < s_.n; ++r) {
        if (s_.collective == Collective::kReduceScatter && s_.chunk_owner[c] != r) continue;
        const uint64_t* b = st_.at(r, c);
        if (!st_.full(b)) {
          res_.error = s_.algorithm + " (n=" + std::to_string(s_.n) + "): at the end rank " +
                       std::to_string(r) + " lacks the contribution of rank " +
                       std::to_string(st_.first_missing(b)) + " in chunk " + std::to_string(c);
          return false;
        }
      }
    }
    return true;
  }

 private:
  // Snapshots what the steps of the round starting at step i send; *j becomes the next round.
  bool collect_round(size_t i, size_t* j) {
    const int round = s_.steps[i].round;
    for (; *j < s_.steps.size() && s_.steps[*j].round == round; ++*j) {
      const int step = static_cast<int>(*j);
      for (const Transfer& t : s_.transfers_of(*j, scratch_)) {
        for (int c = t.chunk; c < t.chunk + t.count; ++c) {
          const uint64_t* src = st_.at(t.src, c);
          if (st_.empty(src)) {
            res_.error = ctx(s_, step) + "rank " + std::to_string(t.src) + " sends chunk " +
                         std::to_string(c) + " to rank " + std::to_string(t.dst) +
                         " but holds no data for it yet";
            res_.steps_checked = step;
            return false;
          }
          pending_.push_back({t.dst, c, t.src, step, t.op, buffer_.size()});
          buffer_.insert(buffer_.end(), src, src + words_);
        }
      }
    }
    return true;
  }

  // Lands the round's messages: copies overwrite, reductions must add only new contributions.
  bool apply_round() {
    for (const Pending& p : pending_) {
      uint64_t* dst = st_.at(p.dst, p.chunk);
      const uint64_t* in = &buffer_[p.offset];
      if (p.op == RecvAction::kCopy) {
        for (int w = 0; w < words_; ++w) dst[w] = in[w];
        continue;
      }
      if (st_.empty(dst)) {
        res_.error = ctx(s_, p.step) + "rank " + std::to_string(p.dst) + " reduces chunk " +
                     std::to_string(p.chunk) + " from rank " + std::to_string(p.src) +
                     " into a slice that holds no data";
        res_.steps_checked = p.step;
        return false;
      }
      const int dup = st_.first_common(dst, in);
      if (dup >= 0) {
        res_.error = ctx(s_, p.step) + "rank " + std::to_string(p.dst) + " reduces chunk " +
                     std::to_string(p.chunk) + " from rank " + std::to_string(p.src) +
                     " and would count the contribution of rank " + std::to_string(dup) + " twice";
        res_.steps_checked = p.step;
        return false;
      }
      for (int w = 0; w < words_; ++w) dst[w] |= in[w];
    }
    return true;
  }

  const Schedule& s_;
  VerifyResult& res_;
  ContributionState st_;
  const int words_;  // words per contribution set
  std::vector<Pending> pending_;
  std::vector<uint64_t> buffer_;
  std::vector<Transfer> scratch_;  // expansion of a pattern step
};

}  // namespace

VerifyResult verify(const Schedule& s) {
  VerifyResult res;
  try {
    s.validate_structure();
  } catch (const ScheduleError& e) {
    res.error = e.what();
    return res;
  }
  Replay replay(s, res);
  if (replay.seed() && replay.run_rounds() && replay.check_complete()) res.ok = true;
  return res;
}

void verify_or_throw(const Schedule& s) {
  VerifyResult r = verify(s);
  if (!r.ok) throw ScheduleError("schedule verification failed: " + r.error);
}

}  // namespace core
}  // namespace stragg
