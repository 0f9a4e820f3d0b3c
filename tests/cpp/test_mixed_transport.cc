// MixedTransport tests: ranks are threads of one process playing several hosts (each rank is
// given a host identity, so ranks "on one host" share memory and the others talk TCP over
// 127.0.0.1). The checks every transport must pass (transport_checks.h) run on several host
// layouts; this file adds the routing, the rank numbering of the shm sub-groups, the wake-ups
// across the two sub-transports (the helper thread), dead peers on either side, and every
// schedule generator run bitwise exactly across hosts.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "plan/planner.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "transport/mixed/host_layout.h"
#include "transport/mixed/mixed_transport.h"
#include "transport/mixed/peer_stats.h"
#include "transport_checks.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::Receive;
using testing::run_ranks;

// Host identities of a layout given as the host letter of each rank, e.g. "AABB".
std::vector<std::string> hosts_of(const std::string& letters) {
  std::vector<std::string> out;
  for (char c : letters) out.push_back(std::string("host-") + c);
  return out;
}

MixedOptions small_options() {
  MixedOptions o;
  o.shm.slot_bytes = 4096;
  o.shm.num_slots = 2;
  o.shm.setup_timeout = std::chrono::seconds(20);
  o.tcp.staging_bytes = 4096;
  o.tcp.socket_send_buffer = 16 * 1024;
  o.tcp.socket_recv_buffer = 16 * 1024;
  o.tcp.setup_timeout = std::chrono::seconds(20);
  return o;
}

// A maker for the shared checks: rank r of n lives on host letters[r] (n <= letters.size()).
testing::MakeTransport mixed_maker(const std::string& letters,
                                   const MixedOptions& opt = small_options()) {
  return [letters, opt](Rendezvous& rdv, int r, int n) {
    return std::make_unique<MixedTransport>(rdv, "mixed", r, hosts_of(letters.substr(0, n)), opt);
  };
}

MixedTransport& mixed(std::unique_ptr<Transport>& t) { return static_cast<MixedTransport&>(*t); }

int count_open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (auto* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

int count_own_shm_entries() {
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  const std::string mine = "stragg-" + std::to_string(getpid()) + "-";
  while (auto* e = readdir(d)) {
    if (std::strncmp(e->d_name, mine.c_str(), mine.size()) == 0) ++n;
  }
  closedir(d);
  return n;
}

// ------------------------------------------------------------------------------------------------
// Host layout

TEST(HostLayout, NumbersHostsByLowestRankAndRanksWithinEachHost) {
  const HostLayout l(hosts_of("BABCA"));
  EXPECT_EQ(l.size(), 5);
  EXPECT_EQ(l.num_hosts(), 3);
  EXPECT_EQ(l.host_of(0), 0);  // B
  EXPECT_EQ(l.host_of(1), 1);  // A
  EXPECT_EQ(l.host_of(3), 2);  // C
  EXPECT_EQ(l.ranks_on(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.ranks_on(1), (std::vector<int>{1, 4}));
  EXPECT_EQ(l.local_rank_of(4), 1);
  EXPECT_EQ(l.local_rank_of(3), 0);
  EXPECT_TRUE(l.same_host(1, 4));
  EXPECT_FALSE(l.same_host(0, 1));
  EXPECT_FALSE(l.all_on_one_host());
  EXPECT_FALSE(l.every_rank_alone());
  EXPECT_EQ(l.describe(), "[[0, 2], [1, 4], [3]]");
  EXPECT_TRUE(HostLayout(hosts_of("AAA")).all_on_one_host());
  EXPECT_TRUE(HostLayout(hosts_of("ABC")).every_rank_alone());
}

// ------------------------------------------------------------------------------------------------
// Setup and routing

TEST(MixedTransport, RoutesLocalPeersToShmAndRemoteOnesToTcpAndLeaksNothing) {
  const int fds = count_open_fds();
  const int shm = count_own_shm_entries();
  {
    InMemoryRendezvous rdv;
    auto ts = testing::make_group(rdv, 5, mixed_maker("ABABA"));
    auto& t0 = mixed(ts[0]);
    EXPECT_STREQ(t0.name(), "mixed");
    EXPECT_EQ(t0.rank(), 0);
    EXPECT_EQ(t0.size(), 5);
    EXPECT_STREQ(t0.peer_transport(2), "shm");
    EXPECT_STREQ(t0.peer_transport(4), "shm");
    EXPECT_STREQ(t0.peer_transport(1), "tcp");
    EXPECT_STREQ(t0.peer_transport(3), "tcp");
    ASSERT_NE(t0.shm(), nullptr);
    EXPECT_EQ(t0.shm()->size(), 3);  // ranks 0, 2, 4 as local ranks 0, 1, 2
    EXPECT_EQ(mixed(ts[4]).shm()->rank(), 2);
    EXPECT_EQ(mixed(ts[3]).shm()->rank(), 1);  // ranks 1, 3 on host B
    EXPECT_EQ(t0.tcp().size(), 5);
    EXPECT_TRUE(t0.supports_recv_limit());  // shm and TCP both honour RecvOp::limit
    for (auto& t : ts) EXPECT_TRUE(t->dead_peers().empty());
    TransportStats stats = ts[3]->stats();
    EXPECT_EQ(stats["peer_transport.1"], kPeerViaShm);
    EXPECT_EQ(stats["peer_transport.0"], kPeerViaTcp);
    EXPECT_EQ(stats["shm_peers"], 1);
    EXPECT_EQ(stats["tcp_peers"], 3);
    EXPECT_EQ(stats["host_index"], 1);
    EXPECT_EQ(stats["hosts"], 2);
    EXPECT_EQ(stats.count("peer_transport.3"), 0u);
    EXPECT_EQ(stats["tcp_reconnects"], 0);  // the TCP part's counters come along
    EXPECT_GT(stats["tcp_resend_buffer_bytes"], 0);
  }
  EXPECT_EQ(count_open_fds(), fds);
  EXPECT_EQ(count_own_shm_entries(), shm);
}

TEST(MixedTransport, RankAloneOnItsHostNeedsNoSharedMemory) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, mixed_maker("AAB"));
  EXPECT_EQ(mixed(ts[2]).shm(), nullptr);
  EXPECT_EQ(mixed(ts[2]).helper_thread_id(), 0);
  EXPECT_NE(mixed(ts[0]).shm(), nullptr);
  EXPECT_TRUE(testing::eventually([&] { return mixed(ts[0]).helper_thread_id() != 0; }));
}

