#include "runtime/executor.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "runtime/error.h"
#include "runtime/reduce.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

// Accepts one incoming message of a step: checks its header against what this rank expects,
// then reduces or copies the payload into the rank's buffer.
class StepSink final : public RecvSink {
 public:
  StepSink(int rank, const CollectiveSpec& spec, uint8_t tag, uint32_t step, const PlanOp& op,
           uint8_t* buf)
      : rank_(rank), spec_(spec), tag_(tag), step_(step), op_(op), buf_(buf) {
    // Not zero-filled: every byte is written by on_data before apply_staged reads it.
    if (op_.staged) staging_.reset(new uint8_t[op_.count * dtype_size(spec_.dtype)]);
  }

  // Staged receives: apply the message now that the step's sends are done.
  void apply_staged() {
    if (!op_.staged || op_.count == 0) return;
    const size_t elem = dtype_size(spec_.dtype);
    uint8_t* dst = buf_ + op_.offset * elem;
    if (op_.reduce) {
      reduce_into(spec_.dtype, spec_.op, dst, staging_.get(), op_.count);
    } else {
      std::memcpy(dst, staging_.get(), op_.count * elem);
    }
  }

  void on_header(const MessageHeader& h) override {
    const size_t elem = dtype_size(spec_.dtype);
    const int peer = op_.peer;
    std::vector<std::string> diffs;
    auto field = [&](const char* name, const std::string& theirs, const std::string& ours) {
      if (theirs == ours) return;
      // Lower rank first, so both sides of a mismatch describe it the same way.
      const bool peer_first = peer < rank_;
      const std::string& a = peer_first ? theirs : ours;
      const std::string& b = peer_first ? ours : theirs;
      diffs.push_back(std::string(name) + " " + a + " (rank " +
                      std::to_string(peer_first ? peer : rank_) + ") vs " + b + " (rank " +
                      std::to_string(peer_first ? rank_ : peer) + ")");
    };
    if (h.coll_seq != spec_.seq) {
      std::ostringstream m;
      m << collective_prefix(rank_, spec_) << ": sequence mismatch with rank " << peer
        << ": it sent data for " << spec_.op_name << " #" << h.coll_seq
        << " (the ranks issued a different number of all_reduce calls on this group)";
      throw Error(m.str());
    }
    const DType their_dtype = static_cast<DType>(h.dtype);
    field("dtype", h.dtype <= static_cast<uint8_t>(DType::Bool) ? dtype_name(their_dtype) : "?",
          dtype_name(spec_.dtype));
    field("numel", std::to_string(h.numel), std::to_string(spec_.numel));
    field("op", h.op <= static_cast<uint8_t>(ReduceOp::BXor)
                    ? reduce_op_name(static_cast<ReduceOp>(h.op))
                    : "?",
          reduce_op_name(spec_.op));
    if (diffs.empty()) {
      field("algorithm", plan_tag_name(h.algo), plan_tag_name(tag_));
      field("step", std::to_string(h.step), std::to_string(step_));
      field("message bytes", std::to_string(h.payload_bytes), std::to_string(op_.count * elem));
      field("sender", std::to_string(h.sender), std::to_string(peer));
    }
    if (!diffs.empty()) {
      std::ostringstream m;
      m << collective_prefix(rank_, spec_) << ": mismatch with rank " << peer << ": ";
      for (size_t i = 0; i < diffs.size(); ++i) m << (i ? "; " : "") << diffs[i];
      throw Error(m.str());
    }
  }

  void on_data(size_t offset, const void* data, size_t len) override {
    if (op_.staged) {
      std::memcpy(staging_.get() + offset, data, len);
      return;
    }
    const size_t elem = dtype_size(spec_.dtype);
    uint8_t* dst = buf_ + op_.offset * elem + offset;
    if (op_.reduce) {
      reduce_into(spec_.dtype, spec_.op, dst, data, len / elem);
    } else {
      std::memcpy(dst, data, len);
    }
  }

 private:
  int rank_;
  const CollectiveSpec& spec_;
  uint8_t tag_;
  uint32_t step_;
  PlanOp op_;
  uint8_t* buf_;
  std::unique_ptr<uint8_t[]> staging_;
};

// True if an op before ops[i] in the list goes to the same peer and is not finished yet.
template <typename Op>
bool earlier_op_pending(const std::vector<Op>& ops, size_t i) {
  for (size_t j = 0; j < i; ++j) {
    if (ops[j].peer == ops[i].peer && !ops[j].done) return true;
  }
  return false;
}

