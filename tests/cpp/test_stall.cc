// The stall diagnosis without transports: published progress and liveness in, words out. The
// transports' part (what they publish and judge) is tested with real processes in
// test_shm_transport.cc / test_tcp_transport.cc.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/stall.h"
#include "transport/tcp/control.h"
#include "transport/tcp/heartbeat.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

Progress at(int64_t seq, int32_t step, std::vector<int> awaiting = {}, int64_t call = -1) {
  Progress p;
  p.seq = seq;
  p.call = call;
  p.step = step;
  p.awaiting = std::move(awaiting);
  return p;
}

// A Ring of 4 in all_reduce #5 (wire seq 9), every rank waiting for its left neighbour.
std::vector<PeerStatus> ring_of_four() {
  std::vector<PeerStatus> peers(4);
  for (int r = 0; r < 4; ++r) peers[r].progress = at(9, 3, {(r + 3) % 4}, 5);
  return peers;
}

StallFacts facts(int rank, std::vector<PeerStatus> peers) {
  StallFacts f;
  f.rank = rank;
  f.spec.seq = 9;
  f.spec.call = 5;
  f.doing = "in step 3";
  f.awaited = {(rank + 3) % 4};
  f.peers = std::move(peers);
  return f;
}

TEST(StallDiagnosis, EverySurvivorNamesTheStoppedRankNotTheOneItWaitsFor) {
  auto peers = ring_of_four();
  peers[3].progress.step = 2;
  peers[3].liveness = Liveness::Stopped;
  peers[3].evidence = "its process 42 is stopped: SIGSTOP or a debugger";
  for (int r : {0, 1, 2}) {
    const std::string m = diagnose_stall(facts(r, peers));
    EXPECT_EQ(m.find("rank 3 stopped responding (its process 42 is stopped: SIGSTOP or a debugger) "
                     "in step 2 of all_reduce #5"),
              0u)
        << m;
    EXPECT_NE(m.find("; rank " + std::to_string(r) + " was in step 3, waiting for rank " +
                     std::to_string((r + 3) % 4)),
              std::string::npos)
        << m;
  }
}

TEST(StallDiagnosis, ARankThatHasNotCalledTheCollectiveIsNamedWithItsLastCall) {
  auto peers = ring_of_four();
  peers[2].progress = at(8, Progress::kFinished, {}, 4);
  const std::string m = diagnose_stall(facts(0, peers));
  EXPECT_EQ(m.find("rank 2 has not called all_reduce #5 (its last was #4)"), 0u) << m;
  peers[2].progress = Progress{};
  const std::string never = diagnose_stall(facts(1, peers));
  EXPECT_NE(never.find("rank 2 has not called all_reduce #5 (it has not called any collective"),
            std::string::npos)
      << never;
}

// Recursive doubling of 4, rank 3 stopped during #4 after its first exchange: ranks 0 and 2
// finished #4, rank 1 still waits for rank 3 in step 1 of #4, and rank 0 waits for rank 1 in #5.
// Rank 1 is held up, not the cause: the search follows its wait to rank 3.
TEST(StallDiagnosis, ARankStillWaitingInAnEarlierCollectiveIsFollowedNotBlamed) {
  auto peers = ring_of_four();
  peers[1].progress = at(8, 1, {3}, 4);
  peers[3].progress = at(8, 1, {1}, 4);
  peers[3].liveness = Liveness::Stopped;
  peers[3].evidence = "its process 42 is stopped: SIGSTOP or a debugger";
  StallFacts f = facts(0, peers);
  f.awaited = {1};
  const std::string m = diagnose_stall(f);
  EXPECT_EQ(m.find("rank 3 has not called all_reduce #5 (its last was #4) and stopped responding "
                   "(its process 42 is stopped: SIGSTOP or a debugger)"),
            0u)
      << m;
  // Waiting for nobody in its earlier collective: it is the one that has not called this one.
  peers[3].liveness = Liveness::Alive;
  peers[1].progress = at(8, 1, {}, 4);
  f = facts(0, peers);
  f.awaited = {1};
  EXPECT_EQ(diagnose_stall(f).find("rank 1 has not called all_reduce #5 (its last was #4)"), 0u);
}

