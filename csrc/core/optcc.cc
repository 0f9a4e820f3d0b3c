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
// Representation: every window is a ring shift, so the schedule is emitted in the IR's compact
// form (ir.h, pattern steps): three patterns (reducing step, copying step, bubble step) whose
// lanes are the stage rules above, and one O(1) header per step. Listing the Theta(k p^2)
// transfers took seconds at p = 1024, k = 64; Schedule::expanded() gives that listing.
#include <algorithm>
#include <sstream>

#include "core/generators.h"

namespace stragg {
namespace core {

namespace {

// Rank classes of the patterns and the step phases (indices into Schedule::phases).
enum : int { kHealthy = 0, kSigma = 1, kOtherStraggler = 2 };
constexpr int kReducePhase = 0, kCopyPhase = 1, kBubblePhase = 2;

// Validates the options against n ranks and fills in the defaults (stragglers, slowdowns).
OptccOptions checked_options(int n, const OptccOptions& opt_in) {
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
    throw ScheduleError("optcc: order must be \"s3_first\" or \"s1_first\", got \"" + opt.order +
                        "\"");
  if (!s3_first && m != 1) throw ScheduleError("optcc: order s1_first supports one straggler only");
  return opt;
}

// Where ranks sit on Z_p and which section each healthy rank owns (-1 for stragglers).
struct Placement {
  std::vector<int> rank_at;     // position -> rank
  std::vector<int> section_of;  // rank -> section index among healthy ranks, -1 for stragglers
};

// Stragglers spread evenly over Z_p, healthy ranks fill the rest in rank order.
Placement place_ranks(int p, const std::vector<int>& stragglers) {
  const int m = static_cast<int>(stragglers.size());
  Placement pl;
  pl.rank_at.assign(p, -1);
  pl.section_of.assign(p, -1);
  std::vector<int> is_straggler(p, 0);
  for (int i = 0; i < m; ++i) {
    const int pos = static_cast<int>(static_cast<long long>(i) * p / m);
    pl.rank_at[pos] = stragglers[i];
    is_straggler[stragglers[i]] = 1;
  }
  std::vector<int> healthy;
  for (int r = 0; r < p; ++r)
    if (!is_straggler[r]) {
      pl.section_of[r] = static_cast<int>(healthy.size());
      healthy.push_back(r);
    }
  for (int pos = 0, next = 0; pos < p; ++pos)
    if (pl.rank_at[pos] < 0) pl.rank_at[pos] = healthy[next++];
  return pl;
}

// Fills the schedule's header: segments, stragglers, slowdowns, bubble chunk weights, phases.
void set_header(Schedule& s, const OptccOptions& opt, int h, int per_seg, bool bubble) {
  const int m = static_cast<int>(opt.stragglers.size()), k = opt.segments;
  const double l = opt.slowdowns[0];
  s.segments = k;
  s.stragglers = opt.stragglers;
  for (int i = 0; i < m; ++i) s.rank_slowdown[opt.stragglers[i]] = opt.slowdowns[i];
  if (bubble)
    for (int j = 0; j < k; ++j) s.chunk_weights[j * per_seg + h] = (2.0 - l) / l;
  // Step phases: the reducing step of a window carries S1 (and the straggler uploads), the copying
  // step S4 (and the straggler downloads); the third step carries bubble-filling flows.
  if (opt.order == "s3_first")
    s.phases = {"S3+S1_reduce_scatter", "S4+S2_allgather", "bubble_fill"};
  else
    s.phases = {"S1_reduce_scatter+S2_upload", "S4_allgather+S3_download", "bubble_fill"};
}

// The ring, rank classes and section offsets shared by all patterns (no lanes yet).
Pattern base_pattern(int n, const OptccOptions& opt, const Placement& pl, int per_seg) {
  const int m = static_cast<int>(opt.stragglers.size());
  Pattern base;
  base.ring = pl.rank_at;
  base.rank_class.assign(n, kHealthy);
  for (int i = 0; i < m; ++i)
    base.rank_class[opt.stragglers[i]] = i == 0 ? kSigma : kOtherStraggler;
  base.rank_chunk.assign(n, 0);
  for (int r = 0; r < n; ++r)
    if (pl.section_of[r] >= 0) base.rank_chunk[r] = pl.section_of[r];
  base.chunk_stride = per_seg;
  base.instances = opt.segments;
  return base;
}

// One stage rule of a pattern.
PatternLane make_lane(uint32_t src, uint32_t dst, PatternLane::Key key, int add, int delay,
                      RecvAction op) {
  PatternLane l;
  l.src_classes = src;
  l.dst_classes = dst;
  l.key = key;
  l.chunk_add = add;
  l.delay = delay;
  l.op = op;
  return l;
}

// A pattern and the phase its steps belong to.
struct Stream {
  int pattern, phase;
};

// Adds the reducing, copying and (with bubble filling) bubble patterns; returns their streams.
std::vector<Stream> add_patterns(Schedule& s, Pattern base, bool s3_first, bool bubble, int h) {
  const uint32_t H = 1u << kHealthy, SG = 1u << kSigma, ANY = H | SG | (1u << kOtherStraggler);
  const auto kSrc = PatternLane::kSender, kDst = PatternLane::kReceiver;
  Pattern pa = base, pb = base;
  if (s3_first) {
    // Reduce-scatter of segment b into owners (straggler contributions included: S3->S1).
    pa.lanes = {make_lane(ANY, H, kDst, 0, 0, RecvAction::kReduce)};
    // Allgather of segment b-1 from owners (to stragglers: S4->S2).
    pb.lanes = {make_lane(H, ANY, kSrc, 0, 1, RecvAction::kCopy)};
  } else {
    pa.lanes = {make_lane(H, H, kDst, 0, 0, RecvAction::kReduce),    // S1 of segment b
                make_lane(H, SG, kSrc, 0, 1, RecvAction::kReduce)};  // S2 of segment b-1
    pb.lanes = {make_lane(H, H, kSrc, 0, 3, RecvAction::kCopy),      // S4 of segment b-3
                make_lane(SG, H, kDst, 0, 2, RecvAction::kCopy)};    // S3 of segment b-2
  }
  const int ia = s.add_pattern(std::move(pa));
  const int ib = s.add_pattern(std::move(pb));
  std::vector<Stream> streams = {{ia, kReducePhase}, {ib, kCopyPhase}};
  if (bubble) {
    Pattern pe = std::move(base);
    pe.lanes = {make_lane(H, SG, PatternLane::kNone, h, 0, RecvAction::kReduce),  // bubble of b up
                make_lane(SG, H, PatternLane::kNone, h, 1, RecvAction::kCopy)};   // and of b-1 down
    streams.push_back({s.add_pattern(std::move(pe)), kBubblePhase});
  }
  return streams;
}

// Emits the step headers: per body and window, one round of the streams' non-empty steps.
void emit_steps(Schedule& s, const std::vector<Stream>& streams, int bodies, int p) {
  s.steps.reserve(static_cast<size_t>(bodies) * (p - 1) * streams.size());
  int round = -1;
  for (int b = 0; b < bodies; ++b) {
    for (int d = 1; d < p; ++d) {
      // Each window is one round of up to three concurrent one-port steps (empty ones omitted).
      bool first = true;
      for (const Stream& st : streams) {
        if (!s.patterns[st.pattern].has_transfers(d, b)) continue;
        if (first) ++round;
        first = false;
        s.steps.emplace_back();
        Step& step = s.steps.back();
        step.round = round;
        step.phase = st.phase;
        step.pattern = st.pattern;
        step.shift = d;
        step.rep = b;
      }
    }
  }
}

// The generator parameters as JSON, for provenance.
std::string params_json(const OptccOptions& opt) {
  const int m = static_cast<int>(opt.stragglers.size());
  std::ostringstream ps;
  ps << "{\"stragglers\": [";
  for (int i = 0; i < m; ++i) ps << (i ? ", " : "") << opt.stragglers[i];
  ps << "], \"slowdowns\": [";
  for (int i = 0; i < m; ++i) ps << (i ? ", " : "") << opt.slowdowns[i];
  ps << "], \"segments\": " << opt.segments
     << ", \"bubble_fill\": " << (opt.bubble_fill ? "true" : "false") << ", \"order\": \""
     << opt.order << "\"}";
  return ps.str();
}

}  // namespace

Schedule optcc(int n, const OptccOptions& opt_in) {
  const OptccOptions opt = checked_options(n, opt_in);
  const int m = static_cast<int>(opt.stragglers.size());
  const bool s3_first = opt.order == "s3_first";
  const int p = n, k = opt.segments, h = n - m;
  const double l = opt.slowdowns[0];
  const bool bubble = opt.bubble_fill && m == 1 && l < 2.0;
  const Placement pl = place_ranks(p, opt.stragglers);

  const int per_seg = h + (bubble ? 1 : 0);
  Schedule s = Schedule::make("optcc", Collective::kAllReduce, n, k * per_seg);
  set_header(s, opt, h, per_seg, bubble);
  const int bodies = k + (s3_first ? 1 : 3);
  // Compact form (ir.h): window d of body b is one round of up to three pattern steps, all on the
  // ring of positions (rank_at) with shift d and repetition b; the lanes are the stage rules
  // (segment = b - delay). Only the step headers are built here: O(bodies * p), no transfers.
  const std::vector<Stream> streams =
      add_patterns(s, base_pattern(n, opt, pl, per_seg), s3_first, bubble, h);
  emit_steps(s, streams, bodies, p);
  s.params_json = params_json(opt);
  return s;
}

}  // namespace core
}  // namespace stragg
