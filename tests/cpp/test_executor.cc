#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "plan/planner.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "transport/shm/shm_transport.h"
#include "transport_checks.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

TEST(RingPlan, EveryElementIsSentOncePerPhaseAndReceivedOnce) {
  // The Ring internal collectives run is core::ring_allreduce lowered: per rank, n-1
  // reduce-scatter steps then n-1 allgather steps, each moving one of n contiguous chunks.
  for (int n : {2, 3, 7}) {
    for (size_t numel : {0, 1, 5, 6, 7, 100}) {
      std::vector<int> received(numel, 0);
      for (int r = 0; r < n; ++r) {
        const auto plan = ring_allreduce_schedule(r, n, numel);
        ASSERT_EQ(plan->steps.size(), static_cast<size_t>(2 * (n - 1)));
        EXPECT_EQ(plan->tag, schedule_tag(Algorithm::Ring));
        for (const auto& step : plan->steps) {
          ASSERT_EQ(step.recvs.size(), 1u);
          EXPECT_EQ(step.recvs[0].peer, (r + n - 1) % n);
          EXPECT_EQ(step.sends[0].peer, (r + 1) % n);
          for (size_t i = 0; i < step.recvs[0].count; ++i) ++received[step.recvs[0].offset + i];
        }
      }
      // Every element is reduced n-1 times and copied n-1 times over all ranks.
      for (size_t i = 0; i < numel; ++i) EXPECT_EQ(received[i], 2 * (n - 1)) << i;
    }
  }
  EXPECT_TRUE(ring_allreduce_schedule(0, 1, 10)->steps.empty());
}

struct Case {
  int size;
  size_t numel;
};

class RingAllreduce : public ::testing::TestWithParam<Case> {};

TEST_P(RingAllreduce, SumMatchesReferenceAndIsBitwiseIdentical) {
  const Case c = GetParam();
  ShmOptions opt;
  opt.slot_bytes = 8192;  // small slots: large cases stream through many pieces
  opt.num_slots = 3;
  testing::check_ring_allreduce(c.size, c.numel, [&](Rendezvous& rdv, int r, int n) {
    return std::make_unique<ShmTransport>(rdv, "ring", r, n, opt);
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, RingAllreduce,
                         ::testing::Values(Case{1, 10}, Case{2, 0}, Case{2, 1}, Case{2, 10001},
                                           Case{3, 2}, Case{3, 100003}, Case{4, 65536},
                                           Case{5, 7}, Case{8, 40000}));

// An Executor reuses its step window from run to run (the lists keep their capacity): plans of
// other shapes, fewer or more steps than the window holds, must still run as if fresh.
TEST(Executor, ReusedAcrossPlansOfDifferentShapes) {
  InMemoryRendezvous rdv;
  const int n = 4;
  struct Run {
    bool ring;
    size_t numel;
  };
  const std::vector<Run> runs = {{true, 1000}, {false, 7},  {true, 1},
                                 {true, 10001}, {false, 4096}, {true, 3}};
  std::vector<std::vector<std::vector<float>>> results(n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "reuse", r, n, ShmOptions{});
    Executor ex(t, /*lookahead=*/2);  // the ring's 6 steps go round the 2 slots three times
    uint64_t seq = 0;
    for (const Run& run : runs) {
      std::vector<float> buf(run.numel);
      for (size_t i = 0; i < run.numel; ++i) buf[i] = static_cast<float>((r + 1) * (i % 13));
      CollectiveSpec spec;
      spec.seq = seq++;
      spec.numel = run.numel;
      const auto plan = run.ring ? ring_allreduce_schedule(r, n, run.numel)
                                 : small_allreduce_schedule(r, n, run.numel);
      ex.run(*plan, spec, buf.data(), std::chrono::seconds(20));
      results[r].push_back(std::move(buf));
    }
  });
  for (size_t k = 0; k < runs.size(); ++k) {
    for (size_t i = 0; i < runs[k].numel; ++i) {
      // 1 + 2 + 3 + 4 = 10 times i % 13: exact in float.
      ASSERT_EQ(results[0][k][i], static_cast<float>(10 * (i % 13))) << "run " << k << " @" << i;
    }
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(std::memcmp(results[r][k].data(), results[0][k].data(), runs[k].numel * 4), 0)
          << "run " << k << ": rank " << r << " differs from rank 0";
    }
  }
}

TEST(Executor, MismatchedNumelRaisesOnEveryRank) {
  testing::check_numel_mismatch_raises_everywhere(4, [](Rendezvous& rdv, int r, int n) {
    return std::make_unique<ShmTransport>(rdv, "mm", r, n, ShmOptions{});
  });
}

TEST(Executor, MismatchedDtypeAndOpAreNamed) {
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    ShmTransport t(rdv, "mmd", r, 2, ShmOptions{});
    Executor ex(t);
    std::vector<double> buf(16, 1.0);
    CollectiveSpec spec;
    spec.numel = 16;
    spec.dtype = r == 0 ? DType::Float64 : DType::Int64;
    spec.op = r == 0 ? ReduceOp::Sum : ReduceOp::Max;
    try {
      ex.run(*ring_allreduce_schedule(r, 2, 16), spec, buf.data(), std::chrono::seconds(20));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("mismatch"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("dtype float64 (rank 0) vs int64 (rank 1)"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("op SUM (rank 0) vs MAX (rank 1)"), std::string::npos) << errors[r];
  }
}

TEST(Executor, MissingRankTimesOutNamingIt) {
  InMemoryRendezvous rdv;
  const int n = 3;
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "late", r, n, ShmOptions{});
    Executor ex(t);
    std::vector<float> buf(1000, 1.0f);
    CollectiveSpec spec;
    spec.numel = buf.size();
    if (r == 1) {
      // Never calls the collective; waits until the others gave up (they abort the group).
      while (!t.abort_reason()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    try {
      ex.run(*ring_allreduce_schedule(r, n, buf.size()), spec, buf.data(),
             std::chrono::milliseconds(500));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  });
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("rank 1 has not called all_reduce #0"), std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

TEST(Executor, GroupIsUnusableAfterAnAbort) {
  InMemoryRendezvous rdv;
  std::vector<std::unique_ptr<ShmTransport>> ts(2);
  run_ranks(2, [&](int r) { ts[r] = std::make_unique<ShmTransport>(rdv, "dead", r, 2, ShmOptions{}); });
  ts[0]->signal_abort("boom");
  Executor ex(*ts[1]);
  std::vector<float> buf(4);
  CollectiveSpec spec;
  spec.numel = 4;
  try {
    ex.run(*ring_allreduce_schedule(1, 2, 4), spec, buf.data(), std::chrono::seconds(1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos);
  }
}

}  // namespace
}  // namespace stragg