TEST(MixedTransport, SetupTimesOutNamingTheMissingRanksAndLeaksNothing) {
  MixedOptions opt = small_options();
  opt.tcp.setup_timeout = opt.shm.setup_timeout = std::chrono::milliseconds(300);
  testing::check_setup_names_ranks_that_never_join(
      mixed_maker("AAB", opt), [] { return count_open_fds() * 1000 + count_own_shm_entries(); });
}

TEST(MixedTransport, ShmErrorsNameRanksOfTheWholeGroup) {
  const HostLayout l(hosts_of("ABAB"));
  // Rank 3 is local rank 1 on host B (ranks 1, 3); its shm sub-group names local rank 0.
  const std::string m = shm_error_in_group_terms(
      "stragg: rank 1: message stream from rank 0 out of sync (bad piece)", l, 3, 1);
  EXPECT_EQ(m,
            "stragg: rank 3: shared memory with rank 1: message stream from rank 0 out of sync "
            "(bad piece) (ranks in this message are numbered within this host's shared-memory "
            "sub-group: local rank 0 is rank 1, local rank 1 is rank 3)");
}

TEST(MixedTransport, InvalidPeersAreNamedInGroupRanks) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, mixed_maker("AAB"));
  SendOp s = testing::make_send(7, nullptr, 0);
  try {
    ts[1]->progress(s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "stragg: rank 1: invalid send peer 7");
  }
}

// ------------------------------------------------------------------------------------------------
// The shared checks, on layouts that put the pairs they use on one host and on two

TEST(MixedTransport, StreamsMessagesInFifoOrderOverShmAndTcp) {
  for (const std::string letters : {"AA", "AB"}) {
    std::vector<int> pieces;
    testing::check_streams_messages_in_fifo_order(mixed_maker(letters), 4096, &pieces);
  }
}

TEST(MixedTransport, FullDuplexExchangeDoesNotDeadlock) {
  for (const std::string letters : {"AA", "AB"}) {
    testing::check_full_duplex_exchange(mixed_maker(letters), 4096 * 20 + 17);
  }
}

