// The measured check of the planner's moves (plan/plan_check.h): a move is a trial on the same
// calls as what it would replace (and the baseline); the fastest arm runs, a losing move is not
// tried again for a while. Times here are a call's cost (from the previous call's end).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

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

// The calls of the trial `c` is about to run, each taking time(mode of its arm, call index).
std::vector<CheckedCall> trial(const PlanCheck& c,
                               const std::function<double(const PlanMode&, size_t)>& time,
                               int64_t bytes = 1 << 20) {
  std::vector<CheckedCall> calls;
  for (size_t i = 0; i < c.trial_calls(); ++i) {
    CheckedCall k;
    k.arm = c.arm_of(i);
    k.after_same_arm = i > 0 && c.arm_of(i - 1) == k.arm;
    k.bytes = bytes;
    k.cost_s = time(c.arm_mode(k.arm), i);
    calls.push_back(k);
  }
  return calls;
}

// Per mode description, a fixed time per call.
std::function<double(const PlanMode&, size_t)> times(std::map<std::string, double> t) {
  return [t](const PlanMode& m, size_t) { return t.at(m.describe()); };
}

const std::vector<CheckedCall> kNone;

TEST(PlanCheck, AMoveThatPaysIsKept) {
  PlanCheck c;
  EXPECT_EQ(c.update(PlanMode{}, kNone, 1, 16).straggler, -1);
  EXPECT_FALSE(c.in_trial());
  // Rank 7 proposed: the next batch is a trial of it against the plain plan, 6 calls each.
  EXPECT_EQ(c.update(straggler(7), kNone, 2, 32).straggler, -1);
  ASSERT_TRUE(c.in_trial());
  ASSERT_EQ(c.arms().size(), 2u);
  EXPECT_EQ(c.arm_mode(0).describe(), "straggler 7");
  EXPECT_EQ(c.arm_mode(1).describe(), "plain");
  EXPECT_EQ(c.trial_calls(), 12u);
  const auto calls = trial(c, times({{"straggler 7", 0.52}, {"plain", 0.60}}));
  EXPECT_EQ(c.update(straggler(7), calls, 3, 40).straggler, 7);  // faster: kept
  EXPECT_FALSE(c.in_trial());
  ASSERT_EQ(c.records().size(), 1u);
  const PlanCheckRecord r = c.records()[0];
  EXPECT_TRUE(r.kept);
  EXPECT_EQ(r.change, "straggler 7");
  EXPECT_EQ(r.chosen, "straggler 7");
  EXPECT_EQ(r.call, 40u);
  EXPECT_DOUBLE_EQ(r.period_s, 0.52);
  EXPECT_DOUBLE_EQ(r.baseline_s, 0.60);
  ASSERT_EQ(r.arms.size(), 2u);
  EXPECT_EQ(r.arms[0].calls, 6u);
  EXPECT_EQ(r.arms[1].calls, 6u);
  EXPECT_EQ(c.update(straggler(7), kNone, 4, 56).straggler, 7);  // no new trial
  EXPECT_FALSE(c.in_trial());
}

TEST(PlanCheck, AMoveThatMakesTheCallsSlowerIsUndoneAndBacksOff) {
  PlanCheck c;
  c.update(PlanMode{}, kNone, 1, 16);
  c.update(straggler(7), kNone, 2, 32);
  const auto slower = times({{"straggler 7", 0.65}, {"plain", 0.60}});
  EXPECT_EQ(c.update(straggler(7), trial(c, slower), 3, 40).straggler, -1);  // undone
  ASSERT_EQ(c.records().size(), 1u);
  EXPECT_FALSE(c.records()[0].kept);
  EXPECT_EQ(c.records()[0].chosen, "plain");
  // The profiler still proposes rank 7: vetoed for 4 exchanges (3..6), tried again at 7.
  for (uint64_t e = 4; e < 7; ++e) {
    EXPECT_EQ(c.update(straggler(7), kNone, e, 16 * e).straggler, -1);
    EXPECT_FALSE(c.in_trial());
  }
  c.update(straggler(7), kNone, 7, 112);
  ASSERT_TRUE(c.in_trial());
  // Slower again: the veto doubles (8 exchanges from 8).
  EXPECT_EQ(c.update(straggler(7), trial(c, slower), 8, 120).straggler, -1);
  for (uint64_t e = 9; e < 16; ++e) {
    c.update(straggler(7), kNone, e, 16 * e);
    EXPECT_FALSE(c.in_trial()) << e;
  }
  c.update(straggler(7), kNone, 16, 256);
  EXPECT_TRUE(c.in_trial());
  EXPECT_EQ(c.records().size(), 2u);
  // Another straggler is not covered by the veto on rank 7.
  PlanCheck d;
  d.update(straggler(7), kNone, 2, 32);
  d.update(straggler(7), trial(d, slower), 3, 40);
  d.update(straggler(2), kNone, 4, 64);
  EXPECT_TRUE(d.in_trial());
  EXPECT_EQ(d.arm_mode(0).describe(), "straggler 2");
}

