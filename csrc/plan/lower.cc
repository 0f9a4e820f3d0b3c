#include "plan/lower.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace stragg {
namespace {

// Steps a pipelined plan asks the executor to keep in flight at most
// (LoweredSchedule::min_lookahead): every posted step costs a little on each progress pass.
constexpr size_t kMaxPipelineLookahead = 64;

bool overlaps(int a, int a_count, int b, int b_count) { return a < b + b_count && b < a + a_count; }

// Chunk runs a rank touches in one round.
struct RoundOps {
  std::vector<const core::RankOp*> ops;
};

std::map<int, RoundOps> rounds_of(const std::vector<core::RankOp>& program) {
  std::map<int, RoundOps> rounds;
  for (const auto& op : program) rounds[op.round].ops.push_back(&op);
  return rounds;
}

enum class Overlap { kNone, kFollowsSend, kStage };

// How the receive `r` of a round must be carried out. Receives overlapping another receive of
// the round are staged; a receive overlapping exactly one send either follows it (the
// transport lands only bytes the send has read: ordered_recvs) or is staged. *send_index is
// the position of that send among the round's sends.
Overlap classify(const core::RankOp& r, const RoundOps& round, bool ordered_recvs,
                 int* send_index) {
  int overlapping_sends = 0;
  int k = 0;
  for (const core::RankOp* o : round.ops) {
    if (!o->has_send) continue;
    if (overlaps(r.recv_chunk, r.recv_count, o->send_chunk, o->send_count)) {
      ++overlapping_sends;
      *send_index = k;
    }
    ++k;
  }
  for (const core::RankOp* o : round.ops) {
    if (o != &r && o->has_recv &&
        overlaps(r.recv_chunk, r.recv_count, o->recv_chunk, o->recv_count)) {
      return Overlap::kStage;
    }
  }
  if (overlapping_sends == 0) return Overlap::kNone;
  if (overlapping_sends == 1 && ordered_recvs) return Overlap::kFollowsSend;
  return Overlap::kStage;
}

}  // namespace

bool schedule_needs_staging(const core::Schedule& s, bool ordered_recvs) {
  for (int rank = 0; rank < s.n; ++rank) {
    const auto program = s.rank_program(rank);
    for (const auto& [round, ops] : rounds_of(program)) {
      for (const core::RankOp* op : ops.ops) {
        int send_index = -1;
        if (op->has_recv && classify(*op, ops, ordered_recvs, &send_index) == Overlap::kStage) {
          return true;
        }
      }
    }
  }
  return false;
}

namespace {

// True if no rank's round has a receive overlapping another op, except a receive that follows a
// send of exactly its range (StragglAR's exchanges with the straggler) where `ordered_recvs`.
// Pipeline parts split both alike, so part g of the receive overlaps only part g of the send, in
// the same plan step; every other overlap would cross parts of different steps.
bool schedule_pipelines(const core::Schedule& s, bool ordered_recvs) {
  for (int rank = 0; rank < s.n; ++rank) {
    const auto program = s.rank_program(rank);
    for (const auto& [round, ops] : rounds_of(program)) {
      for (const core::RankOp* op : ops.ops) {
        if (!op->has_recv) continue;
        int send_index = -1;
        switch (classify(*op, ops, ordered_recvs, &send_index)) {
          case Overlap::kNone:
            break;
          case Overlap::kStage:
            return false;
          case Overlap::kFollowsSend:
            for (const core::RankOp* o : ops.ops) {
              if (o->has_send && overlaps(op->recv_chunk, op->recv_count, o->send_chunk,
                                          o->send_count) &&
                  (o->send_chunk != op->recv_chunk || o->send_count != op->recv_count)) {
                return false;
              }
            }
            break;
        }
      }
    }
  }
  return true;
}

// How one rank's plan cuts the buffer. Staging segments split the buffer (each segment is lowered
// like a whole buffer). Pipeline parts split every op's range instead (part g carries part g of
// each run), so every element keeps its chunk and is reduced by the same ops in the same order as
// unsplit: the result is bitwise the same. Pipelining is only for schedules in which parts of
// different steps never overlap within a round (schedule_pipelines).
class Segmentation {
 public:
  Segmentation(const core::Schedule& s, size_t numel, size_t elem_size, size_t max_staging_bytes,
               bool ordered_recvs, size_t pipeline_bytes) {
    // Largest chunk is about numel * max_weight / total_weight elements.
    const double max_share =
        *std::max_element(s.chunk_weights.begin(), s.chunk_weights.end()) / s.total_weight();
    const double largest_chunk_bytes = static_cast<double>(numel) * elem_size * max_share;
    if (schedule_needs_staging(s, ordered_recvs)) {
      if (numel > 0) {
        segments_ = std::max<size_t>(
            1, static_cast<size_t>(largest_chunk_bytes / static_cast<double>(max_staging_bytes)) +
                   1);
        segments_ = std::min(segments_, numel);
      }
    } else if (pipeline_bytes > 0 &&
               largest_chunk_bytes > 1.5 * static_cast<double>(pipeline_bytes) &&
               schedule_pipelines(s, ordered_recvs)) {
      parts_ = static_cast<size_t>(largest_chunk_bytes / static_cast<double>(pipeline_bytes) + 0.5);
      if (parts_ > 1) segments_ = parts_;
    }
    const size_t frames = pipelined() ? 1 : segments_;  // buffer splits
    offset_.resize(frames);
    ranges_.resize(frames);
    for (size_t g = 0; g < frames; ++g) {
      offset_[g] = numel / frames * g + std::min(g, numel % frames);
      const size_t len = numel / frames + (g < numel % frames ? 1 : 0);
      ranges_[g] = s.chunk_ranges(static_cast<int64_t>(len));
    }
  }