TEST(MixedTransport, AbortReachesEveryRankWithTheFirstReason) {
  for (const std::string letters : {"AAB", "ABA", "ABB"}) {
    testing::check_abort_reaches_every_rank_with_the_first_reason(mixed_maker(letters));
  }
}

TEST(MixedTransport, ProgressReportsAreVisibleToPeers) {
  // Default socket buffers: the check publishes 2000 reports and never waits, and a TCP
  // report that finds the control socket full is only sent by a later wait or report.
  MixedOptions opt = small_options();
  opt.tcp.socket_send_buffer = opt.tcp.socket_recv_buffer = 0;
  for (const std::string letters : {"AAB", "ABB"}) {
    SCOPED_TRACE(letters);
    testing::check_progress_reports_are_visible_to_peers(mixed_maker(letters, opt));
  }
}

TEST(MixedTransport, WaitReturnsWhenTokenIsStale) {
  for (const std::string letters : {"AA", "AB"}) {
    testing::check_wait_returns_when_token_is_stale(mixed_maker(letters));
  }
}

TEST(MixedTransport, RingAllreduceIsExactAndBitwiseIdentical) {
  for (const std::string letters : {"AABB", "ABAB", "AAAB", "ABBBA"}) {
    const int n = static_cast<int>(letters.size());
    for (size_t numel : {size_t{0}, size_t{1}, size_t{1000}, size_t{100003}}) {
      testing::check_ring_allreduce(n, numel, mixed_maker(letters));
    }
  }
}

TEST(MixedTransport, NumelMismatchRaisesEverywhere) {
  testing::check_numel_mismatch_raises_everywhere(4, mixed_maker("AABB"));
  testing::check_numel_mismatch_raises_everywhere(4, mixed_maker("ABAB"));
}

// ------------------------------------------------------------------------------------------------
// Wake-ups across the two sub-transports. Ranks 0 and 1 share host A, rank 2 is on host B.

// Without shm's spin and yield window (in which waits with shm ops do not sleep yet, see
// WaitsSpinOrPollBrieflyThenSleep): the checks below see a wait go to sleep at once.
MixedOptions no_spin() {
  MixedOptions o = small_options();
  o.shm.spin_us = o.shm.yield_us = 0;
  return o;
}

// True once `tid` sleeps in system call `nr`.
bool eventually_sleeps_in(int tid, long nr) {
  return testing::eventually([&] { return tid != 0 && testing::sleeps_in(tid, nr); });
}

// Rank 0 waits for a local message only: it sleeps on the doorbell (futex) as in a shm-only
// group, its helper sleeps in TCP's ppoll(); a remote abort reaches it through the helper.
TEST(MixedTransport, RemoteAbortWakesARankWaitingOnlyForALocalPeer) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, mixed_maker("AAB", no_spin()));
  Receive rv(1);
  EXPECT_FALSE(ts[0]->progress(rv.op));
  ASSERT_TRUE(testing::eventually([&] { return mixed(ts[0]).helper_thread_id() != 0; }));
  const int helper = mixed(ts[0]).helper_thread_id();
  EXPECT_EQ(testing::wake_sleeping_waiter(*ts[0], SYS_futex,
                                          [&] {
                                            EXPECT_TRUE(eventually_sleeps_in(helper, SYS_ppoll))
                                                << "helper not in TCP's wait";
                                            ts[2]->signal_abort("rank 2 gives up");
                                          }),
            "");
  EXPECT_EQ(ts[0]->abort_reason().value_or(""), "rank 2 gives up");
  EXPECT_GE(mixed(ts[0]).relayed_wakeups(), 1u);
}

// Rank 0 waits for a remote and a local message: it sleeps in TCP's ppoll(), its helper on the
// doorbell; the local message wakes it through the helper.
TEST(MixedTransport, LocalDataWakesARankWaitingInTcp) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, mixed_maker("AAB", no_spin()));
  Receive remote(2), local(1);
  EXPECT_FALSE(ts[0]->progress(remote.op));
  EXPECT_FALSE(ts[0]->progress(local.op));
  ASSERT_TRUE(testing::eventually([&] { return mixed(ts[0]).helper_thread_id() != 0; }));
  const int helper = mixed(ts[0]).helper_thread_id();
  SendOp s = testing::make_send(0, nullptr, 0, 5);
  EXPECT_EQ(testing::wake_sleeping_waiter(*ts[0], SYS_ppoll,
                                          [&] {
                                            EXPECT_TRUE(eventually_sleeps_in(helper, SYS_futex))
                                                << "helper not on the doorbell";
                                            testing::drive(*ts[1], &s, nullptr);
                                          }),
            "");
  testing::drive(*ts[0], nullptr, &local.op);
  EXPECT_EQ(local.sink.header.step, 5u);
  EXPECT_FALSE(remote.op.done);
}

