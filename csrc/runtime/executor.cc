#include "runtime/executor.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void Executor::run(const LoweredSchedule& plan, const CollectiveSpec& spec, void* buf,
                   std::chrono::milliseconds timeout, RunObserver* observer) {
  const auto start = Clock::now();
  const RunGuard running(*this, spec, "Executor::run");
  check_not_aborted(transport_, spec);
  publish(spec, Progress::kStarting, {});
  Stall stall(transport_, spec, start, timeout);
  transport_.set_paced_sends(plan.ordered_sends);
  window_.start(plan, spec, static_cast<uint8_t*>(buf));
  int32_t doing_step = -1;
  std::string doing;
  // Pre-arrival steps the observer waits for (0: nothing to tell; counted only when observed).
  size_t pre_arrival_steps = 0;
  if (observer != nullptr) {
    for (const auto& step : plan.steps) pre_arrival_steps += step.pre_arrival ? 1 : 0;
  }
  try {
    while (!window_.done()) {
      if (pre_arrival_steps > 0 && window_.pre_arrival_steps_done() == pre_arrival_steps) {
        pre_arrival_steps = 0;
        observer->pre_arrival_done();
      }
      const uint64_t token = transport_.activity_token();
      if (window_.progress()) continue;
      const auto now = Clock::now();
      window_.awaited(awaited_);
      const int32_t step = static_cast<int32_t>(window_.current_step());
      // Published when it changes: a small call waits once or twice per step.
      if (step != progress_.step || awaited_ != progress_.awaiting) publish(spec, step, awaited_);
      if (step != doing_step) {
        doing_step = step;
        doing = "in step " + std::to_string(step);
      }
      stall.check(now, awaited_, doing);
      wait_for_peers(token, stall, now);
    }
  } catch (const Error& e) {
    transport_.signal_abort(e.what());
    throw;
  }
  if (pre_arrival_steps > 0) observer->pre_arrival_done();  // the plan ended with one
  if (window_.pre_arrival_end() > start) {
    stats_.pre_arrival_s +=
        std::chrono::duration<double>(window_.pre_arrival_end() - start).count();
  }
  publish(spec, Progress::kFinished, {});
  stats_.runs += 1;
  stats_.busy_s += std::chrono::duration<double>(Clock::now() - start).count();
}

Executor::RunGuard::RunGuard(Executor& ex, const CollectiveSpec& spec, const char* what)
    : flag_(ex.running_) {
  if (flag_) {
    throw Error(collective_prefix(ex.transport_.rank(), spec) + ": " + what +
                " called while another run of this executor is in progress");
  }
  flag_ = true;
}

void Executor::wait_for_peers(uint64_t token, const Stall& stall, Clock::time_point now) {
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(stall.deadline() - now);
  transport_.wait_for_activity(
      token, std::min<std::chrono::microseconds>(left, std::chrono::milliseconds(100)));
  stats_.wait_s += std::chrono::duration<double>(Clock::now() - now).count();
}

void Executor::publish(const CollectiveSpec& spec, int32_t step, const std::vector<int>& awaiting) {
  progress_.seq = static_cast<int64_t>(spec.seq);
  progress_.call = spec.call;
  progress_.step = step;
  progress_.awaiting.assign(awaiting.begin(), awaiting.end());  // keeps its capacity
  transport_.publish_progress(progress_);
}

int Executor::agree_on_straggler(const CollectiveSpec& spec, std::chrono::microseconds window,
                                 std::chrono::milliseconds timeout, ArrivalBoard* board,
                                 std::optional<uint64_t> board_seq) {
  const uint64_t key = board_seq.value_or(spec.seq);
  const int rank = transport_.rank();
  const int n = transport_.size();
  if (board == nullptr) board = transport_.arrival_board();
  if (board == nullptr) {
    throw Error(collective_prefix(rank, spec) + ": dynamic straggler detection needs a transport with an " +
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
  auto awaited_at = start - std::chrono::hours(1);  // refreshed at once
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
