// The schedule IR's data structures (csrc/core/ir.h): schedules, compact patterns and their
// expansion, chunk ranges, per-rank programs, structural validation, relabelling. Every function
// here relies on Schedule's invariants, which validate_structure() states and checks.
#include "core/ir.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace stragg {
namespace core {

const char* to_string(RecvAction op) {
  switch (op) {
    case RecvAction::kReduce:
      return "reduce";
    case RecvAction::kReduceFirst:
      return "reduce_first";
    case RecvAction::kCopy:
      break;
  }
  return "copy";
}

const char* to_string(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "allgather";
  }
  return "?";
}

Collective collective_from_string(const std::string& s) {
  if (s == "allreduce") return Collective::kAllReduce;
  if (s == "reduce_scatter") return Collective::kReduceScatter;
  if (s == "allgather") return Collective::kAllGather;
  throw ScheduleError("unknown collective '" + s + "'");
}

Schedule Schedule::make(const std::string& algorithm, Collective collective, int n,
                        int num_chunks) {
  if (n < 1) throw ScheduleError(algorithm + ": n must be >= 1, got " + std::to_string(n));
  if (num_chunks < 1)
    throw ScheduleError(algorithm + ": num_chunks must be >= 1, got " + std::to_string(num_chunks));
  Schedule s;
  s.algorithm = algorithm;
  s.collective = collective;
  s.n = n;
  s.num_chunks = num_chunks;
  s.chunk_weights.assign(num_chunks, 1.0);
  s.chunk_owner.assign(num_chunks, -1);
  s.phases = {"main"};
  s.rank_slowdown.assign(n, 1.0);
  return s;
}

int Schedule::num_rounds() const {
  int rounds = 0;
  for (size_t i = 0; i < steps.size(); ++i)
    if (i == 0 || steps[i].round != steps[i - 1].round) ++rounds;
  return rounds;
}

int Schedule::num_post_arrival_rounds() const {
  int rounds = 0;
  size_t i = 0;
  while (i < steps.size()) {
    size_t j = i;
    bool post = false;
    while (j < steps.size() && steps[j].round == steps[i].round) post |= !steps[j++].pre_arrival;
    rounds += post ? 1 : 0;
    i = j;
  }
  return rounds;
}

int Schedule::phase_index(const std::string& name) {
  for (size_t i = 0; i < phases.size(); ++i)
    if (phases[i] == name) return static_cast<int>(i);
  phases.push_back(name);
  return static_cast<int>(phases.size()) - 1;
}

Step& Schedule::add_step(int phase, bool pre_arrival, bool same_round) {
  Step st;
  st.phase = phase;
  st.pre_arrival = pre_arrival;
  if (steps.empty())
    st.round = 0;
  else
    st.round = steps.back().round + (same_round ? 0 : 1);
  steps.push_back(std::move(st));
  return steps.back();
}

// ---------------------------------------------------------------------------- patterns

namespace {

// Checks the user-set fields of a pattern (not the derived tables).
void check_rule(const Pattern& p, int n) {
  const int L = p.ring_size();
  if (L < 2) throw ScheduleError("pattern: the ring needs at least 2 ranks");
  if (L > n) throw ScheduleError("pattern: the ring has more ranks than the schedule");
  std::vector<char> seen(n, 0);
  for (int r : p.ring) {
    if (r < 0 || r >= n)
      throw ScheduleError("pattern: ring rank " + std::to_string(r) + " out of range");
    if (seen[r]++)
      throw ScheduleError("pattern: rank " + std::to_string(r) + " appears twice on the ring");
  }
  if (static_cast<int>(p.rank_class.size()) != n || static_cast<int>(p.rank_chunk.size()) != n)
    throw ScheduleError("pattern: rank_class and rank_chunk need one entry per rank");
  for (int c : p.rank_class)
    if (c < 0 || c >= 32) throw ScheduleError("pattern: rank classes must be in [0, 32)");
  if (p.instances < 1) throw ScheduleError("pattern: instances must be >= 1");
  if (p.chunk_stride < 0) throw ScheduleError("pattern: chunk_stride must be >= 0");
  if (p.lanes.empty()) throw ScheduleError("pattern: no lanes");
  for (const PatternLane& l : p.lanes) {
    if (l.count < 1) throw ScheduleError("pattern: lane count must be >= 1");
    if (l.key != PatternLane::kSender && l.key != PatternLane::kReceiver &&
        l.key != PatternLane::kNone)
      throw ScheduleError("pattern: bad lane key");
  }
}

}  // namespace