// The sends and receives of one plan step in flight, with their sinks.
struct StepOps {
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  std::vector<std::unique_ptr<StepSink>> sinks;

  // Peers this rank still sends to or receives from, sorted, each once.
  std::vector<int> awaited() const {
    std::vector<int> out;
    for (const auto& r : recvs)
      if (!r.done) out.push_back(r.peer);
    for (const auto& x : sends)
      if (!x.done) out.push_back(x.peer);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
};

}  // namespace

namespace {

// Posts the sends and receives of `step` (headers filled, sinks created).
StepOps post_step(const PlanStep& step, const RankPlan& plan, const CollectiveSpec& spec, int rank,
                  uint8_t* bytes, bool limits, ExecutorStats& stats) {
  const size_t elem = dtype_size(spec.dtype);
  StepOps ops;
  ops.sends.resize(step.sends.size());
  ops.recvs.resize(step.recvs.size());
  for (size_t i = 0; i < step.sends.size(); ++i) {
    const PlanOp& p = step.sends[i];
    SendOp& s = ops.sends[i];
    s.peer = p.peer;
    s.data = bytes + p.offset * elem;
    s.header.coll_seq = spec.seq;
    s.header.payload_bytes = p.count * elem;
    s.header.numel = spec.numel;
    s.header.step = step.id;
    s.header.sender = static_cast<uint32_t>(rank);
    s.header.dtype = static_cast<uint8_t>(spec.dtype);
    s.header.op = static_cast<uint8_t>(spec.op);
    s.header.algo = plan.tag;
    stats.bytes_sent += p.count * elem;
  }
  for (size_t i = 0; i < step.recvs.size(); ++i) {
    PlanOp p = step.recvs[i];
    // Without RecvOp::limit, a receive overlapping a send of the step must be staged.
    if (p.follows_send >= 0 && !limits) p.staged = true;
    ops.sinks.push_back(std::make_unique<StepSink>(rank, spec, plan.tag, step.id, p, bytes));
    ops.recvs[i].peer = p.peer;
    ops.recvs[i].sink = ops.sinks.back().get();
    stats.bytes_received += p.count * elem;
  }
  return ops;
}

// One pass over the step's ops: returns true if anything moved; *all_done when none is left.
bool progress_step(Transport& t, const PlanStep& step, StepOps& ops, size_t elem, bool limits,
                   bool* all_done) {
  bool moved = false;
  *all_done = true;
  // Ops to one peer run in list order: only the first unfinished one may progress.
  for (size_t i = 0; i < ops.sends.size(); ++i) {
    if (ops.sends[i].done) continue;
    *all_done = false;
    if (!earlier_op_pending(ops.sends, i)) moved |= t.progress(ops.sends[i]);
  }
  for (size_t i = 0; i < ops.recvs.size(); ++i) {
    if (ops.recvs[i].done) continue;
    *all_done = false;
    const int k = step.recvs[i].follows_send;
    if (limits && k >= 0) {
      // Land only bytes the overlapping send has already read (sends read start-of-step data):
      // y bytes of this receive are safe once send_offset + sent >= recv_offset + y.
      const SendOp& s = ops.sends[k];
      const size_t s0 = step.sends[k].offset * elem;
      const size_t r0 = step.recvs[i].offset * elem;
      ops.recvs[i].limit = s.done ? static_cast<size_t>(-1) : (s0 + s.sent > r0 ? s0 + s.sent - r0 : 0);
    }
    if (!earlier_op_pending(ops.recvs, i)) moved |= t.progress(ops.recvs[i]);
  }
  return moved;
}

}  // namespace

