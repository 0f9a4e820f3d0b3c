#include <gtest/gtest.h>

#include "core/generators.h"
#include "core/ir.h"
#include "core/verifier.h"

using namespace stragg::core;

TEST(IR, ChunkRangesCoverBufferProportionally) {
  Schedule s = Schedule::make("t", Collective::kAllReduce, 2, 3);
  s.chunk_weights = {1.0, 2.0, 1.0};
  auto r = s.chunk_ranges(10);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].offset, 0);
  EXPECT_EQ(r[0].length + r[1].length + r[2].length, 10);
  EXPECT_EQ(r[1].offset, r[0].length);
  EXPECT_EQ(r[2].offset, r[0].length + r[1].length);
  EXPECT_EQ(r[1].length, 5);
  // Fewer elements than chunks: still contiguous and complete.
  auto z = s.chunk_ranges(2);
  int64_t total = 0;
  for (auto& x : z) total += x.length;
  EXPECT_EQ(total, 2);
}

TEST(IR, OnePortRuleIsEnforced) {
  Schedule s = Schedule::make("t", Collective::kAllReduce, 3, 1);
  Step& st = s.add_step(0);
  st.transfers.push_back({0, 1, 0, 1, RecvAction::kReduce});
  st.transfers.push_back({0, 2, 0, 1, RecvAction::kReduce});
  EXPECT_THROW(s.validate_structure(), ScheduleError);
  VerifyResult v = verify(s);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.error.find("one-port"), std::string::npos) << v.error;
}

TEST(IR, PreArrivalStepMustNotTouchStraggler) {
  Schedule s = Schedule::make("t", Collective::kAllReduce, 3, 1);
  s.stragglers = {2};
  Step& st = s.add_step(0, /*pre_arrival=*/true);
  st.transfers.push_back({0, 2, 0, 1, RecvAction::kReduce});
  EXPECT_THROW(s.validate_structure(), ScheduleError);
}

TEST(IR, RoundRuleForbidsForwardingWithinARound) {
  Schedule s = Schedule::make("t", Collective::kAllReduce, 3, 1);
  s.add_step(0).transfers.push_back({0, 1, 0, 1, RecvAction::kReduce});
  s.add_step(0, false, /*same_round=*/true).transfers.push_back({1, 2, 0, 1, RecvAction::kReduce});
  EXPECT_THROW(s.validate_structure(), ScheduleError);
}

TEST(IR, RankProgramListsSendsAndReceives) {
  Schedule s = ring_allreduce(4);
  auto prog = s.rank_program(2);
  ASSERT_EQ(prog.size(), 6u);
  for (const auto& op : prog) {
    EXPECT_TRUE(op.has_send);
    EXPECT_EQ(op.send_peer, 3);
    EXPECT_TRUE(op.has_recv);
    EXPECT_EQ(op.recv_peer, 1);
  }
  EXPECT_EQ(prog[0].recv_action, RecvAction::kReduce);
  EXPECT_EQ(prog[5].recv_action, RecvAction::kCopy);
}

TEST(IR, JsonRoundTrip) {
  for (Schedule s : {ring_allreduce(5), rhd_allreduce(6), direct_allreduce(4)}) {
    s.chunk_weights[0] = 2.5;
    std::string j = to_json(s);
    Schedule t = schedule_from_json(j);
    EXPECT_EQ(t.n, s.n);
    EXPECT_EQ(t.num_chunks, s.num_chunks);
    EXPECT_EQ(t.num_rounds(), s.num_rounds());
    EXPECT_EQ(t.chunk_weights, s.chunk_weights);
    EXPECT_EQ(t.phases, s.phases);
    ASSERT_EQ(t.steps.size(), s.steps.size());
    for (size_t i = 0; i < s.steps.size(); ++i) {
      EXPECT_EQ(t.steps[i].round, s.steps[i].round);
      EXPECT_EQ(t.steps[i].transfers, s.steps[i].transfers);
    }
    EXPECT_EQ(to_json(t), j);
  }
  EXPECT_THROW(schedule_from_json("{\"format\": \"nope\"}"), ScheduleError);
  EXPECT_THROW(schedule_from_json("not json"), ScheduleError);
}

TEST(IR, RelabelMovesStraggler) {
  auto perm = straggler_permutation(5, 1);
  EXPECT_EQ(perm, (std::vector<int>{0, 2, 3, 4, 1}));
  Schedule s = ring_allreduce(5);
  s.stragglers = {4};
  Schedule t = relabel(s, perm);
  EXPECT_EQ(t.stragglers, std::vector<int>{1});
  EXPECT_TRUE(verify(t).ok);
  EXPECT_THROW(relabel(s, {0, 0, 1, 2, 3}), ScheduleError);
}

TEST(IR, TablePrinterShowsEveryRank) {
  std::string t = to_table(ring_allreduce(3));
  EXPECT_NE(t.find("r2"), std::string::npos);
  EXPECT_NE(t.find(">1:c2"), std::string::npos);
  EXPECT_NE(t.find("<0:c2+"), std::string::npos);
}

TEST(Verifier, DetectsDoubleCountingAndMissingData) {
  Schedule s = Schedule::make("bad", Collective::kAllReduce, 2, 1);
  s.add_step(0).transfers.push_back({0, 1, 0, 1, RecvAction::kReduce});
  s.add_step(0).transfers.push_back({0, 1, 0, 1, RecvAction::kReduce});
  VerifyResult v = verify(s);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.error.find("twice"), std::string::npos) << v.error;

  Schedule m = Schedule::make("bad", Collective::kAllReduce, 2, 1);
  m.add_step(0).transfers.push_back({0, 1, 0, 1, RecvAction::kReduce});
  v = verify(m);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.error.find("lacks"), std::string::npos) << v.error;

  Schedule g = Schedule::make("bad", Collective::kAllGather, 3, 3);
  g.chunk_owner = {0, 1, 2};
  g.add_step(0).transfers.push_back({1, 2, 0, 1, RecvAction::kCopy});  // rank 1 lacks chunk 0
  v = verify(g);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.error.find("holds no data"), std::string::npos) << v.error;
}