void Pattern::finalize(int n) {
  check_rule(*this, n);
  const int L = ring_size();
  num_classes = 1 + *std::max_element(rank_class.begin(), rank_class.end());
  lane_of_classes.assign(static_cast<size_t>(num_classes) * num_classes, -1);
  for (size_t l = 0; l < lanes.size(); ++l)
    for (int cs = 0; cs < num_classes; ++cs)
      for (int cd = 0; cd < num_classes; ++cd) {
        if (!((lanes[l].src_classes >> cs) & 1u) || !((lanes[l].dst_classes >> cd) & 1u)) continue;
        int8_t& slot = lane_of_classes[cs * num_classes + cd];
        if (slot >= 0)
          throw ScheduleError("pattern: lanes " + std::to_string(slot) + " and " +
                              std::to_string(l) + " both match classes " + std::to_string(cs) +
                              " -> " + std::to_string(cd));
        slot = static_cast<int8_t>(l);
      }
  position.assign(n, -1);
  for (int x = 0; x < L; ++x) position[ring[x]] = x;
  // Per lane: shifts d for which some position x has (ring[x], ring[x+d]) in the lane's classes.
  lane_has_pairs.assign(lanes.size(), std::vector<uint8_t>(L, 0));
  for (size_t l = 0; l < lanes.size(); ++l) {
    std::vector<int> ps, pd;
    for (int x = 0; x < L; ++x) {
      const int c = rank_class[ring[x]];
      if ((lanes[l].src_classes >> c) & 1u) ps.push_back(x);
      if ((lanes[l].dst_classes >> c) & 1u) pd.push_back(x);
    }
    std::vector<uint8_t>& has = lane_has_pairs[l];
    if (ps.size() + pd.size() > static_cast<size_t>(L)) {
      // Pigeonhole: ps + d and pd always intersect.
      std::fill(has.begin() + 1, has.end(), 1);
    } else {
      for (int x : ps)
        for (int y : pd)
          if (y != x) has[(y - x + L) % L] = 1;
    }
  }
}

bool Pattern::make_transfer(int lane, int src, int dst, int rep, Transfer* out) const {
  const PatternLane& l = lanes[lane];
  const int j = rep - l.delay;
  if (j < 0 || j >= instances) return false;
  const int off = l.key == PatternLane::kSender     ? rank_chunk[src]
                  : l.key == PatternLane::kReceiver ? rank_chunk[dst]
                                                    : 0;
  out->src = src;
  out->dst = dst;
  out->chunk = j * chunk_stride + off + l.chunk_add;
  out->count = l.count;
  out->op = l.op;
  return true;
}

void Pattern::expand(int shift, int rep, std::vector<Transfer>& out) const {
  const int L = ring_size();
  Transfer t;
  for (int x = 0, y = shift; x < L; ++x, ++y) {
    if (y >= L) y -= L;
    const int u = ring[x], v = ring[y];
    const int l = lane_for(u, v);
    if (l >= 0 && make_transfer(l, u, v, rep, &t)) out.push_back(t);
  }
}

bool Pattern::has_transfers(int shift, int rep) const {
  for (size_t l = 0; l < lanes.size(); ++l) {
    const int j = rep - lanes[l].delay;
    if (j >= 0 && j < instances && lane_has_pairs[l][shift]) return true;
  }
  return false;
}

bool Pattern::send_of(int rank, int shift, int rep, Transfer* out) const {
  const int x = position[rank];
  if (x < 0) return false;
  const int L = ring_size();
  const int v = ring[(x + shift) % L];
  const int l = lane_for(rank, v);
  return l >= 0 && make_transfer(l, rank, v, rep, out);
}