TEST(StallDiagnosis, AStoppedRankThatNeverArrivedIsNamedBothWays) {
  auto peers = ring_of_four();
  peers[1].progress = at(8, Progress::kFinished, {}, 4);
  peers[1].liveness = Liveness::Stopped;
  peers[1].evidence = "no heartbeat for 5.0 s";
  const std::string m = diagnose_stall(facts(3, peers));
  EXPECT_NE(m.find("rank 1 has not called all_reduce #5 (its last was #4) and stopped responding "
                   "(no heartbeat for 5.0 s)"),
            std::string::npos)
      << m;
}

TEST(StallDiagnosis, ACutLinkSeenFromBothEndsIsNamedOnce) {
  auto view = ring_of_four();
  view[3].cannot_hear = {2};
  view[2].cannot_hear = {3};
  view[2].progress.awaiting = {1, 3};  // rank 2 also waits for rank 3 (e.g. OptCC's extra link)
  StallFacts f = facts(0, view);
  f.awaited = {2, 3};  // the search reaches both ends
  const std::string m = diagnose_stall(f);
  const std::string link = "the connection between ranks 2 and 3 is down";
  EXPECT_EQ(m.find(link + " (ranks 2 and 3 hear nothing from each other; both are alive)"), 0u)
      << m;
  EXPECT_EQ(m.find(link, 1), std::string::npos) << "named twice: " << m;
}

TEST(StallDiagnosis, ACutLinkIsNamedByTheRanksAtItsEndsAndByTheOthers) {
  // The link between ranks 2 and 3 is down: rank 3 does not hear rank 2 and says so in its
  // beats; rank 2 likewise. Ranks 0 and 1 hear everybody.
  auto view = ring_of_four();
  view[3].cannot_hear = {2};
  view[2].cannot_hear = {3};
  for (int r : {0, 1}) {
    const std::string m = diagnose_stall(facts(r, view));
    EXPECT_EQ(m.find("the connection between ranks 2 and 3 is down (rank 3 hears nothing from "
                     "rank 2, which is alive)"),
              0u)
        << "rank " << r << ": " << m;
  }
  // The ends judge the other end Unreachable themselves.
  auto at3 = view;
  at3[2].liveness = Liveness::Unreachable;
  at3[2].evidence = "rank 2 is alive: ranks 0, 1 still hear from it";
  const std::string m3 = diagnose_stall(facts(3, at3));
  EXPECT_EQ(m3.find("the connection between ranks 2 and 3 is down (rank 2 is alive"), 0u) << m3;
  auto at2 = view;
  at2[3].liveness = Liveness::Unreachable;
  at2[3].evidence = "rank 3 is alive";
  StallFacts f2 = facts(2, at2);
  f2.awaited = {1, 3};  // still sending to 3
  const std::string m2 = diagnose_stall(f2);
  EXPECT_EQ(m2.find("the connection between ranks 2 and 3 is down (rank 3 is alive)"), 0u) << m2;
}

TEST(StallDiagnosis, DeadAndFinishedRanks) {
  auto peers = ring_of_four();
  peers[3].liveness = Liveness::Dead;
  EXPECT_EQ(diagnose_stall(facts(1, peers)).find("rank 3 has died (process or connection gone)"),
            0u);
  peers = ring_of_four();
  peers[0].progress = at(9, Progress::kFinished, {}, 5);
  const std::string m = diagnose_stall(facts(1, peers));
  EXPECT_EQ(m.find("rank 0 finished all_reduce #5 but its data for the waiting ranks did not "
                   "arrive"),
            0u)
      << m;
}

TEST(StallDiagnosis, WithoutARootTheWaitForChainIsListed) {
  const std::string m = diagnose_stall(facts(1, ring_of_four()));
  EXPECT_EQ(m,
            "no rank made progress although every rank is alive and in all_reduce #5 (rank 0 "
            "waits for rank 3, rank 3 waits for rank 2, rank 2 waits for rank 1); rank 1 was in "
            "step 3, waiting for rank 0");
}

TEST(StallDiagnosis, RootsOutsideTheWaitForGraphAreStillFound) {
  // Rank 0 waits for rank 3 but published nothing about it; rank 2 never arrived.
  auto peers = ring_of_four();
  peers[3].progress.awaiting.clear();
  peers[2].progress = at(7, Progress::kFinished, {}, 3);
  const std::string m = diagnose_stall(facts(0, peers));
  EXPECT_EQ(m.find("rank 2 has not called all_reduce #5 (its last was #3)"), 0u) << m;
}