// Remote data wakes a rank sleeping in ppoll(); local data one sleeping on the doorbell.
TEST(MixedTransport, DataWakesASleepingReceiverOnEitherSide) {
  for (int sender : {2, 1}) {
    InMemoryRendezvous rdv;
    auto ts = testing::make_group(rdv, 3, mixed_maker("AAB", no_spin()));
    Receive rv(sender);
    EXPECT_FALSE(ts[0]->progress(rv.op));
    SendOp s = testing::make_send(0, nullptr, 0, 9);
    const long nr = sender == 2 ? SYS_ppoll : SYS_futex;
    EXPECT_EQ(testing::wake_sleeping_waiter(*ts[0], nr,
                                            [&] { testing::drive(*ts[sender], &s, nullptr); }),
              "")
        << "sender " << sender;
    testing::drive(*ts[0], nullptr, &rv.op);
    EXPECT_EQ(rv.sink.header.step, 9u);
  }
}

// A local abort reaches a rank that waits in ppoll() for a remote peer only (over TCP's control
// connection: the helper does not watch the doorbell then).
TEST(MixedTransport, LocalAbortWakesARankWaitingOnlyForARemotePeer) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, mixed_maker("AAB"));
  Receive rv(2);
  EXPECT_FALSE(ts[0]->progress(rv.op));
  EXPECT_EQ(testing::wake_sleeping_waiter(*ts[0], SYS_ppoll,
                                          [&] { ts[1]->signal_abort("rank 1 gives up"); }),
            "");
  EXPECT_EQ(ts[0]->abort_reason().value_or(""), "rank 1 gives up");
}

// Within the spin and yield window after the last op moved, a wait for a remote and a local
// message only polls (it returns at once and the caller progresses again), and a wait for a
// local message only spins and yields until the window ends (as in a shm group) without the
// helper; past the window both sleep, woken through the helper.
TEST(MixedTransport, WaitsSpinOrPollBrieflyThenSleep) {
  for (bool both : {true, false}) {
    SCOPED_TRACE(both ? "remote and local receive" : "local receive");
    InMemoryRendezvous rdv;
    MixedOptions opt = small_options();
    opt.shm.spin_us = 0;
    opt.shm.yield_us = 500000;
    auto ts = testing::make_group(rdv, 3, mixed_maker("AAB", opt));
    Receive remote(2), local(1);
    const auto start = std::chrono::steady_clock::now();
    const int waits = both ? 3 : 1;
    for (int i = 0; i < waits; ++i) {  // each returns within the window
      if (both) {
        EXPECT_FALSE(ts[0]->progress(remote.op));
      }
      EXPECT_FALSE(ts[0]->progress(local.op));
      ts[0]->wait_for_activity(ts[0]->activity_token(), testing::kLongWait);
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, testing::kHangGuard);
    EXPECT_EQ(mixed(ts[0]).relayed_wakeups(), 0u);
    if (both) {
      EXPECT_FALSE(ts[0]->progress(remote.op));
    }
    EXPECT_FALSE(ts[0]->progress(local.op));
    // Past the window (which started at the first wait): the wait sleeps until woken.
    std::this_thread::sleep_until(start + std::chrono::milliseconds(600));
    SendOp s = testing::make_send(0, nullptr, 0, 3);
    EXPECT_EQ(testing::wake_sleeping_waiter(*ts[0], both ? SYS_ppoll : SYS_futex,
                                            [&] { testing::drive(*ts[1], &s, nullptr); }),
              "");
    EXPECT_EQ(mixed(ts[0]).relayed_wakeups(), both ? 1u : 0u);
  }
}

// ------------------------------------------------------------------------------------------------
// Dead peers