bool Pattern::recv_of(int rank, int shift, int rep, Transfer* out) const {
  const int x = position[rank];
  if (x < 0) return false;
  const int L = ring_size();
  const int u = ring[((x - shift) % L + L) % L];
  const int l = lane_for(u, rank);
  return l >= 0 && make_transfer(l, u, rank, rep, out);
}

int Schedule::add_pattern(Pattern p) {
  p.finalize(n);
  patterns.push_back(std::move(p));
  return static_cast<int>(patterns.size()) - 1;
}

Step& Schedule::add_pattern_step(int pattern, int shift, int rep, int phase, bool pre_arrival,
                                 bool same_round) {
  if (pattern < 0 || pattern >= static_cast<int>(patterns.size()))
    throw ScheduleError(algorithm + ": pattern index " + std::to_string(pattern) + " out of range");
  if (shift < 1 || shift >= patterns[pattern].ring_size())
    throw ScheduleError(algorithm + ": pattern shift " + std::to_string(shift) + " out of range");
  Step& st = add_step(phase, pre_arrival, same_round);
  st.pattern = pattern;
  st.shift = shift;
  st.rep = rep;
  return st;
}

bool Schedule::is_compact() const {
  for (const Step& st : steps)
    if (st.pattern >= 0) return true;
  return false;
}

const std::vector<Transfer>& Schedule::transfers_of(size_t i,
                                                    std::vector<Transfer>& scratch) const {
  const Step& st = steps[i];
  if (st.pattern < 0) return st.transfers;
  scratch.clear();
  patterns.at(st.pattern).expand(st.shift, st.rep, scratch);
  return scratch;
}

Schedule Schedule::expanded() const {
  Schedule out;
  out.algorithm = algorithm;
  out.collective = collective;
  out.n = n;
  out.num_chunks = num_chunks;
  out.segments = segments;
  out.chunk_weights = chunk_weights;
  out.chunk_owner = chunk_owner;
  out.phases = phases;
  out.stragglers = stragglers;
  out.rank_slowdown = rank_slowdown;
  out.params_json = params_json;
  out.steps.reserve(steps.size());
  std::vector<Transfer> scratch;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    Step c;
    c.round = st.round;
    c.phase = st.phase;
    c.pre_arrival = st.pre_arrival;
    c.reconfigure = st.reconfigure;
    const std::vector<Transfer>& t = transfers_of(i, scratch);
    c.transfers.assign(t.begin(), t.end());
    out.steps.push_back(std::move(c));
  }
  return out;
}

double Schedule::total_weight() const {
  return std::accumulate(chunk_weights.begin(), chunk_weights.end(), 0.0);
}

std::vector<ElementRange> Schedule::chunk_ranges(int64_t num_elements) const {
  if (num_elements < 0) throw ScheduleError("chunk_ranges: negative element count");
  const double total = total_weight();
  std::vector<int64_t> len(num_chunks, 0);
  std::vector<std::pair<double, int>> rem;
  int64_t assigned = 0;
  for (int c = 0; c < num_chunks; ++c) {
    const double exact = static_cast<double>(num_elements) * chunk_weights[c] / total;
    len[c] = static_cast<int64_t>(std::floor(exact));
    assigned += len[c];
    rem.emplace_back(exact - static_cast<double>(len[c]), c);
  }
  // Largest remainder first; ties to the lower chunk index, deterministic.
  std::stable_sort(rem.begin(), rem.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; assigned < num_elements; i = (i + 1) % rem.size()) {
    ++len[rem[i].second];
    ++assigned;
  }
  std::vector<ElementRange> out(num_chunks);
  int64_t off = 0;
  for (int c = 0; c < num_chunks; ++c) {
    out[c] = {off, len[c]};
    off += len[c];
  }
  return out;
}