TEST(PlanCheck, WithinTheToleranceTheProposalWins) {
  PlanCheck c;
  c.update(straggler(3), kNone, 1, 16);
  c.update(straggler(3), trial(c, times({{"straggler 3", 0.605}, {"plain", 0.600}})), 2, 24);
  EXPECT_EQ(c.current().straggler, 3);
  EXPECT_TRUE(c.records().back().kept);
}

TEST(PlanCheck, MovesBackToTheBaselineNeedNoTrial) {
  PlanCheck c;
  c.update(straggler(3), kNone, 1, 16);
  c.update(straggler(3), trial(c, times({{"straggler 3", 0.5}, {"plain", 0.6}})), 2, 24);
  EXPECT_EQ(c.current().straggler, 3);
  EXPECT_TRUE(c.update(PlanMode{}, kNone, 3, 40).plain());
  EXPECT_FALSE(c.in_trial());
  EXPECT_EQ(c.records().size(), 1u);
}

TEST(PlanCheck, ATrialWhoseProposalNeverRanChangesNothing) {
  PlanCheck c;
  c.update(straggler(3), kNone, 1, 16);
  std::vector<CheckedCall> calls = trial(c, times({{"straggler 3", 0.5}, {"plain", 0.6}}));
  calls.resize(1);  // the batch was cut after the first call
  calls[0].arm = 1;
  EXPECT_EQ(c.update(straggler(3), calls, 2, 17).straggler, -1);
  EXPECT_EQ(c.records().size(), 0u);
  EXPECT_TRUE(c.in_trial());  // proposed again: a new trial
}

TEST(PlanCheck, DegradedRanksAreCheckedLikeAStraggler) {
  PlanCheck c;
  c.update(degraded(5, 2.0), kNone, 1, 16);
  ASSERT_TRUE(c.in_trial());
  EXPECT_EQ(c.update(degraded(5, 1.95),
                     trial(c, times({{"degraded 5 (l = 2)", 0.95}, {"plain", 0.90}})), 2, 24)
                .degraded.size(),
            0u);  // slower: undone
  EXPECT_EQ(c.records().back().change, "degraded 5 (l = 2)");
  EXPECT_TRUE(c.update(degraded(5, 1.95), kNone, 3, 40).degraded.empty());  // vetoed
  EXPECT_FALSE(c.in_trial());
  // A new factor for a kept rank is no new move: it follows the probe without a trial.
  PlanCheck d;
  d.update(degraded(5, 2.0), kNone, 1, 16);
  d.update(degraded(5, 2.0), trial(d, times({{"degraded 5 (l = 2)", 0.6}, {"plain", 0.9}})), 2,
           24);
  const PlanMode& m = d.update(degraded(5, 1.95), kNone, 3, 40);
  ASSERT_EQ(m.degraded.size(), 1u);
  EXPECT_DOUBLE_EQ(m.degraded[0].factor, 1.95);
  EXPECT_FALSE(d.in_trial());
}

