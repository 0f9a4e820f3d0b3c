#include "runtime/stall.h"

#include <algorithm>
#include <deque>
#include <sstream>
#include <thread>

#include "common/error.h"

namespace stragg {

namespace {
// How long a timeout waits for an abort that may still be arriving (see Stall::timed_out), and
// how long a rank must have gone without a check to do so (it was stopped, not just late).
constexpr int kAbortGraceSteps = 40;
constexpr auto kAbortGraceStep = std::chrono::milliseconds(50);
constexpr auto kStoppedGap = std::chrono::seconds(1);
}  // namespace

namespace {

constexpr auto kHealthEvery = std::chrono::milliseconds(100);

// "in step 2" / "while starting it" / "after finishing it", from a peer's published step.
std::string where_in(const Progress& p) {
  if (p.step >= 0) return "in step " + std::to_string(p.step);
  if (p.step == Progress::kFinished) return "after finishing it";
  return "before its first step";
}

// The peer's last collective as the user counts it.
std::string last_call(const Progress& p) {
  if (p.seq < 0) return "it has not called any collective on this group yet";
  return "its last was #" + std::to_string(p.call >= 0 ? p.call : p.seq);
}

bool contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Why peer q, reached while following the wait-for graph, stops the group ("" if it does not:
// it is alive and in the collective, so the search goes on to the peers it waits for).
std::string root_cause(const StallFacts& f, int q, const std::string& what) {
  const PeerStatus& s = f.peers[q];
  const int64_t seq = static_cast<int64_t>(f.spec.seq);
  const std::string r = "rank " + std::to_string(q);
  switch (s.liveness) {
    case Liveness::Dead:
      return r + " has died (process or connection gone)";
    case Liveness::Unreachable: {
      const int lo = std::min(q, f.rank), hi = std::max(q, f.rank);
      return "the connection between ranks " + std::to_string(lo) + " and " + std::to_string(hi) +
             " is down (" + s.evidence + ")";
    }
    case Liveness::Stopped:
      if (s.progress.seq < seq) {
        return r + " has not called " + what + " (" + last_call(s.progress) +
               ") and stopped responding (" + s.evidence + ")";
      }
      return r + " stopped responding (" + s.evidence + ") " +
             (s.progress.seq == seq ? where_in(s.progress) + " of " + what : "after " + what);
    case Liveness::Alive:
      break;
  }
  if (s.progress.seq < seq) {
    // Still inside an earlier collective and waiting there (ranks of a pair-exchange schedule
    // such as recursive doubling can be one collective apart): it is held up, not the cause;
    // the search follows its waits.
    if (s.progress.step >= 0 && !s.progress.awaiting.empty()) return "";
    return r + " has not called " + what + " (" + last_call(s.progress) + ")";
  }
  if (s.progress.seq > seq || s.progress.step == Progress::kFinished) {
    return r + " finished " + what + " but its data for the waiting ranks did not arrive";
  }
  return "";
}

// Root causes reachable from this rank's awaited peers through the wait-for graph, in the
// order found; `chain` collects "rank a waits for b" for the message when there is none.
std::vector<std::string> find_roots(const StallFacts& f, const std::string& what,
                                    std::vector<std::string>* chain) {
  const int n = static_cast<int>(f.peers.size());
  std::vector<bool> seen(n, false);
  std::deque<int> todo;
  seen[f.rank] = true;
  for (int q : f.awaited) {
    if (q >= 0 && q < n && !seen[q]) {
      seen[q] = true;
      todo.push_back(q);
    }
  }
  std::vector<std::string> roots;
  while (!todo.empty()) {
    const int q = todo.front();
    todo.pop_front();
    std::string cause = root_cause(f, q, what);
    if (!cause.empty()) {
      roots.push_back(std::move(cause));
      continue;
    }
    const PeerStatus& s = f.peers[q];
    if (!s.progress.awaiting.empty()) {
      chain->push_back("rank " + std::to_string(q) + " waits for " +
                       ranks_text(s.progress.awaiting));
    }
    for (int p : s.progress.awaiting) {
      if (p < 0 || p >= n) continue;
      // q reports it hears nothing from p while p is alive for this rank: the link q-p is down.
      if (contains(s.cannot_hear, p) && p != f.rank && f.peers[p].liveness == Liveness::Alive) {
        const int lo = std::min(p, q), hi = std::max(p, q);
        const std::string link = "the connection between ranks " + std::to_string(lo) + " and " +
                                 std::to_string(hi) + " is down (";
        auto same = std::find_if(roots.begin(), roots.end(), [&](const std::string& x) {
          return x.rfind(link, 0) == 0;
        });
        if (same == roots.end()) {
          roots.push_back(link + "rank " + std::to_string(q) + " hears nothing from rank " +
                          std::to_string(p) + ", which is alive)");
        } else {  // both directions: one link, said once
          *same = link + "ranks " + std::to_string(lo) + " and " + std::to_string(hi) +
                  " hear nothing from each other; both are alive)";
        }
        continue;
      }
      if (!seen[p]) {
        seen[p] = true;
        todo.push_back(p);
      }
    }
  }
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  return roots;
}

}  // namespace

std::string collective_label(const CollectiveSpec& spec) {
  if (spec.between_calls) {
    return std::string(spec.op_name) + (spec.call >= 0 ? " after call #" + std::to_string(spec.call)
                                                       : std::string(" before the first call"));
  }
  if (spec.internal && spec.call >= 0) {
    return std::string(spec.op_name) + " at call #" + std::to_string(spec.call);
  }
  return std::string(spec.op_name) + " #" +
         std::to_string(spec.call >= 0 ? static_cast<uint64_t>(spec.call) : spec.seq);
}

std::string collective_prefix(int rank, const CollectiveSpec& spec) {
  return "stragg: rank " + std::to_string(rank) + ": " + collective_label(spec);
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + join_ints(ranks);
}

std::string diagnose_stall(const StallFacts& f) {
  const std::string what = collective_label(f.spec);
  std::vector<std::string> chain;
  std::vector<std::string> roots = find_roots(f, what, &chain);
  if (roots.empty()) {
    // Nothing reachable through the published wait-for graph: look at every peer.
    for (int q = 0; q < static_cast<int>(f.peers.size()); ++q) {
      if (q == f.rank) continue;
      std::string cause = root_cause(f, q, what);
      if (!cause.empty()) roots.push_back(std::move(cause));
    }
  }
  std::ostringstream m;
  if (roots.empty()) {
    m << "no rank made progress although every rank is alive and in " << what;
    if (!chain.empty()) {
      m << " (";
      for (size_t i = 0; i < chain.size(); ++i) m << (i ? ", " : "") << chain[i];
      m << ")";
    }
  } else {
    for (size_t i = 0; i < roots.size(); ++i) m << (i ? "; " : "") << roots[i];
  }
  m << "; rank " << f.rank << " was " << f.doing;
  if (!f.awaited.empty()) m << ", waiting for " << ranks_text(f.awaited);
  return m.str();
}

void Stall::check(Clock::time_point now, const std::vector<int>& awaited,
                  const std::string& doing) {
  const int rank = t_.rank();
  throw_if_aborted(awaited);
  if (now - last_health_ >= kHealthEvery) {
    last_health_ = now;
    std::vector<int> dead;
    for (int q : t_.dead_peers()) {
      // Only peers still owed something matter: a rank that finished its part and exited is
      // not an error for ranks still completing theirs.
      if (contains(awaited, q)) dead.push_back(q);
    }
    if (!dead.empty()) {
      throw TimeoutError(collective_prefix(rank, spec_) + ": " + ranks_text(dead) +
                         (dead.size() > 1 ? " have" : " has") +
                         " died (process or connection gone); rank " + std::to_string(rank) +
                         " was " + doing);
    }
  }
  const bool was_stopped = now - last_check_ >= kStoppedGap;
  last_check_ = now;
  if (now >= deadline_) timed_out(was_stopped, awaited, doing);
}

void Stall::throw_if_aborted(const std::vector<int>& awaited) {
  if (auto reason = t_.abort_reason(); reason && !peers_are_past(awaited)) {
    std::string why = *reason;
    if (why.rfind("stragg: ", 0) == 0) why = why.substr(8);
    throw Error(collective_prefix(t_.rank(), spec_) + ": the group was aborted: " + why);
  }
}

// An abort raised by a later collective (a peer finished this one, went on and failed there)
// must not fail this one where it can still complete: every peer this rank waits for has
// published that it is past this collective, so everything it sends here is already sent.
bool Stall::peers_are_past(const std::vector<int>& awaited) {
  if (awaited.empty()) return false;
  const int64_t seq = static_cast<int64_t>(spec_.seq);
  for (int q : awaited) {
    const PeerStatus s = t_.peer_status(q);
    if (s.liveness == Liveness::Dead) return false;
    const Progress& p = s.progress;
    if (!(p.seq > seq || (p.seq == seq && p.step == Progress::kFinished))) return false;
  }
  return true;
}

void Stall::timed_out(bool was_stopped, const std::vector<int>& awaited,
                      const std::string& doing) {
  // The facts as they stand at the deadline: peers that time out too and exit while this rank
  // waits below must not turn its diagnosis into "rank q has died".
  StallFacts f;
  f.rank = t_.rank();
  f.spec = spec_;
  f.doing = doing;
  f.awaited = awaited;
  f.peers.resize(t_.size());
  for (int q = 0; q < t_.size(); ++q) {
    if (q != f.rank) f.peers[q] = t_.peer_status(q);
  }
  // A rank that was stopped (SIGSTOP, a swapped-out host) finds its deadline long past when it
  // runs again, before the peers' abort, sent while it was stopped, is read (over TCP its control
  // connection may be re-dialing): their cause, not a timeout of its own, is what it must report.
  if (was_stopped) {
    for (int i = 0; i < kAbortGraceSteps; ++i) {
      throw_if_aborted(awaited);
      std::this_thread::sleep_for(kAbortGraceStep);
    }
  }
  std::ostringstream m;
  // " timeout " as a word: what torch's test suite (and users' log filters) look for.
  m << collective_prefix(f.rank, spec_) << " timed out (no progress within the timeout of "
    << timeout_.count() / 1000.0 << " s): " << diagnose_stall(f);
  throw TimeoutError(m.str());
}

void check_not_aborted(Transport& t, const CollectiveSpec& spec) {
  if (auto reason = t.abort_reason()) {
    std::string why = *reason;
    if (why.rfind("stragg: ", 0) == 0) why = why.substr(8);
    throw Error(collective_prefix(t.rank(), spec) +
                ": the process group was aborted earlier and cannot be used any more: " + why);
  }
}

}  // namespace stragg
