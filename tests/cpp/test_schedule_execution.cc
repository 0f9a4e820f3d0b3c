// Every schedule generator, lowered per rank and run by the executor over shared memory, gives
// the exact all_reduce on every rank, bitwise identically.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/generators.h"
#include "plan/lower.h"
#include "plan/planner.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/shm_transport.h"
#include "test_util.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

// Small integers: every summation order gives the exact result, so any schedule must match.
float input_value(int rank, size_t i) { return static_cast<float>((rank * 7 + i * 3) % 23); }

using Case = std::tuple<std::string, int, size_t>;

class ScheduleExecution : public ::testing::TestWithParam<Case> {};

TEST_P(ScheduleExecution, ExactAndBitwiseIdentical) {
  const auto& [algo, n, numel] = GetParam();
  PlannerConfig cfg;
  cfg.algo = algo;
  cfg.straggler = n > 2 ? 1 : -1;   // a straggler that is not the generators' canonical n-1
  cfg.max_staging_bytes = 4096;     // forces segmentation where staging is needed
  Planner planner(n, cfg);
  InMemoryRendezvous rdv;
  ShmOptions opt;
  opt.slot_bytes = 4096;
  opt.num_slots = 2;
  std::vector<std::vector<float>> out(n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "sched", r, n, opt);
    Executor ex(t);
    std::vector<float> buf(numel);
    for (size_t i = 0; i < numel; ++i) buf[i] = input_value(r, i);
    for (uint64_t seq = 0; seq < 2; ++seq) {
      std::vector<float> work = buf;
      CollectiveSpec spec;
      spec.seq = seq;
      spec.numel = numel;
      ex.run(planner.plan(r, numel, sizeof(float)), spec, work.data(), std::chrono::seconds(60));
      out[r] = work;
    }
  });
  for (size_t i = 0; i < numel; ++i) {
    float ref = 0;
    for (int r = 0; r < n; ++r) ref += input_value(r, i);
    ASSERT_EQ(out[0][i], ref) << planner.algorithm() << " n=" << n << " element " << i;
  }
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(0, std::memcmp(out[r].data(), out[0].data(), numel * sizeof(float)))
        << planner.algorithm() << ": rank " << r << " differs from rank 0";
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) + "_n" + std::to_string(std::get<1>(info.param)) + "_" +
         std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    AllGenerators, ScheduleExecution,
    ::testing::Combine(::testing::Values("ring", "rhd", "direct", "bcast", "stragglar", "optcc"),
                       ::testing::Values(2, 3, 4, 5, 6, 8),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{5003})),
    case_name);

TEST(Lowering, StragglarStagesTheStragglerExchangeAndPutsPreArrivalFirst) {
  auto s = core::build("stragglar", 4, "{\"straggler\": 3}");
  ASSERT_TRUE(schedule_needs_staging(s));
  // 3 segments' worth of data: pre-arrival steps of every segment come before any other step.
  const size_t numel = 3 * 3 * 1024;
  RankPlan p = lower_schedule(s, 0, numel, 4, 4096);
  bool seen_post = false;
  bool staged = false;
  for (const auto& step : p.steps) {
    if (!step.pre_arrival) seen_post = true;
    EXPECT_FALSE(seen_post && step.pre_arrival) << "pre-arrival step after a post-arrival one";
    for (const auto& r : step.recvs) staged |= r.staged;
  }
  EXPECT_TRUE(staged);
  // The straggler has no pre-arrival work at all.
  for (const auto& step : lower_schedule(s, 3, numel, 4, 4096).steps) EXPECT_FALSE(step.pre_arrival);
}

TEST(Lowering, RingNeedsNoStaging) {
  EXPECT_FALSE(schedule_needs_staging(core::build("ring", 5)));
}

TEST(Planner, RejectsUnknownAlgorithmAndBadStraggler) {
  PlannerConfig bad;
  bad.algo = "bogus";
  EXPECT_THROW(Planner(4, bad), Error);
  PlannerConfig far;
  far.algo = "stragglar";
  far.straggler = 9;
  EXPECT_THROW(Planner(4, far), Error);
}

TEST(Planner, AutoPicksStragglarOnlyWithAConfiguredStraggler) {
  EXPECT_EQ(Planner(4, PlannerConfig{}).algorithm(), "ring");
  PlannerConfig c;
  c.straggler = 2;
  EXPECT_EQ(Planner(4, c).algorithm(), "stragglar");
}

}  // namespace
}  // namespace stragg
