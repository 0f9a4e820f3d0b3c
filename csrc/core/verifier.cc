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
  RecvOp op;
  size_t offset;  // into the round's copy buffer
};

std::string ctx(const Schedule& s, int step) {
  return s.algorithm + " (n=" + std::to_string(s.n) + ") step " + std::to_string(step) + ": ";
}

}  // namespace

VerifyResult verify(const Schedule& s) {
  VerifyResult res;
  try {
    s.validate_structure();
  } catch (const ScheduleError& e) {
    res.error = e.what();
    return res;
  }
  ContributionState st(s.n, s.num_chunks);
  const int W = st.words();
  if (s.collective == Collective::kAllGather) {
    for (int c = 0; c < s.num_chunks; ++c) {
      if (s.chunk_owner[c] < 0) {
        res.error = s.algorithm + ": allgather chunk " + std::to_string(c) + " has no owner";
        return res;
      }
      st.set_all(st.at(s.chunk_owner[c], c));
    }
  } else {
    for (int r = 0; r < s.n; ++r)
      for (int c = 0; c < s.num_chunks; ++c) st.set(st.at(r, c), r);
  }

  std::vector<Pending> pending;
  std::vector<uint64_t> buffer;
  std::vector<Transfer> scratch;  // expansion of a pattern step
  size_t i = 0;
  while (i < s.steps.size()) {
    const int round = s.steps[i].round;
    pending.clear();
    buffer.clear();
    size_t j = i;
    for (; j < s.steps.size() && s.steps[j].round == round; ++j) {
      for (const Transfer& t : s.transfers_of(j, scratch)) {
        for (int c = t.chunk; c < t.chunk + t.count; ++c) {
          const uint64_t* src = st.at(t.src, c);
          if (st.empty(src)) {
            res.error = ctx(s, static_cast<int>(j)) + "rank " + std::to_string(t.src) +
                        " sends chunk " + std::to_string(c) + " to rank " + std::to_string(t.dst) +
                        " but holds no data for it yet";
            res.steps_checked = static_cast<int>(j);
            return res;
          }
          pending.push_back({t.dst, c, t.src, static_cast<int>(j), t.op, buffer.size()});
          buffer.insert(buffer.end(), src, src + W);
        }
      }
    }
    for (const Pending& p : pending) {
      uint64_t* dst = st.at(p.dst, p.chunk);
      const uint64_t* in = &buffer[p.offset];
      if (p.op == RecvOp::kCopy) {
        for (int w = 0; w < W; ++w) dst[w] = in[w];
        continue;
      }
      if (st.empty(dst)) {
        res.error = ctx(s, p.step) + "rank " + std::to_string(p.dst) + " reduces chunk " +
                    std::to_string(p.chunk) + " from rank " + std::to_string(p.src) +
                    " into a slice that holds no data";
        res.steps_checked = p.step;
        return res;
      }
      const int dup = st.first_common(dst, in);
      if (dup >= 0) {
        res.error = ctx(s, p.step) + "rank " + std::to_string(p.dst) + " reduces chunk " +
                    std::to_string(p.chunk) + " from rank " + std::to_string(p.src) +
                    " and would count the contribution of rank " + std::to_string(dup) + " twice";
        res.steps_checked = p.step;
        return res;
      }
      for (int w = 0; w < W; ++w) dst[w] |= in[w];
    }
    i = j;
  }
  res.steps_checked = static_cast<int>(s.steps.size());

  for (int c = 0; c < s.num_chunks; ++c) {
    for (int r = 0; r < s.n; ++r) {
      if (s.collective == Collective::kReduceScatter && s.chunk_owner[c] != r) continue;
      const uint64_t* b = st.at(r, c);
      if (!st.full(b)) {
        res.error = s.algorithm + " (n=" + std::to_string(s.n) + "): at the end rank " +
                    std::to_string(r) + " lacks the contribution of rank " +
                    std::to_string(st.first_missing(b)) + " in chunk " + std::to_string(c);
        return res;
      }
    }
  }
  res.ok = true;
  return res;
}

void verify_or_throw(const Schedule& s) {
  VerifyResult r = verify(s);
  if (!r.ok) throw ScheduleError("schedule verification failed: " + r.error);
}

}  // namespace core
}  // namespace stragg
