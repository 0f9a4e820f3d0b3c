#include "runtime/executor.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "runtime/error.h"
#include "runtime/step_sink.h"
#include "runtime/step_window.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

// What a rank checks while it waits and nothing moves: another rank's abort, peers that died,
// the deadline. Shared by run() and agree_on_straggler(), so there is one abort path; the
// caller's catch signals the abort to the peers.
class Stall {
 public:
  Stall(Transport& t, const CollectiveSpec& spec, Clock::time_point start,
        std::chrono::milliseconds timeout)
      : t_(t), spec_(spec), deadline_(start + timeout), timeout_(timeout), last_health_(start) {}

  Clock::time_point deadline() const { return deadline_; }

  // Throws if the group was aborted, a peer in `awaited` died, or the deadline passed;
  // `doing` says what this rank waits for ("in step 3", "for arrivals").
  void check(Clock::time_point now, const std::vector<int>& awaited, const std::string& doing) {
    const int rank = t_.rank();
    if (auto reason = t_.abort_reason()) throw Error(collective_prefix(rank, spec_) + ": aborted: " + *reason);
    if (now - last_health_ >= std::chrono::milliseconds(100)) {
      last_health_ = now;
      std::vector<int> dead;
      for (int q : t_.dead_peers()) {
        // Only peers still owed something matter: a rank that finished its part and exited is
        // not an error for ranks still completing theirs.
        if (std::find(awaited.begin(), awaited.end(), q) != awaited.end()) dead.push_back(q);
      }
      if (!dead.empty()) {
        std::ostringstream m;
        m << collective_prefix(rank, spec_) << ": rank" << (dead.size() > 1 ? "s " : " ") << join(dead)
          << (dead.size() > 1 ? " have" : " has") << " died (process or connection gone)";
        throw TimeoutError(m.str());
      }
    }
    if (now < deadline_) return;
    std::vector<int> missing;
    for (int q = 0; q < t_.size(); ++q) {
      if (q != rank && t_.peer_arrival(q) < static_cast<int64_t>(spec_.seq)) missing.push_back(q);
    }
    std::ostringstream m;
    m << collective_prefix(rank, spec_) << ": timed out after " << timeout_.count() / 1000.0 << " s";
    if (!missing.empty()) {
      for (size_t i = 0; i < missing.size(); ++i) {
        const int q = missing[i];
        m << (i ? "; " : ": ") << "rank " << q << " has not called " << spec_.op_name << " #"
          << spec_.seq;
        const int64_t last = t_.peer_arrival(q);
        if (last >= 0) m << " (its last was #" << last << ")";
      }
    } else {
      m << " " << doing << " waiting for rank" << (awaited.size() > 1 ? "s " : " ")
        << join(awaited);
    }
    throw TimeoutError(m.str());
  }

  static std::string join(const std::vector<int>& ranks) {
    std::string out;
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    return out;
  }

 private:
  Transport& t_;
  const CollectiveSpec& spec_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  Clock::time_point last_health_;
};

void check_not_aborted(Transport& t, const CollectiveSpec& spec) {
  if (auto reason = t.abort_reason()) {
    throw Error(collective_prefix(t.rank(), spec) + ": the process group was aborted earlier and cannot be "
                "used any more: " + *reason);
  }
}

}  // namespace

void Executor::run(const RankPlan& plan, const CollectiveSpec& spec, void* buf,
                   std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  check_not_aborted(transport_, spec);
  transport_.announce_arrival(spec.seq);
  Stall stall(transport_, spec, start, timeout);
  StepWindow window(transport_, plan, spec, static_cast<uint8_t*>(buf), lookahead_, stats_);
  try {
    while (!window.done()) {
      const uint64_t token = transport_.activity_token();
      if (window.progress()) continue;
      const auto now = Clock::now();
      stall.check(now, window.awaited(), "in step " + std::to_string(window.current_step()));
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(stall.deadline() - now);
      transport_.wait_for_activity(
          token, std::min<std::chrono::microseconds>(left, std::chrono::milliseconds(100)));
      stats_.wait_s += std::chrono::duration<double>(Clock::now() - now).count();
    }
  } catch (const Error& e) {
    transport_.signal_abort(e.what());
    throw;
  }
  if (window.pre_arrival_end() > start) {
    stats_.pre_arrival_s += std::chrono::duration<double>(window.pre_arrival_end() - start).count();
  }
  stats_.runs += 1;
  stats_.busy_s += std::chrono::duration<double>(Clock::now() - start).count();
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
  transport_.announce_arrival(spec.seq);
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
      // by the collective that follows).
      std::vector<int> awaited;
      for (int q : everybody) {
        if (transport_.peer_arrival(q) < static_cast<int64_t>(spec.seq)) awaited.push_back(q);
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
