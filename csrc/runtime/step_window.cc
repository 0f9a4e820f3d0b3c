#include "runtime/step_window.h"

#include <algorithm>

#include "runtime/executor.h"

namespace stragg {
namespace {

bool overlap(const LoweredOp& a, const LoweredOp& b) {
  return a.count > 0 && b.count > 0 && a.offset < b.offset + b.count &&
         b.offset < a.offset + a.count;
}

}  // namespace

StepWindow::StepWindow(Transport& transport, size_t lookahead, ExecutorStats& stats)
    : t_(transport),
      lookahead_(std::max<size_t>(1, lookahead)),
      run_lookahead_(lookahead_),
      limits_(transport.supports_recv_limit()),
      stats_(stats),
      slots_(lookahead_) {}

void StepWindow::start(const LoweredSchedule& plan, const CollectiveSpec& spec, uint8_t* buf) {
  plan_ = &plan;
  spec_ = &spec;
  buf_ = buf;
  elem_ = dtype_size(spec.dtype);
  stream_copies_ = streaming_bytes_ > 0 && spec.numel * elem_ >= streaming_bytes_;
  for (size_t i = 0; i < posted_; ++i) slot(i).sinks.clear();  // a failed run's staging memory
  run_lookahead_ = std::max(lookahead_, plan.min_lookahead);
  if (slots_.size() < run_lookahead_) slots_.resize(run_lookahead_);  // kept for later runs
  head_ = 0;
  posted_ = 0;
  retired_ = 0;
  pre_arrival_end_ = {};
  pre_arrival_done_ = 0;
}

const StepWindow::Active* StepWindow::find(size_t step_index) const {
  if (step_index < retired_ || step_index >= retired_ + posted_) return nullptr;
  return &slot(step_index - retired_);
}

void StepWindow::post(size_t step_index) {
  const LoweredStep& step = plan_->steps[step_index];
  Active& a = slot(posted_++);
  a.index = step_index;
  a.complete = false;
  a.sends.assign(step.sends.size(), SendOp{});
  a.recvs.assign(step.recvs.size(), RecvOp{});
  const int rank = t_.rank();
  for (size_t i = 0; i < step.sends.size(); ++i) {
    const LoweredOp& p = step.sends[i];
    SendOp& s = a.sends[i];
    s.peer = p.peer;
    s.data = buf_ + p.offset * elem_;
    s.header.coll_seq = spec_->seq;
    s.header.payload_bytes = p.count * elem_;
    s.header.numel = spec_->numel;
    s.header.step = step.id;
    s.header.sender = static_cast<uint32_t>(rank);
    s.header.dtype = static_cast<uint8_t>(spec_->dtype);
    s.header.op = static_cast<uint8_t>(spec_->op);
    s.header.algo = plan_->tag;
    stats_.bytes_sent += p.count * elem_;
  }
  a.sinks.clear();
  a.sinks.reserve(step.recvs.size());  // no reallocation below: recvs point into it
  for (size_t i = 0; i < step.recvs.size(); ++i) {
    LoweredOp p = step.recvs[i];
    // Without RecvOp::limit, a receive overlapping a send of the step must be staged.
    if (p.follows_send >= 0 && !limits_) p.staged = true;
    a.sinks.emplace_back(rank, *spec_, plan_->tag, step.id, p, buf_, stream_copies_);
    a.recvs[i].peer = p.peer;
    a.recvs[i].sink = &a.sinks.back();
    stats_.bytes_received += p.count * elem_;
    if (a.sinks.back().streams()) stats_.bytes_streamed += p.count * elem_;
  }
  add_deps(a);
}

// Conflicts of the new step's ops with the unfinished ops of the earlier posted steps.
void StepWindow::add_deps(Active& a) {
  const LoweredStep& step = plan_->steps[a.index];
  // Resized and cleared, not reassigned: the inner lists keep their capacity.
  a.send_deps.resize(step.sends.size());
  a.recv_deps.resize(step.recvs.size());
  for (auto& d : a.send_deps) d.clear();
  for (auto& d : a.recv_deps) d.clear();
  for (size_t k = 0; k < posted_; ++k) {
    const Active& e = slot(k);
    if (e.index >= a.index) break;
    if (e.complete) continue;
    const LoweredStep& earlier = plan_->steps[e.index];
    for (size_t j = 0; j < earlier.recvs.size(); ++j) {
      for (size_t i = 0; i < step.sends.size(); ++i) {  // read after write
        if (overlap(step.sends[i], earlier.recvs[j])) a.send_deps[i].push_back({e.index, false, j});
      }
      for (size_t i = 0; i < step.recvs.size(); ++i) {  // write after write
        if (overlap(step.recvs[i], earlier.recvs[j])) a.recv_deps[i].push_back({e.index, false, j});
      }
    }
    for (size_t j = 0; j < earlier.sends.size(); ++j) {
      for (size_t i = 0; i < step.recvs.size(); ++i) {  // write after read
        if (overlap(step.recvs[i], earlier.sends[j])) a.recv_deps[i].push_back({e.index, true, j});
      }
    }
  }
}

bool StepWindow::dep_satisfied(const Dep& d) const {
  const Active* e = find(d.step);
  if (e == nullptr || e->complete) return true;  // retired or completed: its writes are applied
  if (d.send) return e->sends[d.index].done;
  // A staged receive writes the buffer only when its step completes.
  const LoweredOp& p = plan_->steps[d.step].recvs[d.index];
  const bool staged = p.staged || (p.follows_send >= 0 && !limits_);
  return !staged && e->recvs[d.index].done;
}

bool StepWindow::ready(std::vector<Dep>& deps) const {
  deps.erase(std::remove_if(deps.begin(), deps.end(),
                            [this](const Dep& d) { return dep_satisfied(d); }),
             deps.end());
  return deps.empty();
}

// True if an earlier op of the same direction to the same peer is unfinished (messages between
// two ranks keep the schedule's order) or, in an ordered_sends plan, a send of an earlier step.
bool StepWindow::peer_busy(size_t step_index, bool send, size_t index) const {
  const Active* self = find(step_index);
  const int peer = send ? self->sends[index].peer : self->recvs[index].peer;
  for (size_t k = 0; k < posted_; ++k) {
    const Active& e = slot(k);
    if (e.index > step_index) break;
    const size_t limit = e.index == step_index ? index : (send ? e.sends.size() : e.recvs.size());
    const bool any_peer = send && plan_->ordered_sends && e.index < step_index;
    for (size_t j = 0; j < limit; ++j) {
      if (send && (any_peer || e.sends[j].peer == peer) && !e.sends[j].done) return true;
      if (!send && e.recvs[j].peer == peer && !e.recvs[j].done) return true;
    }
  }
  return false;
}

bool StepWindow::progress_step(Active& a) {
  const LoweredStep& step = plan_->steps[a.index];
  bool moved = false;
  bool all_done = true;
  for (size_t i = 0; i < a.sends.size(); ++i) {
    if (a.sends[i].done) continue;
    all_done = false;
    if (!ready(a.send_deps[i]) || peer_busy(a.index, true, i)) continue;
    moved |= t_.progress(a.sends[i]);
  }
  for (size_t i = 0; i < a.recvs.size(); ++i) {
    if (a.recvs[i].done) continue;
    all_done = false;
    if (!ready(a.recv_deps[i]) || peer_busy(a.index, false, i)) continue;
    const int k = step.recvs[i].follows_send;
    if (limits_ && k >= 0) {
      // Land only bytes the overlapping send has already read (sends read start-of-step data):
      // y bytes of this receive are safe once send_offset + sent >= recv_offset + y.
      const SendOp& s = a.sends[k];
      const size_t s0 = step.sends[k].offset * elem_;
      const size_t r0 = step.recvs[i].offset * elem_;
      a.recvs[i].limit = s.done ? static_cast<size_t>(-1) : (s0 + s.sent > r0 ? s0 + s.sent - r0 : 0);
    }
    moved |= t_.progress(a.recvs[i]);
  }
  if (!all_done) {
    // Ops that finished just now complete the step below on the next pass.
    all_done = std::all_of(a.sends.begin(), a.sends.end(), [](const SendOp& s) { return s.done; }) &&
               std::all_of(a.recvs.begin(), a.recvs.end(), [](const RecvOp& r) { return r.done; });
  }
  if (all_done) {
    for (auto& sink : a.sinks) sink.apply_staged();
    a.complete = true;
    a.sinks.clear();  // frees the staging memory (the list keeps its capacity)
    if (step.pre_arrival) {
      pre_arrival_end_ = std::chrono::steady_clock::now();
      ++pre_arrival_done_;
    }
    moved = true;
  }
  return moved;
}

bool StepWindow::progress() {
  bool moved = false;
  while (posted_ < run_lookahead_ && retired_ + posted_ < plan_->steps.size()) {
    post(retired_ + posted_);
    moved = true;
  }
  for (size_t k = 0; k < posted_; ++k) {
    Active& a = slot(k);
    if (!a.complete) moved |= progress_step(a);
  }
  while (posted_ > 0 && slot(0).complete) {
    head_ = (head_ + 1) % slots_.size();
    --posted_;
    ++retired_;
    moved = true;
  }
  return moved;
}

void StepWindow::awaited(std::vector<int>& out) const {
  // Ops still waiting for an earlier op of this rank wait for that op, not for their peer.
  auto runnable = [this](const std::vector<Dep>& deps) {
    return std::all_of(deps.begin(), deps.end(), [this](const Dep& d) { return dep_satisfied(d); });
  };
  out.clear();
  for (size_t k = 0; k < posted_; ++k) {
    const Active& a = slot(k);
    for (size_t i = 0; i < a.recvs.size(); ++i)
      if (!a.recvs[i].done && runnable(a.recv_deps[i])) out.push_back(a.recvs[i].peer);
    for (size_t i = 0; i < a.sends.size(); ++i)
      if (!a.sends[i].done && runnable(a.send_deps[i])) out.push_back(a.sends[i].peer);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

}  // namespace stragg