TEST(PlanCheck, AStragglerAndDegradedRanksTogetherAreMeasuredEachAlone) {
  // Which detector fired first does not decide: the straggler was adopted (it beat the plain
  // plan), then a probe found a slow host; the trial measures both together and each alone.
  PlanCheck c;
  c.update(straggler(7), kNone, 1, 16);
  c.update(straggler(7), trial(c, times({{"straggler 7", 0.9}, {"plain", 1.0}})), 2, 24);
  ASSERT_EQ(c.current().straggler, 7);
  PlanMode both = straggler(7);
  both.degraded = {{5, 2.0}};
  c.update(both, kNone, 3, 40);
  ASSERT_TRUE(c.in_trial());
  // The plain plan is no arm: the straggler's mode beat it 1 exchange ago.
  ASSERT_EQ(c.arms().size(), 3u);
  EXPECT_EQ(c.arm_mode(0).describe(), "straggler 7, degraded 5 (l = 2)");
  EXPECT_EQ(c.arm_mode(1).describe(), "straggler 7");
  EXPECT_EQ(c.arm_mode(2).describe(), "degraded 5 (l = 2)");
  EXPECT_EQ(c.trial_calls(), 12u);
  const auto t = times({{"straggler 7, degraded 5 (l = 2)", 0.85},
                        {"straggler 7", 0.9},
                        {"plain", 1.0},
                        {"degraded 5 (l = 2)", 0.7}});
  EXPECT_EQ(c.update(both, trial(c, t), 4, 56).describe(), "degraded 5 (l = 2)");
  EXPECT_FALSE(c.records().back().kept);
  // The straggler, which the winner lacks, is vetoed; the degraded rank passed.
  EXPECT_EQ(c.update(both, kNone, 5, 72).describe(), "degraded 5 (l = 2)");
  EXPECT_FALSE(c.in_trial());
  // Long after the last comparison with the plain plan, it is an arm again.
  PlanCheck d;
  d.update(straggler(7), kNone, 1, 16);
  d.update(straggler(7), trial(d, times({{"straggler 7", 0.9}, {"plain", 1.0}})), 2, 24);
  d.update(both, kNone, 2 + PlanCheck::kBaselineFresh, 400);
  ASSERT_EQ(d.arms().size(), 4u);
  EXPECT_EQ(d.arm_mode(2).describe(), "plain");
  EXPECT_EQ(d.trial_calls(), 16u);
}

TEST(PlanCheck, AFailedLargerSetGoesBackToTheSetThatPassed) {
  // 16 hosts, host 5 at half rate: OptCC for rank 5 paid; a later probe also named 6 and 12,
  // which made the calls slower. Undone, the group runs OptCC for rank 5 again, not Ring.
  PlanCheck c;
  c.update(degraded(5, 1.9), kNone, 1, 16);
  c.update(degraded(5, 1.9), trial(c, times({{"degraded 5 (l = 1.9)", 1.74}, {"plain", 2.2}})),
           2, 24);
  PlanMode three;
  three.degraded = {{5, 1.9}, {6, 1.1}, {12, 1.07}};
  c.update(three, kNone, 3, 40);
  ASSERT_TRUE(c.in_trial());
  const auto t = [](const PlanMode& m, size_t) {
    return m.degraded.size() == 3 ? 2.1 : m.degraded.size() == 1 ? 1.74 : 2.2;
  };
  EXPECT_EQ(c.update(three, trial(c, t), 4, 52).describe(), "degraded 5 (l = 1.9)");
  EXPECT_FALSE(c.records().back().kept);
  // While the larger set is vetoed, the probes' proposal keeps rank 5 at its latest factor.
  three.degraded[0].factor = 1.95;
  EXPECT_EQ(c.update(three, kNone, 5, 68).describe(), "degraded 5 (l = 1.95)");
  EXPECT_FALSE(c.in_trial());
}

TEST(PlanCheck, HostLevelPlansAreCheckedAgainstTheFlatBaseline) {
  PlanCheck c(/*flat_baseline=*/true);
  EXPECT_EQ(c.current().describe(), "flat");
  EXPECT_EQ(c.baseline().describe(), "flat");
  c.update(PlanMode{}, kNone, 1, 4);  // the model's choice (host-level allowed) proposed
  ASSERT_TRUE(c.in_trial());
  EXPECT_EQ(c.arm_mode(0).describe(), "plain");
  EXPECT_EQ(c.arm_mode(1).describe(), "flat");
  EXPECT_TRUE(c.update(PlanMode{}, trial(c, times({{"plain", 0.7}, {"flat", 0.6}})), 2, 12).flat);
  // Host-level plans are vetoed: a straggler is now tried with flat plans only.
  c.update(straggler(3), kNone, 3, 28);
  ASSERT_TRUE(c.in_trial());
  EXPECT_EQ(c.arm_mode(0).describe(), "straggler 3, flat");
  // Kept when faster.
  PlanCheck d(true);
  d.update(PlanMode{}, kNone, 1, 4);
  EXPECT_FALSE(d.update(PlanMode{}, trial(d, times({{"plain", 0.5}, {"flat", 0.6}})), 2, 12).flat);
  EXPECT_TRUE(d.records().back().kept);
}