TEST(StallDiagnosis, LabelsCountCallsLikeTheUser) {
  CollectiveSpec spec;
  spec.seq = 12;
  EXPECT_EQ(collective_label(spec), "all_reduce #12");
  spec.call = 7;
  EXPECT_EQ(collective_label(spec), "all_reduce #7");
  spec.op_name = "profiler exchange";
  spec.internal = true;
  EXPECT_EQ(collective_label(spec), "profiler exchange at call #7");
  EXPECT_EQ(collective_prefix(2, spec), "stragg: rank 2: profiler exchange at call #7");
  spec.op_name = "barrier";
  spec.between_calls = true;
  EXPECT_EQ(collective_label(spec), "barrier after call #7");
  spec.call = -1;
  EXPECT_EQ(collective_label(spec), "barrier before the first call");
}

// ------------------------------------------------------------------------------------------------
// TCP heartbeats: what silence means

std::vector<tcp::PeerView> views(Clock::time_point now, int n) {
  return std::vector<tcp::PeerView>(n, tcp::PeerView{now, false, {}});
}

TEST(Heartbeat, SilenceWithAWitnessIsALinkDownWithoutOneAStop) {
  const auto now = Clock::now();
  auto v = views(now, 4);
  v[3].last_heard = now - std::chrono::seconds(5);  // rank 0 hears nothing from rank 3
  EXPECT_EQ(tcp::silent_peers(v, 0, now), (std::vector<int>{3}));
  std::string why;
  EXPECT_EQ(tcp::judge_peer(v, 0, 3, now, &why), Liveness::Unreachable);
  EXPECT_EQ(why,
            "rank 3 is alive: ranks 1, 2 still hear from it, rank 0 has heard nothing for 5.0 s");
  // Ranks 1 and 2 report that they do not hear rank 3 either: it stopped.
  v[1].cannot_hear = {3};
  v[2].cannot_hear = {0, 3};
  EXPECT_EQ(tcp::judge_peer(v, 0, 3, now, &why), Liveness::Stopped);
  EXPECT_EQ(why.find("no heartbeat for 5.0 s"), 0u) << why;
  // A witness that is itself silent does not count.
  v[2].cannot_hear = {};
  v[2].last_heard = now - std::chrono::seconds(3);
  EXPECT_EQ(tcp::judge_peer(v, 0, 3, now, &why), Liveness::Stopped);
  // Two ranks: nobody to ask.
  auto two = views(now, 2);
  two[1].last_heard = now - std::chrono::seconds(3);
  EXPECT_EQ(tcp::judge_peer(two, 0, 1, now, &why), Liveness::Stopped);
}

TEST(Heartbeat, RecentAndDeadPeers) {
  const auto now = Clock::now();
  auto v = views(now, 3);
  v[1].last_heard = now - tcp::kSilentAfter / 2;
  std::string why;
  EXPECT_EQ(tcp::judge_peer(v, 0, 1, now, &why), Liveness::Alive);
  v[2].dead = true;
  v[2].last_heard = now - std::chrono::seconds(10);
  EXPECT_EQ(tcp::judge_peer(v, 0, 2, now, &why), Liveness::Dead);
  EXPECT_TRUE(tcp::silent_peers(v, 0, now).empty());
}

TEST(Heartbeat, BeatsRoundTripAndMalformedOnesAreRejected) {
  tcp::Beat b;
  b.progress = at(41, 6, {1, 5}, 17);
  b.cannot_hear = {3};
  const std::string wire = tcp::encode_beat(b);
  tcp::Beat back;
  ASSERT_TRUE(tcp::decode_beat(reinterpret_cast<const uint8_t*>(wire.data()), wire.size(), &back));
  EXPECT_EQ(back.progress.seq, 41);
  EXPECT_EQ(back.progress.call, 17);
  EXPECT_EQ(back.progress.step, 6);
  EXPECT_EQ(back.progress.awaiting, (std::vector<int>{1, 5}));
  EXPECT_EQ(back.cannot_hear, (std::vector<int>{3}));
  EXPECT_FALSE(
      tcp::decode_beat(reinterpret_cast<const uint8_t*>(wire.data()), wire.size() - 1, &back));
  EXPECT_FALSE(tcp::decode_beat(reinterpret_cast<const uint8_t*>(wire.data()), 3, &back));
}

}  // namespace
}  // namespace stragg