std::vector<RankOp> Schedule::rank_program(int rank) const {
  if (rank < 0 || rank >= n)
    throw ScheduleError("rank_program: rank " + std::to_string(rank) + " out of range [0," +
                        std::to_string(n) + ")");
  std::vector<RankOp> prog;
  prog.reserve(steps.size());  // at most one op per step
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    RankOp op;
    op.step = static_cast<int>(i);
    op.round = st.round;
    op.phase = st.phase;
    op.pre_arrival = st.pre_arrival;
    if (st.pattern >= 0) {
      const Pattern& p = patterns.at(st.pattern);
      Transfer t;
      if (p.send_of(rank, st.shift, st.rep, &t)) {
        op.has_send = true;
        op.send_peer = t.dst;
        op.send_chunk = t.chunk;
        op.send_count = t.count;
      }
      if (p.recv_of(rank, st.shift, st.rep, &t)) {
        op.has_recv = true;
        op.recv_peer = t.src;
        op.recv_chunk = t.chunk;
        op.recv_count = t.count;
        op.recv_action = t.op;
      }
      if (op.has_send || op.has_recv) prog.push_back(op);
      continue;
    }
    for (const Transfer& t : st.transfers) {
      if (t.src == rank) {
        op.has_send = true;
        op.send_peer = t.dst;
        op.send_chunk = t.chunk;
        op.send_count = t.count;
      }
      if (t.dst == rank) {
        op.has_recv = true;
        op.recv_peer = t.src;
        op.recv_chunk = t.chunk;
        op.recv_count = t.count;
        op.recv_action = t.op;
      }
    }
    if (op.has_send || op.has_recv) prog.push_back(op);
  }
  return prog;
}