TEST(PlanCheck, ArmsAreScoredPerCallSize) {
  // A job with two buckets per step: 8 MiB calls take 1 s, 1 MiB calls 0.1 s on the plain plan
  // and 0.9 / 0.09 s with the straggler's. Per size, the straggler's arm is faster, whichever
  // sizes the Thue-Morse order gave each arm.
  PlanCheck c;
  c.update(straggler(1), kNone, 1, 16);
  std::vector<CheckedCall> calls;
  for (size_t i = 0; i < c.trial_calls(); ++i) {
    CheckedCall k;
    k.arm = c.arm_of(i);
    k.bytes = i % 2 ? 1 << 20 : 8 << 20;
    const double base = i % 2 ? 0.1 : 1.0;
    k.after_same_arm = i > 0 && c.arm_of(i - 1) == k.arm;
    k.cost_s = c.arm_mode(k.arm).straggler == 1 ? 0.9 * base : base;
    calls.push_back(k);
  }
  EXPECT_EQ(c.update(straggler(1), calls, 2, 24).straggler, 1);
  const PlanCheckRecord r = c.records().back();
  EXPECT_NEAR(r.arms[0].score_s, 0.9 * 0.55, 1e-12);
  EXPECT_NEAR(r.arms[1].score_s, 0.55, 1e-12);
}

TEST(PlanCheck, TheThueMorseOrderGivesEveryArmItsShare) {
  for (size_t arms : {2u, 3u, 4u}) {
    PlanCheck c;
    PlanMode p = straggler(7);  // 2 arms: it and plain
    if (arms == 4) p.degraded = {{5, 2.0}};  // both, plain, each alone
    uint64_t exchange = 3;
    if (arms == 3) {  // the straggler kept long ago, then the degraded rank: it, the straggler, plain
      c.update(straggler(7), kNone, 1, 16);
      c.update(straggler(7), trial(c, times({{"straggler 7", 0.5}, {"plain", 0.6}})), 2, 24);
      p = degraded(5, 2.0);
      exchange = 40;
    }
    c.update(p, kNone, exchange, 640);
    ASSERT_TRUE(c.in_trial());
    std::map<int, int> n;
    for (size_t i = 0; i < c.trial_calls(); ++i) ++n[c.arm_of(i)];
    for (const auto& [arm, count] : n) {
      EXPECT_EQ(count, static_cast<int>(arms > 2 ? PlanCheck::kCallsPerArmOfMany
                                                 : PlanCheck::kCallsPerArm))
          << arms << " arms, arm " << arm;
    }
    EXPECT_EQ(n.size(), c.arms().size());
  }
}

TEST(PlanCheck, TrialsMeasureTheCostModelPerFamily) {
  // A call costs 0.1 s of compute plus its all_reduce. The baseline's Ring (predicted 0.5 s)
  // took 0.6 s: the 0.1 s beside its prediction is what is not the all_reduce. StragglAR-direct,
  // predicted 0.4 s, took 0.7 s: 1.5x its prediction.
  PlanCheck c;
  c.update(straggler(7), kNone, 1, 16);
  std::vector<CheckedCall> calls = trial(c, times({{"straggler 7", 0.7}, {"plain", 0.6}}));
  for (CheckedCall& k : calls) {
    const bool s = c.arm_mode(k.arm).straggler == 7;
    k.family = {s ? Algorithm::StragglarDirect : Algorithm::Ring, false};
    k.predicted_s = s ? 0.4 : 0.5;
  }
  c.update(straggler(7), calls, 2, 24);
  const PlanFamily direct{Algorithm::StragglarDirect, false}, ring{Algorithm::Ring, false};
  ASSERT_EQ(c.corrections().count(direct), 1u);
  EXPECT_NEAR(c.corrections().at(direct), 1.5, 1e-12);
  EXPECT_DOUBLE_EQ(c.corrections().at(ring), 1.0);
  ASSERT_EQ(c.new_model_errors().size(), 1u);  // off by more than 15%: reported, once
  EXPECT_EQ(c.new_model_errors()[0].family.describe(), "stragglar_direct");
  EXPECT_NEAR(c.new_model_errors()[0].ratio, 1.5, 1e-12);
  c.update(straggler(7), kNone, 3, 40);
  EXPECT_TRUE(c.new_model_errors().empty());
  c.reset_corrections();
  EXPECT_TRUE(c.corrections().empty());
}