  bool pipelined() const { return parts_ > 1; }
  size_t segments() const { return segments_; }

  // Element range of chunks [chunk, chunk + count) in segment g.
  void run_range(size_t g, int chunk, int count, size_t* offset, size_t* len) const {
    const size_t frame = pipelined() ? 0 : g;
    const auto& r = ranges_[frame];
    *offset = offset_[frame] + static_cast<size_t>(r[chunk].offset);
    const auto& last = r[chunk + count - 1];
    *len = static_cast<size_t>(last.offset + last.length - r[chunk].offset);
    if (pipelined()) {  // part g of the run
      const size_t k = parts_, whole = *len;
      *offset += whole / k * g + std::min(g, whole % k);
      *len = whole / k + (g < whole % k ? 1 : 0);
    }
  }

 private:
  size_t segments_ = 1;
  size_t parts_ = 1;
  std::vector<size_t> offset_;
  std::vector<std::vector<core::ElementRange>> ranges_;
};

// The (segment, round) pairs in execution order: pre-arrival rounds of every segment first, then
// the others; staged segments one after another, pipelined ones round by round (segment g's
// round r+1 may then run while segment g+1's round r is still on the wire).
std::vector<std::pair<size_t, int>> execution_order(const std::map<int, RoundOps>& rounds,
                                                    const std::vector<bool>& round_pre,
                                                    const Segmentation& seg) {
  std::vector<std::pair<size_t, int>> order;
  for (int pass = 0; pass < 2; ++pass) {
    const bool want_pre = pass == 0;
    if (seg.pipelined()) {
      for (const auto& [round, ops] : rounds) {
        if (round_pre[round] != want_pre) continue;
        for (size_t g = 0; g < seg.segments(); ++g) order.emplace_back(g, round);
      }
    } else {
      for (size_t g = 0; g < seg.segments(); ++g) {
        for (const auto& [round, ops] : rounds) {
          if (round_pre[round] == want_pre) order.emplace_back(g, round);
        }
      }
    }
  }
  return order;
}

// One round of this rank's program in segment g as a plan step.
LoweredStep lower_round(const RoundOps& ops, size_t g, const Segmentation& seg,
                        bool ordered_recvs) {
  LoweredStep step;
  for (const core::RankOp* o : ops.ops) {
    if (!o->has_send) continue;
    LoweredOp op;
    op.peer = o->send_peer;
    seg.run_range(g, o->send_chunk, o->send_count, &op.offset, &op.count);
    step.sends.push_back(op);
  }
  for (const core::RankOp* o : ops.ops) {
    if (!o->has_recv) continue;
    LoweredOp op;
    op.peer = o->recv_peer;
    seg.run_range(g, o->recv_chunk, o->recv_count, &op.offset, &op.count);
    op.reduce = core::is_reduce(o->recv_action);
    op.received_first = o->recv_action == core::RecvAction::kReduceFirst;
    int send_index = -1;
    switch (classify(*o, ops, ordered_recvs, &send_index)) {
      case Overlap::kNone:
        break;
      case Overlap::kFollowsSend:
        op.follows_send = send_index;
        break;
      case Overlap::kStage:
        op.staged = true;
        break;
    }
    step.recvs.push_back(op);
  }
  return step;
}

}  // namespace

LoweredSchedule lower_schedule(const core::Schedule& s, int rank, size_t numel, size_t elem_size,
                               size_t max_staging_bytes, bool ordered_recvs,
                               size_t pipeline_bytes) {
  if (rank < 0 || rank >= s.n) {
    throw Error("stragg: lower_schedule: rank " + std::to_string(rank) + " outside a schedule of " +
                std::to_string(s.n) + " ranks");
  }
  LoweredSchedule plan;
  if (auto a = algorithm_from_name(s.algorithm)) plan.tag = schedule_tag(*a);
  const auto program = s.rank_program(rank);
  const auto rounds = rounds_of(program);
  int num_rounds = 0;
  for (const auto& st : s.steps) num_rounds = std::max(num_rounds, st.round + 1);
  // A round is pre-arrival when all its steps are, decided from the whole schedule so that every
  // rank orders its messages the same way.
  std::vector<bool> round_pre(num_rounds, true);
  for (const auto& st : s.steps) round_pre[st.round] = round_pre[st.round] && st.pre_arrival;

  const Segmentation seg(s, numel, elem_size, max_staging_bytes, ordered_recvs, pipeline_bytes);
  // StragglAR's rounds each go to a new partner; OptCC must not: its healthy ranks feed the
  // slow link and the ring at once (Ring and RHD talk to one peer or wait for it anyway).
  plan.ordered_sends = pipeline_bytes > 0 && s.algorithm == "stragglar";
  if (seg.pipelined()) {
    // Two rounds' parts in flight: a rank forwards round r+1's parts while round r's last ones
    // still arrive, and runs a later round's transfers to one peer while another peer lags.
    plan.min_lookahead = std::min<size_t>(2 * seg.segments(), kMaxPipelineLookahead);
  }
  for (const auto& [g, round] : execution_order(rounds, round_pre, seg)) {
    LoweredStep step = lower_round(rounds.at(round), g, seg, ordered_recvs);
    step.id = static_cast<uint32_t>(g * static_cast<size_t>(num_rounds) + round);
    step.pre_arrival = round_pre[round];
    plan.steps.push_back(std::move(step));
  }
  return plan;
}

}  // namespace stragg
