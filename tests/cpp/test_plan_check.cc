// The measured check of the planner's moves (plan/plan_check.h): a move that makes the calls
// slower than before it is undone and not tried again for a while.
#include <gtest/gtest.h>

#include "plan/plan_check.h"

namespace stragg {
namespace {

PlanMode straggler(int s) {
  PlanMode m;
  m.straggler = s;
  return m;
}

PlanMode degraded(int rank, double factor) {
  PlanMode m;
  m.degraded = {{rank, factor}};
  return m;
}

TEST(PlanCheck, AMoveThatPaysIsKept) {
  PlanCheck c;
  EXPECT_EQ(c.update(PlanMode{}, 0.60, 1, 16).straggler, -1);
  EXPECT_EQ(c.update(straggler(7), 0.60, 2, 32).straggler, 7);  // tried
  EXPECT_TRUE(c.in_trial());
  EXPECT_EQ(c.update(straggler(7), 0.52, 3, 48).straggler, 7);  // faster: kept
  EXPECT_FALSE(c.in_trial());
  ASSERT_EQ(c.records().size(), 1u);
  const PlanCheckRecord r = c.records()[0];
  EXPECT_TRUE(r.kept);
  EXPECT_EQ(r.change, "straggler 7");
  EXPECT_EQ(r.call, 48u);
  EXPECT_DOUBLE_EQ(r.period_s, 0.52);
  EXPECT_DOUBLE_EQ(r.baseline_s, 0.60);
  EXPECT_EQ(c.update(straggler(7), 0.70, 4, 64).straggler, 7);  // no longer on trial
}

TEST(PlanCheck, AMoveThatMakesTheCallsSlowerIsUndoneAndBacksOff) {
  PlanCheck c;
  c.update(PlanMode{}, 0.60, 1, 16);
  EXPECT_EQ(c.update(straggler(7), 0.60, 2, 32).straggler, 7);
  EXPECT_EQ(c.update(straggler(7), 0.65, 3, 48).straggler, -1);  // slower: undone
  ASSERT_EQ(c.records().size(), 1u);
  EXPECT_FALSE(c.records()[0].kept);
  // The profiler still proposes rank 7: vetoed for 4 exchanges (3..6), tried again at 7.
  for (uint64_t e = 4; e < 7; ++e) EXPECT_EQ(c.update(straggler(7), 0.60, e, 16 * e).straggler, -1);
  EXPECT_EQ(c.update(straggler(7), 0.60, 7, 112).straggler, 7);
  // Slower again: the veto doubles (8 exchanges from 8).
  EXPECT_EQ(c.update(straggler(7), 0.61, 8, 128).straggler, -1);
  for (uint64_t e = 9; e < 16; ++e) EXPECT_EQ(c.update(straggler(7), 0.60, e, 16 * e).straggler, -1);
  EXPECT_EQ(c.update(straggler(7), 0.60, 16, 256).straggler, 7);
  EXPECT_EQ(c.records().size(), 2u);
  // Another straggler is not covered by the veto on rank 7.
  PlanCheck d;
  d.update(PlanMode{}, 0.60, 1, 16);
  d.update(straggler(7), 0.60, 2, 32);
  d.update(straggler(7), 0.65, 3, 48);
  EXPECT_EQ(d.update(straggler(2), 0.60, 4, 64).straggler, 2);
}

TEST(PlanCheck, MovesBackToThePlainPlanAndUnknownTimesNeedNoTrial) {
  PlanCheck c;
  c.update(PlanMode{}, 0.60, 1, 16);
  c.update(straggler(3), 0.60, 2, 32);
  c.update(straggler(3), 0.50, 3, 48);  // kept
  EXPECT_TRUE(c.update(PlanMode{}, 0.50, 4, 64).plain());
  EXPECT_FALSE(c.in_trial());
  EXPECT_EQ(c.update(straggler(3), -1, 5, 80).straggler, 3);  // no time measured: no trial
  EXPECT_FALSE(c.in_trial());
  EXPECT_EQ(c.records().size(), 1u);
}

TEST(PlanCheck, DegradedRanksAreCheckedLikeAStraggler) {
  PlanCheck c;
  c.update(PlanMode{}, 0.90, 1, 16);
  EXPECT_EQ(c.update(degraded(5, 2.0), 0.90, 2, 32).degraded.size(), 1u);
  // A new factor for the same rank is no new move: it follows the probe without a trial.
  EXPECT_EQ(c.update(degraded(5, 1.95), 0.95, 3, 48).degraded.size(), 0u);  // slower: undone
  EXPECT_EQ(c.records().back().change, "degraded 5 (l = 2)");
  EXPECT_TRUE(c.update(degraded(5, 1.95), 0.90, 4, 64).degraded.empty());  // vetoed
  PlanCheck d;
  d.update(PlanMode{}, 0.90, 1, 16);
  d.update(degraded(5, 2.0), 0.90, 2, 32);
  d.update(degraded(5, 2.0), 0.60, 3, 48);  // kept
  const PlanMode& m = d.update(degraded(5, 1.95), 0.61, 4, 64);
  ASSERT_EQ(m.degraded.size(), 1u);
  EXPECT_DOUBLE_EQ(m.degraded[0].factor, 1.95);
  EXPECT_FALSE(d.in_trial());
}

TEST(PlanCheck, BothAtOnceAreUndoneTogether) {
  PlanCheck c;
  c.update(PlanMode{}, 0.90, 1, 16);
  PlanMode both = straggler(7);
  both.degraded = {{5, 2.0}};
  EXPECT_EQ(c.update(both, 0.90, 2, 32).describe(), "straggler 7, degraded 5 (l = 2)");
  EXPECT_TRUE(c.update(both, 0.95, 3, 48).plain());
  // Each part alone is vetoed as well.
  EXPECT_TRUE(c.update(straggler(7), 0.90, 4, 64).plain());
  EXPECT_TRUE(c.update(degraded(5, 2.0), 0.90, 5, 80).plain());
}

TEST(PlanCheck, AFailedLargerSetGoesBackToTheSetThatPassed) {
  // 16 hosts, host 5 at half rate: OptCC for rank 5 paid; a later probe also named 6 and 12,
  // which made the calls slower. Undone, the group runs OptCC for rank 5 again, not Ring.
  PlanCheck c;
  c.update(PlanMode{}, 2.2, 1, 16);
  c.update(degraded(5, 1.9), 2.2, 2, 32);
  c.update(degraded(5, 1.9), 1.74, 3, 48);  // kept
  PlanMode three;
  three.degraded = {{5, 1.9}, {6, 1.1}, {12, 1.07}};
  EXPECT_EQ(c.update(three, 1.74, 4, 64).degraded.size(), 3u);  // tried
  const PlanMode& back = c.update(three, 2.1, 5, 80);            // slower: undone
  EXPECT_EQ(back.describe(), "degraded 5 (l = 1.9)");
  EXPECT_FALSE(c.records().back().kept);
  // While the larger set is vetoed, the probes' proposal keeps rank 5 at its latest factor.
  three.degraded[0].factor = 1.95;
  const PlanMode& still = c.update(three, 1.74, 6, 96);
  EXPECT_EQ(still.describe(), "degraded 5 (l = 1.95)");
  EXPECT_FALSE(c.in_trial());
  // With a straggler: the failed degraded set goes back to the mode before it.
  PlanCheck d;
  PlanMode both = straggler(7);
  both.degraded = {{5, 2.05}};
  d.update(PlanMode{}, 2.3, 1, 16);
  d.update(both, 2.3, 2, 32);
  d.update(both, 2.1, 3, 48);  // kept
  PlanMode more = both;
  more.degraded.push_back({10, 1.15});
  d.update(more, 2.1, 4, 64);
  EXPECT_EQ(d.update(more, 2.4, 5, 80).describe(), "straggler 7, degraded 5 (l = 2.05)");
  EXPECT_EQ(d.update(more, 2.1, 6, 96).describe(), "straggler 7, degraded 5 (l = 2.05)");
}

}  // namespace
}  // namespace stragg