TEST(PlanCheck, ADifferenceWithinTheCallsNoiseTakesASecondRoundThenTheModelsChoice) {
  // Calls vary by +-10% around 0.52 s (the proposal) and 0.50 s (plain): 4% slower, but within
  // the noise of 4 calls an arm. A second round of the same calls; still within one standard
  // error after it, so the cost model's choice (the proposal) stays.
  PlanCheck c;
  c.update(straggler(7), kNone, 1, 16);
  const auto noisy = [](const PlanMode& m, size_t i) {  // +10% and -10% in every block of 3
    const double base = m.straggler == 7 ? 0.52 : 0.50;
    return base * (1.0 + (i % 3 == 1 ? 0.1 : i % 3 == 2 ? -0.1 : 0.0));
  };
  EXPECT_EQ(c.update(straggler(7), trial(c, noisy), 2, 28).straggler, -1);
  ASSERT_TRUE(c.in_trial()) << "a second round";
  EXPECT_EQ(c.trial_length(), 2 * c.trial_calls());
  EXPECT_EQ(c.records().size(), 0u);
  std::vector<CheckedCall> second;
  for (size_t i = c.trial_calls(); i < c.trial_length(); ++i) {
    CheckedCall k;
    k.arm = c.arm_of(i);
    k.after_same_arm = c.arm_of(i - 1) == k.arm;
    k.bytes = 1 << 20;
    k.cost_s = noisy(c.arm_mode(k.arm), i);
    second.push_back(k);
  }
  EXPECT_EQ(c.update(straggler(7), second, 3, 40).straggler, 7);
  ASSERT_EQ(c.records().size(), 1u);
  const PlanCheckRecord r = c.records()[0];
  EXPECT_EQ(r.rounds, 2u);
  EXPECT_TRUE(r.kept);
  EXPECT_GT(r.arms[0].error_s, 0);
  EXPECT_GT(r.arms[0].score_s - r.arms[1].score_s, 0.02 * r.arms[1].score_s);
  EXPECT_LT(r.arms[0].score_s - r.arms[1].score_s,
            std::sqrt(r.arms[0].error_s * r.arms[0].error_s + r.arms[1].error_s * r.arms[1].error_s));
  // A clear loser among the same noise is undone in one round.
  PlanCheck d;
  d.update(straggler(7), kNone, 1, 16);
  const auto clear = [&](const PlanMode& m, size_t i) { return noisy(m, i) * (m.straggler == 7 ? 1.3 : 1.0); };
  EXPECT_EQ(d.update(straggler(7), trial(d, clear), 2, 28).straggler, -1);
  EXPECT_FALSE(d.in_trial());
  EXPECT_FALSE(d.records().back().kept);
  EXPECT_EQ(d.records().back().rounds, 1u);
}

TEST(PlanCheck, AModelWithinFifteenPercentIsNotCorrected) {
  PlanCheck c;
  c.update(straggler(7), kNone, 1, 16);
  std::vector<CheckedCall> calls = trial(c, times({{"straggler 7", 0.54}, {"plain", 0.6}}));
  for (CheckedCall& k : calls) {
    const bool s = c.arm_mode(k.arm).straggler == 7;
    k.family = {s ? Algorithm::StragglarDirect : Algorithm::Ring, false};
    k.predicted_s = s ? 0.4 : 0.5;  // 0.44 s after the 0.1 s beside the all_reduce: 1.1x
  }
  c.update(straggler(7), calls, 2, 24);
  EXPECT_DOUBLE_EQ(c.corrections().at(PlanFamily{Algorithm::StragglarDirect, false}), 1.0);
  EXPECT_TRUE(c.new_model_errors().empty());
}

TEST(PlanCheck, ARecheckTriesTheRunningModeAgainstTheBaseline) {
  PlanCheck c;
  c.update(straggler(7), kNone, 1, 16);
  c.update(straggler(7), trial(c, times({{"straggler 7", 0.5}, {"plain", 0.6}})), 2, 24);
  c.recheck();
  c.update(straggler(7), kNone, 3, 40);
  ASSERT_TRUE(c.in_trial());
  EXPECT_EQ(c.arm_mode(0).describe(), "straggler 7");
  EXPECT_EQ(c.arm_mode(1).describe(), "plain");
  EXPECT_EQ(c.update(straggler(7), trial(c, times({{"straggler 7", 0.7}, {"plain", 0.6}})), 4, 48)
                .straggler,
            -1);
}

}  // namespace
}  // namespace stragg
