#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/closed_forms.h"
#include "core/generators.h"
#include "core/simulator.h"
#include "core/verifier.h"

using namespace stragg::core;
namespace cf = stragg::core::closed_form;

namespace {
// Bandwidth-only model of the paper: one element per time unit on a healthy link.
double t_over_sbeta(const Schedule& s) {
  SimOptions o;
  o.nbytes = 1.0;
  o.beta = 1.0;
  return simulate(s, o).time;
}
OptccOptions single(int straggler, double l, int k, const char* order = "s3_first") {
  OptccOptions o;
  o.stragglers = {straggler};
  o.slowdowns = {l};
  o.segments = k;
  o.order = order;
  return o;
}
}  // namespace

TEST(Optcc, VerifiesForAllSmallConfigurations) {
  for (int p = 2; p <= 24; ++p)
    for (double l : {1.5, 2.0, 3.0})
      for (const char* order : {"s3_first", "s1_first"}) {
        Schedule s = optcc(p, single(p / 2, l, 4, order));
        VerifyResult v = verify(s);
        ASSERT_TRUE(v.ok) << p << " " << l << " " << order << ": " << v.error;
      }
  for (int p = 4; p <= 32; p += 3) {
    OptccOptions o;
    o.stragglers = {0, p - 1};
    o.slowdowns = {2.5, 1.5};
    o.segments = 3;
    VerifyResult v = verify(optcc(p, o));
    ASSERT_TRUE(v.ok) << p << ": " << v.error;
  }
  for (int p = 33; p <= 64; p += 31) {
    VerifyResult v = verify(optcc(p, single(5, 1.25, 2)));
    ASSERT_TRUE(v.ok) << p << ": " << v.error;
  }
}

TEST(Optcc, SlowLinkAtLeastTwoMatchesEquation1) {
  // l >= 2: T = l n (k+1)/k  ->  l n = (l/2 + l/(2p) + ...) T0 (Table 3, large-l column).
  for (int p : {5, 8, 16}) {
    for (double l : {2.0, 3.0, 4.0}) {
      for (int k : {1, 4, 16}) {
        const double t = t_over_sbeta(optcc(p, single(p - 1, l, k)));
        EXPECT_NEAR(t, l * (k + 1.0) / k, 1e-9) << p << " " << l << " " << k;
      }
      const double t64 = t_over_sbeta(optcc(p, single(0, l, 64)));
      EXPECT_LT(std::fabs(t64 / cf::optcc_single_limit(p, l) - 1), 0.02);
      EXPECT_GE(t64, cf::optcc_single_lower_bound(p, l) - 1e-12);
    }
  }
}

TEST(Optcc, BubbleFillingApproachesTable3ForSmallSlowdown) {
  for (int p : {5, 8, 16}) {
    for (double l : {1.14, 1.33, 1.5, 1.8}) {
      double prev = 1e300;
      for (int k : {4, 16, 64}) {
        const double t = t_over_sbeta(optcc(p, single(2, l, k)));
        const double lim = cf::optcc_single_limit(p, l);
        EXPECT_LE(t, lim * (k + 1.0) / k + 1e-9) << p << " " << l << " " << k;
        EXPECT_GE(t, cf::optcc_single_lower_bound(p, l) - 1e-9);
        EXPECT_LT(t, prev);
        prev = t;
      }
      // T/T0 -> p l / ((p-2) l + 2) (App. C overhead bound <= 1 + 1/(p-1)).
      const double ratio = prev / cf::optcc_t0(p);
      EXPECT_LT(std::fabs(ratio - p * l / ((p - 2) * l + 2)), 0.02 * ratio);
      EXPECT_LE(ratio, (1 + 1.0 / (p - 1)) * 1.02);
    }
  }
  // Without bubble filling the straggler's slot is a full 2s and T -> 2n (head and tail bodies
  // carry one section per fast flow, so they take max(1, l) s per window).
  OptccOptions o = single(1, 1.5, 64);
  o.bubble_fill = false;
  EXPECT_NEAR(t_over_sbeta(optcc(8, o)), (2.0 * 63 + 2 * 1.5) / 64, 1e-9);
}

TEST(Optcc, OrderS1FirstNeedsLongerPipelineFill) {
  // S1 -> S2 -> S3 -> S4 spans four bodies per segment (k + 3 in all) against two for
  // S3 -> S1 -> S4 -> S2, so it is slower for finite k and converges to the same limit.
  for (int p : {6, 9}) {
    const double t1 = t_over_sbeta(optcc(p, single(p - 1, 2.0, 8, "s1_first")));
    const double t3 = t_over_sbeta(optcc(p, single(p - 1, 2.0, 8, "s3_first")));
    EXPECT_GT(t1, t3);
    EXPECT_LE(t1, 2.0 * (8 + 3.0) / 8 + 1e-9);
    const double t1_big = t_over_sbeta(optcc(p, single(p - 1, 2.0, 128, "s1_first")));
    EXPECT_LT(std::fabs(t1_big / 2.0 - 1), 0.03);
  }
}

TEST(Optcc, MultipleStragglersMatchAppendixD) {
  for (int p : {8, 12, 16}) {
    for (std::vector<double> ls : {std::vector<double>{2.0, 1.33}, {1.33, 1.14}, {3.0, 2.5},
                                   {1.5, 1.5, 1.5, 1.5}}) {
      const int m = static_cast<int>(ls.size());
      OptccOptions o;
      for (int i = 0; i < m; ++i) o.stragglers.push_back(i);
      o.slowdowns = ls;
      o.segments = 64;
      Schedule s = optcc(p, o);
      const double t = t_over_sbeta(s);
      const double lim = cf::optcc_multi_limit(p, ls);
      // Never worse than App. D's construction (its Table 3 limit), never below Theorem 2.
      EXPECT_LE(t, lim * (1 + 4.0 / 64) + 1e-9) << p << " m=" << m;
      EXPECT_GE(t, cf::optcc_multi_lower_bound(p, ls) - 1e-9);
      // With m | p the body is exactly App. D's: max(2(p-1), l1 (p-m) + 2(m-1)) sections.
      if (p % m == 0) {
        // (With 2m >= p the straggler windows carry no fast flows and we beat App. D.)
        if (2 * m < p) {
          EXPECT_LT(std::fabs(t / lim - 1), 0.02) << p << " m=" << m << " t=" << t;
        }
      }
    }
  }
}

TEST(Optcc, RejectsBadParameters) {
  OptccOptions o;
  o.stragglers = {9};
  EXPECT_THROW(optcc(8, o), ScheduleError);
  o.stragglers = {1, 1};
  EXPECT_THROW(optcc(8, o), ScheduleError);
  o = OptccOptions();
  o.order = "zigzag";
  EXPECT_THROW(optcc(8, o), ScheduleError);
  o = OptccOptions();
  o.slowdowns = {0.5};
  EXPECT_THROW(optcc(8, o), ScheduleError);
}