// A peer whose transport is gone (its sockets closed) is dead, on this host or another: the
// threads of one process share a pid, so only TCP can tell for the local one.
TEST(MixedTransport, PeersThatLeaveAreDeadOnEitherSide) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 4, mixed_maker("AABB"));
  ts[3].reset();
  ASSERT_TRUE(testing::eventually([&] { return ts[0]->dead_peers() == std::vector<int>{3}; }));
  ts[1].reset();
  ASSERT_TRUE(testing::eventually([&] { return ts[0]->dead_peers() == std::vector<int>{1, 3}; }));
  EXPECT_EQ(ts[2]->dead_peers(), (std::vector<int>{1, 3}));
}

// A rank waiting in a collective for a peer on another host that goes away raises naming it.
TEST(MixedTransport, ExecutorNamesARemotePeerThatDied) {
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(4);
  run_ranks(4, [&](int r) {
    auto t = mixed_maker("AABB")(rdv, r, 4);
    exchange_all(rdv, "built", r, 4, "1", std::chrono::seconds(60), "test");
    if (r == 3) return;  // leaves at once: its sockets close
    Executor ex(*t);
    std::vector<float> buf(1000, 1.0f);
    CollectiveSpec spec;
    spec.numel = buf.size();
    try {
      ex.run(*ring_allreduce_schedule(r, 4, buf.size()), spec, buf.data(), testing::kLongWait);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  // Every other rank raises (rank 0 receives from rank 3 in the ring, rank 2 sends to it over
  // shared memory); a rank that waited for rank 3 names it, the others relay its abort.
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(errors[r].empty()) << "rank " << r;
  bool named = false;
  for (int r = 0; r < 3; ++r) named |= errors[r].find("rank 3 has died") != std::string::npos;
  EXPECT_TRUE(named) << errors[0] << "\n" << errors[1] << "\n" << errors[2];
}

// ------------------------------------------------------------------------------------------------
// Every schedule generator across hosts

float input_value(int rank, size_t i) { return static_cast<float>((rank * 7 + i * 3) % 23); }

using Case = std::tuple<std::string, std::string>;  // algorithm, host letters
class MixedScheduleExecution : public ::testing::TestWithParam<Case> {};

// Exact (small integers: every summation order gives the same result) and bitwise identical,
// once with several steps in flight and once in lockstep.
TEST_P(MixedScheduleExecution, ExactAndBitwiseIdentical) {
  const auto& [algo, letters] = GetParam();
  const int n = static_cast<int>(letters.size());
  const size_t numel = 20011;
  PlannerConfig cfg;
  cfg.algo = *algorithm_from_name(algo);
  cfg.straggler = Straggler::of_rank(1);
  cfg.max_staging_bytes = 8192;
  Planner planner(n, cfg);
  InMemoryRendezvous rdv;
  std::vector<std::vector<float>> out(n);
  run_ranks(n, [&](int r) {
    auto t = mixed_maker(letters)(rdv, r, n);
    for (size_t lookahead : {Executor::kDefaultLookahead, size_t{1}}) {
      Executor ex(*t, lookahead);
      std::vector<float> work(numel);
      for (size_t i = 0; i < numel; ++i) work[i] = input_value(r, i);
      CollectiveSpec spec;
      spec.seq = lookahead == 1 ? 1 : 0;
      spec.numel = numel;
      const PlanChoice choice = planner.choose(numel * sizeof(float), 1);
      ex.run(*planner.lower(r, choice, numel, sizeof(float), false), spec, work.data(),
             std::chrono::seconds(60));
      if (lookahead != 1) {
        out[r] = work;
      } else {
        ASSERT_EQ(0, std::memcmp(work.data(), out[r].data(), numel * sizeof(float)))
            << algo << ": lockstep differs on rank " << r;
      }
    }
  });
  for (size_t i = 0; i < numel; ++i) {
    float ref = 0;
    for (int r = 0; r < n; ++r) ref += input_value(r, i);
    ASSERT_EQ(out[0][i], ref) << algo << " element " << i;
  }
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(0, std::memcmp(out[r].data(), out[0].data(), numel * sizeof(float)))
        << algo << ": rank " << r << " differs from rank 0";
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param);
}

INSTANTIATE_TEST_SUITE_P(AllGenerators, MixedScheduleExecution,
                         ::testing::Combine(::testing::Values("ring", "rhd", "direct", "bcast",
                                                              "stragglar", "optcc",
                                                              "stragglar_direct"),
                                            ::testing::Values("AABB", "ABABA")),
                         case_name);

}  // namespace
}  // namespace stragg
