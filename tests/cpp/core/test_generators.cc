#include <gtest/gtest.h>

#include "core/generators.h"
#include "core/verifier.h"

using namespace stragg::core;

static void expect_ok(const Schedule& s) {
  VerifyResult v = verify(s);
  EXPECT_TRUE(v.ok) << v.error;
}

TEST(Ring, VerifiesAndCountsRounds) {
  for (int n = 1; n <= 64; ++n) {
    Schedule s = ring_allreduce(n);
    expect_ok(s);
    EXPECT_EQ(s.num_rounds(), 2 * (n - 1));
    expect_ok(ring_reduce_scatter(n));
    expect_ok(ring_allgather(n));
  }
}

TEST(Rhd, VerifiesAndCountsRounds) {
  for (int n = 1; n <= 64; ++n) {
    Schedule s = rhd_allreduce(n);
    expect_ok(s);
    int p = 1, L = 0;
    while (p * 2 <= n) p *= 2, ++L;
    EXPECT_EQ(s.num_rounds(), 2 * L + (p == n ? 0 : 2)) << n;
    if (detail::is_pow2(n)) {
      expect_ok(rhd_reduce_scatter(n));
      expect_ok(rhd_allgather(n));
    } else {
      EXPECT_THROW(rhd_reduce_scatter(n), ScheduleError);
    }
  }
}

TEST(Rd, VerifiesCountsRoundsAndReducesLowerFirst) {
  for (int n = 1; n <= 64; ++n) {
    Schedule s = rd_allreduce(n);
    expect_ok(s);
    int p = 1, L = 0;
    while (p * 2 <= n) p *= 2, ++L;
    EXPECT_EQ(s.num_rounds(), L + (p == n ? 0 : 2)) << n;
    EXPECT_EQ(s.num_chunks, 1);
    for (const Step& st : s.steps) {
      for (const Transfer& t : st.transfers) {
        // Exchanges: the upper rank of a pair puts the received (lower) data first.
        if (t.op != RecvAction::kCopy && s.phases[st.phase] == "exchange") {
          EXPECT_EQ(t.op, t.src < t.dst ? RecvAction::kReduceFirst : RecvAction::kReduce) << n;
        }
      }
    }
  }
  // The op survives JSON.
  const Schedule s = rd_allreduce(4);
  EXPECT_EQ(schedule_from_json(to_json(s)).steps[0].transfers, s.steps[0].transfers);
}

TEST(Direct, VerifiesInTwoRounds) {
  for (int n = 2; n <= 64; ++n) {
    Schedule s = direct_allreduce(n);
    expect_ok(s);
    EXPECT_EQ(s.num_rounds(), 2);
    EXPECT_EQ(s.num_steps(), 2 * (n - 1));
    expect_ok(direct_reduce_scatter(n));
    expect_ok(direct_allgather(n));
  }
}