void Executor::run(const RankPlan& plan, const CollectiveSpec& spec, void* buf,
                   std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const int rank = transport_.rank();
  const size_t elem = dtype_size(spec.dtype);
  const bool limits = transport_.supports_recv_limit();
  auto* bytes = static_cast<uint8_t*>(buf);
  check_not_aborted(transport_, spec);
  publish(spec, Progress::kStarting, {});
  Stall stall(transport_, spec, start, timeout);
  try {
    for (size_t step_index = 0; step_index < plan.steps.size(); ++step_index) {
      const PlanStep& step = plan.steps[step_index];
      const auto step_start = Clock::now();
      StepOps ops = post_step(step, plan, spec, rank, bytes, limits, stats_);
      while (true) {
        const uint64_t token = transport_.activity_token();
        bool all_done = false;
        const bool moved = progress_step(transport_, step, ops, elem, limits, &all_done);
        if (all_done) break;
        if (moved) continue;
        const auto now = Clock::now();
        const std::vector<int> awaited = ops.awaited();
        publish(spec, static_cast<int32_t>(step_index), awaited);
        stall.check(now, awaited, "in step " + std::to_string(step_index));
        const auto left = std::chrono::duration_cast<std::chrono::microseconds>(stall.deadline() - now);
        transport_.wait_for_activity(
            token, std::min<std::chrono::microseconds>(left, std::chrono::milliseconds(100)));
        stats_.wait_s += std::chrono::duration<double>(Clock::now() - now).count();
      }
      for (auto& sink : ops.sinks) sink->apply_staged();
      if (step.pre_arrival) {
        stats_.pre_arrival_s += std::chrono::duration<double>(Clock::now() - step_start).count();
      }
    }
  } catch (const Error& e) {
    transport_.signal_abort(e.what());
    throw;
  }
  publish(spec, Progress::kFinished, {});
  stats_.runs += 1;
  stats_.busy_s += std::chrono::duration<double>(Clock::now() - start).count();
}

void Executor::publish(const CollectiveSpec& spec, int32_t step, const std::vector<int>& awaiting) {
  Progress p;
  p.seq = static_cast<int64_t>(spec.seq);
  p.call = spec.call;
  p.step = step;
  p.awaiting = awaiting;
  transport_.publish_progress(p);
}

int Executor::agree_on_straggler(const CollectiveSpec& spec, std::chrono::microseconds window,
                                 std::chrono::milliseconds timeout, ArrivalBoard* board,
                                 std::optional<uint64_t> board_seq) {
  const uint64_t key = board_seq.value_or(spec.seq);
  const int rank = transport_.rank();
  const int n = transport_.size();
  if (board == nullptr) board = transport_.arrival_board();
  if (board == nullptr) {
    throw Error(collective_prefix(rank, spec) +
                ": dynamic straggler detection needs a transport with an " +
                "arrival board (shm); the " + transport_.name() + " transport has none");
  }
  check_not_aborted(transport_, spec);
  publish(spec, Progress::kStarting, {});
  const auto start = Clock::now();
  struct AddTime {  // accounts the agreement time however the function returns
    double& total;
    Clock::time_point start;
    ~AddTime() { total += std::chrono::duration<double>(Clock::now() - start).count(); }
  } add_time{stats_.agreement_s, start};
  Stall stall(transport_, spec, start, timeout);
  std::vector<int> everybody;
  for (int q = 0; q < n; ++q) {
    if (q != rank) everybody.push_back(q);
  }
  std::vector<int> awaited = everybody;
  auto awaited_at = Clock::time_point::min();
  try {
    if (board->arrive(key) == n - 1) return board->decide(key, -1);  // last: no wait
    auto window_end = Clock::time_point::max();
    while (true) {
      const uint64_t token = transport_.activity_token();
      if (auto d = board->decision(key)) return *d;
      const auto now = Clock::now();
      const int missing = board->missing_rank(key);
      if (missing >= 0) {
        if (window_end == Clock::time_point::max()) window_end = now + window;
        // Waited long enough for the last rank (ski rental): go ahead without it.
        if (now >= window_end) return board->decide(key, missing);
      }
      // Peers that already arrived are not awaited (a rank that arrived and then died is noticed
      // by the collective that follows). Refreshed every 100 ms: statuses are not free.
      if (now - awaited_at >= std::chrono::milliseconds(100)) {
        awaited_at = now;
        awaited.clear();
        for (int q : everybody) {
          if (transport_.peer_status(q).progress.seq < static_cast<int64_t>(spec.seq)) {
            awaited.push_back(q);
          }
        }
        publish(spec, Progress::kStarting, awaited);
      }
      stall.check(now, awaited, "agreeing on the straggler");
      auto until = std::min(stall.deadline(), now + board->poll_interval());
      if (window_end < until) until = window_end;
      transport_.wait_for_activity(
          token, std::chrono::duration_cast<std::chrono::microseconds>(until - now) +
                     std::chrono::microseconds(1));
    }
  } catch (const Error& e) {
    transport_.signal_abort(e.what());
    throw;
  }
}

}  // namespace stragg