namespace {

// "<algorithm> (n=<n>) step <step>", the prefix of a step's error messages.
std::string where(const Schedule& s, size_t step) {
  return s.algorithm + " (n=" + std::to_string(s.n) + ") step " + std::to_string(step);
}

// Checks the per-schedule fields: sizes, chunk weights and owners, slowdowns, phases, stragglers.
void check_fields(const Schedule& s) {
  const std::string& algorithm = s.algorithm;
  const int n = s.n, num_chunks = s.num_chunks;
  if (n < 1) throw ScheduleError(algorithm + ": n must be >= 1");
  if (num_chunks < 1) throw ScheduleError(algorithm + ": num_chunks must be >= 1");
  if (static_cast<int>(s.chunk_weights.size()) != num_chunks)
    throw ScheduleError(algorithm + ": chunk_weights has " +
                        std::to_string(s.chunk_weights.size()) + " entries, expected " +
                        std::to_string(num_chunks));
  for (double w : s.chunk_weights)
    if (!(w > 0.0) || !std::isfinite(w))
      throw ScheduleError(algorithm + ": chunk weights must be finite and > 0");
  if (static_cast<int>(s.chunk_owner.size()) != num_chunks)
    throw ScheduleError(algorithm + ": chunk_owner has wrong size");
  for (int o : s.chunk_owner)
    if (o < -1 || o >= n) throw ScheduleError(algorithm + ": chunk owner out of range");
  if (static_cast<int>(s.rank_slowdown.size()) != n)
    throw ScheduleError(algorithm + ": rank_slowdown has wrong size");
  for (double f : s.rank_slowdown)
    if (!(f >= 1.0) || !std::isfinite(f))
      throw ScheduleError(algorithm + ": rank slowdown factors must be finite and >= 1");
  if (s.phases.empty()) throw ScheduleError(algorithm + ": no phases");
  for (int r : s.stragglers)
    if (r < 0 || r >= n) throw ScheduleError(algorithm + ": straggler rank out of range");
}

// Checks that every pattern's rule is valid and that it went through Schedule::add_pattern.
void check_patterns(const Schedule& s) {
  const int n = s.n;
  for (size_t q = 0; q < s.patterns.size(); ++q) {
    const Pattern& p = s.patterns[q];
    try {
      check_rule(p, n);
    } catch (const ScheduleError& e) {
      throw ScheduleError(s.algorithm + ": pattern " + std::to_string(q) + ": " + e.what());
    }
    if (static_cast<int>(p.position.size()) != n || p.lane_has_pairs.size() != p.lanes.size() ||
        p.num_classes < 1 ||
        p.lane_of_classes.size() != static_cast<size_t>(p.num_classes) * p.num_classes)
      throw ScheduleError(s.algorithm + ": pattern " + std::to_string(q) +
                          " is not finalized (use Schedule::add_pattern)");
  }
}

// Checks step i's header: phase index and, for a pattern step, pattern index, shift, no list.
void check_step_header(const Schedule& s, size_t i) {
  const Step& st = s.steps[i];
  if (st.phase < 0 || st.phase >= static_cast<int>(s.phases.size()))
    throw ScheduleError(where(s, i) + ": phase index out of range");
  if (st.pattern >= 0) {
    if (st.pattern >= static_cast<int>(s.patterns.size()))
      throw ScheduleError(where(s, i) + ": pattern index out of range");
    if (st.shift < 1 || st.shift >= s.patterns[st.pattern].ring_size())
      throw ScheduleError(where(s, i) + ": pattern shift out of range");
    if (!st.transfers.empty())
      throw ScheduleError(where(s, i) + ": a pattern step must not list transfers");
  }
}

// Checks step i's transfers: ranks and chunk runs in range, no self-sends, the one-port rule
// (sent / recvd hold the last step each rank sent / received in), no straggler before arrival.
void check_step_transfers(const Schedule& s, size_t i, const std::vector<Transfer>& transfers,
                          std::vector<int>& sent, std::vector<int>& recvd) {
  const Step& st = s.steps[i];
  const int n = s.n;
  for (const Transfer& t : transfers) {
    if (t.src < 0 || t.src >= n || t.dst < 0 || t.dst >= n)
      throw ScheduleError(where(s, i) + ": transfer rank out of range (" + std::to_string(t.src) +
                          "->" + std::to_string(t.dst) + ")");
    if (t.src == t.dst)
      throw ScheduleError(where(s, i) + ": rank " + std::to_string(t.src) + " sends to itself");
    if (t.count < 1 || t.chunk < 0 || t.chunk + t.count > s.num_chunks)
      throw ScheduleError(where(s, i) + ": chunk run [" + std::to_string(t.chunk) + "," +
                          std::to_string(t.chunk + t.count) + ") out of range");
    if (sent[t.src] == static_cast<int>(i))
      throw ScheduleError(where(s, i) + ": rank " + std::to_string(t.src) +
                          " sends more than once (one-port rule)");
    if (recvd[t.dst] == static_cast<int>(i))
      throw ScheduleError(where(s, i) + ": rank " + std::to_string(t.dst) +
                          " receives more than once (one-port rule)");
    if (st.pre_arrival)
      for (int sg : s.stragglers)
        if (t.src == sg || t.dst == sg)
          throw ScheduleError(where(s, i) + ": pre-arrival step involves straggler " +
                              std::to_string(sg));
    sent[t.src] = static_cast<int>(i);
    recvd[t.dst] = static_cast<int>(i);
  }
}

// Round rule bookkeeping: per rank, the chunk runs sent / reduced into / copied into within the
// current round. Within one round (across different steps) a rank must not send a chunk it
// receives, and a copied chunk must not be received twice (several reductions into the same
// chunk commute and are allowed).
class RoundRule {
 public:
  explicit RoundRule(int n) : sends_(n), reduces_(n), copies_(n) {}

  // Forgets the previous round.
  void clear() {
    for (size_t r = 0; r < sends_.size(); ++r) {
      sends_[r].clear();
      reduces_[r].clear();
      copies_[r].clear();
    }
  }

  // Checks step i's transfers against the earlier steps of its round.
  void check(const Schedule& s, size_t i, const std::vector<Transfer>& transfers) const {
    const int round = s.steps[i].round;
    for (const Transfer& t : transfers) {
      const int a = t.chunk, b = t.chunk + t.count;
      auto overlaps = [&](const std::vector<std::pair<int, int>>& v) {
        for (const auto& p : v)
          if (p.first < b && a < p.second) return true;
        return false;
      };
      if (overlaps(reduces_[t.src]) || overlaps(copies_[t.src]))
        throw ScheduleError(where(s, i) + ": rank " + std::to_string(t.src) +
                            " sends a chunk it receives in another step of round " +
                            std::to_string(round));
      if (overlaps(sends_[t.dst]) || overlaps(copies_[t.dst]) ||
          (t.op == RecvAction::kCopy && overlaps(reduces_[t.dst])))
        throw ScheduleError(where(s, i) + ": rank " + std::to_string(t.dst) +
                            " receives a chunk it sends or receives in another step of round " +
                            std::to_string(round));
    }
  }

  // Records step i's transfers for the later steps of its round.
  void record(const std::vector<Transfer>& transfers) {
    for (const Transfer& t : transfers) {
      sends_[t.src].push_back({t.chunk, t.chunk + t.count});
      (is_reduce(t.op) ? reduces_ : copies_)[t.dst].push_back({t.chunk, t.chunk + t.count});
    }
  }

 private:
  std::vector<std::vector<std::pair<int, int>>> sends_, reduces_, copies_;
};

}  // namespace

void Schedule::validate_structure() const {
  check_fields(*this);
  check_patterns(*this);
  std::vector<int> sent(n, -1), recvd(n, -1);
  std::vector<Transfer> scratch;
  RoundRule round_rule(n);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    if (i > 0 && st.round < steps[i - 1].round)
      throw ScheduleError(where(*this, i) + ": rounds must be non-decreasing");
    if (i == 0 || st.round != steps[i - 1].round) round_rule.clear();
    check_step_header(*this, i);
    const std::vector<Transfer>& transfers = transfers_of(i, scratch);
    check_step_transfers(*this, i, transfers, sent, recvd);
    round_rule.check(*this, i, transfers);
    round_rule.record(transfers);
  }
}

Schedule relabel(const Schedule& s, const std::vector<int>& perm) {
  if (static_cast<int>(perm.size()) != s.n)
    throw ScheduleError("relabel: permutation has " + std::to_string(perm.size()) +
                        " entries, expected " + std::to_string(s.n));
  std::vector<int> seen(s.n, 0);
  for (int p : perm) {
    if (p < 0 || p >= s.n || seen[p]++) throw ScheduleError("relabel: not a permutation");
  }
  Schedule out = s;
  for (auto& st : out.steps)
    for (auto& t : st.transfers) {
      t.src = perm[t.src];
      t.dst = perm[t.dst];
    }
  for (size_t q = 0; q < s.patterns.size(); ++q) {
    const Pattern& p = s.patterns[q];
    Pattern& np = out.patterns[q];
    for (size_t x = 0; x < p.ring.size(); ++x) np.ring[x] = perm[p.ring[x]];
    for (int r = 0; r < s.n; ++r) {
      np.rank_class[perm[r]] = p.rank_class[r];
      np.rank_chunk[perm[r]] = p.rank_chunk[r];
    }
    np.finalize(s.n);
  }
  for (auto& o : out.chunk_owner)
    if (o >= 0) o = perm[o];
  for (auto& sg : out.stragglers) sg = perm[sg];
  for (int r = 0; r < s.n; ++r) out.rank_slowdown[perm[r]] = s.rank_slowdown[r];
  return out;
}

std::vector<int> straggler_permutation(int n, int straggler) {
  if (straggler < 0 || straggler >= n)
    throw ScheduleError("straggler rank " + std::to_string(straggler) + " out of range [0," +
                        std::to_string(n) + ")");
  std::vector<int> perm(n);
  int next = 0;
  for (int r = 0; r < n - 1; ++r) {
    if (next == straggler) ++next;
    perm[r] = next++;
  }
  perm[n - 1] = straggler;
  return perm;
}

void append_steps(Schedule& head, const Schedule& tail) {
  if (head.n != tail.n || head.num_chunks != tail.num_chunks)
    throw ScheduleError("append_steps: schedules differ in n or num_chunks");
  int base = head.steps.empty() ? 0 : head.steps.back().round + 1;
  int first_tail_round = tail.steps.empty() ? 0 : tail.steps.front().round;
  const int pattern_base = static_cast<int>(head.patterns.size());
  head.patterns.insert(head.patterns.end(), tail.patterns.begin(), tail.patterns.end());
  for (const Step& st : tail.steps) {
    Step copy = st;
    copy.round = base + (st.round - first_tail_round);
    copy.phase = head.phase_index(tail.phases.at(st.phase));
    if (copy.pattern >= 0) copy.pattern += pattern_base;
    head.steps.push_back(std::move(copy));
  }
}

}  // namespace core
}  // namespace stragg
