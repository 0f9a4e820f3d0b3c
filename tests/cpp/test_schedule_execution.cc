// Every schedule generator, lowered per rank and run by the executor over shared memory, gives
// the exact all_reduce on every rank, bitwise identically.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "core/generators.h"
#include "plan/lower.h"
#include "plan/planner.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "transport/shm/shm_transport.h"

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
  cfg.algo = *algorithm_from_name(algo);
  // A straggler that is not the generators' canonical n-1.
  cfg.straggler = n > 2 ? Straggler::of_rank(1) : Straggler::none();
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
    // Staged receives (what a transport without RecvOp::limit needs), then send-ordered ones;
    // each in lockstep (lookahead 1) and with several steps in flight.
    Executor lockstep(t, 1);
    for (uint64_t seq = 0; seq < 4; ++seq) {
      std::vector<float> work = buf;
      CollectiveSpec spec;
      spec.seq = seq;
      spec.numel = numel;
      const bool ordered = seq % 2 == 1;
      Executor& runner = seq < 2 ? ex : lockstep;
      const PlanChoice choice = planner.choose(numel * sizeof(float), planner.straggler().rank);
      runner.run(*planner.lower(r, choice, numel, sizeof(float), ordered), spec, work.data(),
                 std::chrono::seconds(60));
      if (seq == 0) {
        out[r] = work;
      } else {
        ASSERT_EQ(0, std::memcmp(work.data(), out[r].data(), numel * sizeof(float)))
            << algo << ": run " << seq << " (ordered " << ordered << ", lookahead "
            << (seq < 2 ? Executor::kDefaultLookahead : 1) << ") differs on rank " << r;
      }
    }
  });
  for (size_t i = 0; i < numel; ++i) {
    float ref = 0;
    for (int r = 0; r < n; ++r) ref += input_value(r, i);
    ASSERT_EQ(out[0][i], ref) << algo << " n=" << n << " element " << i;
  }
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(0, std::memcmp(out[r].data(), out[0].data(), numel * sizeof(float)))
        << algo << ": rank " << r << " differs from rank 0";
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) + "_n" + std::to_string(std::get<1>(info.param)) + "_" +
         std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    AllGenerators, ScheduleExecution,
    ::testing::Combine(::testing::Values("ring", "rhd", "direct", "bcast", "stragglar", "optcc",
                                         "rd", "stragglar_direct"),
                       ::testing::Values(2, 3, 4, 5, 6, 8),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{5003})),
    case_name);

// Several steps in flight must reduce in exactly the schedule's order: with non-integer data any
// reordering of a reduction changes the bits. Ranks sleep at random between pieces of work so
// that steps complete in different orders from run to run.
class WindowedExecution : public ::testing::TestWithParam<std::string> {};

TEST_P(WindowedExecution, BitwiseEqualToLockstepWithRandomFloats) {
  const std::string algo = GetParam();
  const int n = 5;
  const size_t numel = 30011;
  PlannerConfig cfg;
  cfg.algo = *algorithm_from_name(algo);
  cfg.straggler = Straggler::of_rank(2);
  cfg.max_staging_bytes = 8192;
  Planner planner(n, cfg);
  InMemoryRendezvous rdv;
  ShmOptions opt;
  opt.slot_bytes = 4096;
  opt.num_slots = 2;
  // Lockstep results per rank, staged and send-ordered plans (their segmentations differ, so
  // their reduction orders do too: each is compared with its own lockstep run).
  std::vector<std::vector<float>> lock(2 * n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "win", r, n, opt);
    std::mt19937 gen(1234 + r);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> buf(numel);
    for (auto& x : buf) x = dist(gen);
    const PlanChoice choice = planner.choose(numel * sizeof(float), 2);
    for (size_t lookahead : {size_t{1}, size_t{3}, Executor::kDefaultLookahead}) {
      for (bool ordered : {false, true}) {
        Executor ex(t, lookahead);
        std::vector<float> work = buf;
        CollectiveSpec spec;
        spec.seq = static_cast<uint64_t>(lookahead * 2 + (ordered ? 1 : 0));
        spec.numel = numel;
        if (r == static_cast<int>(gen() % n)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(gen() % 5));
        }
        ex.run(*planner.lower(r, choice, numel, sizeof(float), ordered), spec, work.data(),
               std::chrono::seconds(60));
        std::vector<float>& ref = lock[2 * r + (ordered ? 1 : 0)];
        if (lookahead == 1) {
          ref = work;
        } else {
          ASSERT_EQ(0, std::memcmp(work.data(), ref.data(), numel * sizeof(float)))
              << algo << " lookahead " << lookahead << " ordered " << ordered << " rank " << r;
        }
      }
    }
  });
  for (int r = 1; r < n; ++r) {
    for (int o : {0, 1}) {
      ASSERT_EQ(0, std::memcmp(lock[2 * r + o].data(), lock[o].data(), numel * sizeof(float))) << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllGenerators, WindowedExecution,
                         ::testing::Values("ring", "rhd", "direct", "bcast", "stragglar", "optcc",
                                           "rd", "stragglar_direct"));

// Recursive doubling reduces on both ranks of a pair: they must still agree bit for bit where
// the sum is not commutative bitwise. x86 returns the first operand's payload for NaN + NaN, so
// two NaNs with different payloads tell the operand order apart.
TEST(RecursiveDoubling, PairsReduceInOneOperandOrderSoNanPayloadsAgree) {
  for (int n : {2, 3, 4, 8}) {
    PlannerConfig cfg;
    cfg.algo = Algorithm::Rd;
    Planner planner(n, cfg);
    InMemoryRendezvous rdv;
    std::vector<std::vector<uint32_t>> out(n);
    const size_t numel = 1000;
    run_ranks(n, [&](int r) {
      ShmTransport t(rdv, "rdnan", r, n, ShmOptions{});
      Executor ex(t);
      std::vector<uint32_t> bits(numel);
      for (size_t i = 0; i < numel; ++i) bits[i] = 0x7fc00000u | static_cast<uint32_t>(r + 1 + i);
      CollectiveSpec spec;
      spec.numel = numel;
      const PlanChoice choice = planner.choose(numel * 4, -1);
      ASSERT_EQ(choice.algorithm, Algorithm::Rd);
      ex.run(*planner.lower(r, choice, numel, 4, true), spec, bits.data(),
             std::chrono::seconds(60));
      out[r] = bits;
    });
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(out[r], out[0]) << "n=" << n << ": rank " << r << " differs from rank 0";
    }
  }
}

TEST(Lowering, StragglarStagesTheStragglerExchangeAndPutsPreArrivalFirst) {
  auto s = core::build("stragglar", 4, "{\"straggler\": 3}");
  ASSERT_TRUE(schedule_needs_staging(s, false));
  // The straggler's exchanges overlap exactly one send each: ordered receives need no staging.
  EXPECT_FALSE(schedule_needs_staging(s, true));
  for (const auto& step : lower_schedule(s, 3, 4096, 4, 4096, true).steps) {
    for (const auto& r : step.recvs) EXPECT_FALSE(r.staged);
  }
  // 3 segments' worth of data: pre-arrival steps of every segment come before any other step.
  const size_t numel = 3 * 3 * 1024;
  LoweredSchedule p = lower_schedule(s, 0, numel, 4, 4096);
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
  EXPECT_FALSE(schedule_needs_staging(core::build("ring", 5), false));
}

TEST(Lowering, PipelinedRingForwardsSegmentsRoundByRound) {
  auto s = core::build("ring", 4);
  const size_t numel = 4 * 4096;  // chunks of 4096 floats = 16 KiB: 4 segments of 4 KiB
  const LoweredSchedule whole = lower_schedule(s, 1, numel, 4);
  const LoweredSchedule piped = lower_schedule(s, 1, numel, 4, 1 << 20, false, 4096);
  const size_t rounds = whole.steps.size();
  ASSERT_EQ(rounds, 6u);
  ASSERT_EQ(piped.steps.size(), 4 * rounds);
  for (size_t i = 0; i < piped.steps.size(); ++i) {
    // Round by round: the 4 segments of round 0, then those of round 1, ...
    EXPECT_EQ(piped.steps[i].id % rounds, i / 4) << "step " << i;
    ASSERT_EQ(piped.steps[i].sends.size(), 1u);
    EXPECT_EQ(piped.steps[i].sends[0].count, 1024u);
    EXPECT_EQ(piped.steps[i].sends[0].peer, whole.steps[i / 4].sends[0].peer);
  }
  // Small chunks (up to 1.5 segments) are not split.
  EXPECT_EQ(lower_schedule(s, 1, 4 * 1536, 4, 1 << 20, false, 4096).steps.size(), rounds);
  // A schedule that needs staging is segmented for its staging only.
  auto st = core::build("stragglar", 4, "{\"straggler\": 3}");
  EXPECT_EQ(lower_schedule(st, 0, numel, 4, 1 << 20, false, 4096).steps.size(),
            lower_schedule(st, 0, numel, 4, 1 << 20, false, 0).steps.size());
}

// With receives that follow their send (RecvOp::limit), StragglAR's exchanges with the straggler
// need no staging, so its chunks are pipelined like Ring's: each part's receive follows the send
// of the same part, in the same step, and the plan asks for two rounds of parts in flight.
TEST(Lowering, StragglarWithOrderedReceivesIsPipelined) {
  auto s = core::build("stragglar", 5, "{\"straggler\": 2}");
  const size_t numel = 4 * 16 * 1024;  // chunks of 16 Ki floats = 64 KiB: 16 parts of 4 KiB
  for (int rank = 0; rank < 5; ++rank) {
    const LoweredSchedule whole = lower_schedule(s, rank, numel, 4, 1 << 20, true, 0);
    const LoweredSchedule piped = lower_schedule(s, rank, numel, 4, 1 << 20, true, 4096);
    ASSERT_EQ(piped.steps.size(), 16 * whole.steps.size()) << "rank " << rank;
    EXPECT_EQ(piped.min_lookahead, 32u);
    EXPECT_EQ(whole.min_lookahead, 0u);
    bool seen_post = false;
    int follows = 0;
    for (const auto& step : piped.steps) {
      if (!step.pre_arrival) seen_post = true;
      EXPECT_FALSE(seen_post && step.pre_arrival) << "pre-arrival step after a post-arrival one";
      for (const auto& r : step.recvs) {
        EXPECT_FALSE(r.staged);
        if (r.follows_send < 0) continue;
        ++follows;
        const LoweredOp& send = step.sends[r.follows_send];
        EXPECT_EQ(send.offset, r.offset);  // the same part of the same chunk
        EXPECT_EQ(send.count, r.count);
      }
    }
    // Every rank but the straggler exchanges once with it; the straggler with each of them.
    EXPECT_EQ(follows, 16 * (rank == 2 ? 4 : 1)) << "rank " << rank;
  }
  // Without ordered receives the exchanges are staged, which rules pipelining out.
  EXPECT_EQ(lower_schedule(s, 0, numel, 4, 1 << 20, false, 4096).min_lookahead, 0u);
}

// Over a network, StragglAR keeps this rank's sends in the schedule's order (its rounds each go
// to a new partner); OptCC, whose ranks feed the slow link and the ring at once, and shared
// memory (no pipeline parts) do not.
TEST(Lowering, StragglarOrdersItsSendsOverANetwork) {
  const size_t numel = 4 * 16 * 1024;
  auto s = core::build("stragglar", 5, "{\"straggler\": 2}");
  for (int rank = 0; rank < 5; ++rank) {
    EXPECT_TRUE(lower_schedule(s, rank, numel, 4, 1 << 20, true, 4096).ordered_sends) << rank;
    EXPECT_FALSE(lower_schedule(s, rank, numel, 4, 1 << 20, true, 0).ordered_sends) << rank;
  }
  auto optcc = core::build("optcc", 5, "{\"stragglers\": [4], \"slowdown\": 2.0, \"segments\": 4}");
  EXPECT_FALSE(lower_schedule(optcc, 0, numel, 4, 1 << 20, true, 4096).ordered_sends);
}

// Drives no bytes: each send finishes on its third progress() call; logs the peer of every send
// progressed, i.e. the order in which the executor feeds this rank's links.
class SendLogTransport final : public Transport {
 public:
  const char* name() const override { return "sendlog"; }
  int rank() const override { return 0; }
  int size() const override { return 3; }
  bool progress(SendOp& op) override {
    if (op.done) return false;
    log.push_back(op.peer);
    op.started = true;
    op.done = ++op.sent == 3;
    return true;
  }
  bool progress(RecvOp&) override { return false; }
  uint64_t activity_token() override { return 0; }
  void wait_for_activity(uint64_t, std::chrono::microseconds) override {}
  void signal_abort(const std::string&) override {}
  std::optional<std::string> abort_reason() override { return std::nullopt; }
  std::vector<int> dead_peers() override { return {}; }
  void publish_progress(const Progress&) override {}
  PeerStatus peer_status(int) override { return {}; }
  std::vector<int> log;
};

TEST(StepWindow, OrderedSendsFeedOnePeerAtATimeInStepOrder) {
  LoweredSchedule plan;
  plan.steps.resize(2);
  plan.steps[0].id = 0;
  plan.steps[0].sends.push_back(LoweredOp{1, 0, 4});
  plan.steps[1].id = 1;
  plan.steps[1].sends.push_back(LoweredOp{2, 4, 4});
  std::vector<float> buf(8, 1.0f);
  CollectiveSpec spec;
  spec.numel = buf.size();
  for (bool ordered : {false, true}) {
    plan.ordered_sends = ordered;
    SendLogTransport t;
    Executor ex(t);
    ex.run(plan, spec, buf.data(), std::chrono::seconds(10));
    // Unordered, the independent send of step 1 shares the link with step 0's.
    const std::vector<int> expected =
        ordered ? std::vector<int>{1, 1, 1, 2, 2, 2} : std::vector<int>{1, 2, 1, 2, 1, 2};
    EXPECT_EQ(t.log, expected) << "ordered_sends " << ordered;
  }
}

// Pipelining changes which bytes travel together, not how any element is reduced: the result is
// bitwise the same as the whole-chunk plan's, with random floats and several steps in flight.
TEST(Lowering, PipelinedPlansAreBitwiseEqualToWholeChunkPlans) {
  for (const char* algo : {"ring", "rhd", "stragglar"}) {
    const int n = 5;
    const size_t numel = 40009;
    PlannerConfig whole_cfg;
    whole_cfg.algo = *algorithm_from_name(algo);
    whole_cfg.straggler = Straggler::of_rank(3);
    PlannerConfig piped_cfg = whole_cfg;
    piped_cfg.pipeline_bytes = 4096;
    Planner whole(n, whole_cfg), piped(n, piped_cfg);
    InMemoryRendezvous rdv;
    ShmOptions opt;
    opt.slot_bytes = 4096;
    opt.num_slots = 2;
    std::vector<size_t> steps(2);
    run_ranks(n, [&](int r) {
      ShmTransport t(rdv, std::string("pipe") + algo, r, n, opt);
      Executor ex(t);
      std::mt19937 gen(99 + r);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> buf(numel);
      for (auto& x : buf) x = dist(gen);
      std::vector<float> a = buf, b = buf;
      CollectiveSpec spec;
      spec.numel = numel;
      const PlanChoice choice = whole.choose(numel * sizeof(float), 3);
      const auto plan_a = whole.lower(r, choice, numel, sizeof(float), true);
      const auto plan_b = piped.lower(r, choice, numel, sizeof(float), true);
      if (r == 0) steps = {plan_a->steps.size(), plan_b->steps.size()};
      spec.seq = 0;
      ex.run(*plan_a, spec, a.data(), std::chrono::seconds(60));
      spec.seq = 1;
      ex.run(*plan_b, spec, b.data(), std::chrono::seconds(60));
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), numel * sizeof(float))) << algo << " rank " << r;
    });
    EXPECT_GT(steps[1], steps[0]) << algo << ": the pipelined plan was not split";
  }
}

TEST(Planner, RejectsBadStraggler) {
  PlannerConfig far;
  far.algo = Algorithm::Stragglar;
  far.straggler = Straggler::of_rank(9);
  EXPECT_THROW(Planner(4, far), Error);
}

TEST(Planner, AutoPicksStragglarOnlyWithAConfiguredStraggler) {
  Planner plain(4, PlannerConfig{});
  EXPECT_EQ(plain.algorithm(), Algorithm::Auto);  // chosen per call by the cost model
  EXPECT_NE(plain.choose(1 << 20, -1).algorithm, Algorithm::Stragglar);
  PlannerConfig c;
  c.straggler = Straggler::of_rank(2);
  EXPECT_EQ(Planner(4, c).algorithm(), Algorithm::Stragglar);
}

}  // namespace
}  // namespace stragg

namespace stragg {
namespace {

// Runs agree_on_straggler on n threads; rank `late` (if >= 0) arrives `delay` later.
std::vector<int> agree(int n, int late, std::chrono::milliseconds delay,
                       std::chrono::microseconds window, int collectives = 3) {
  testing::InMemoryRendezvous rdv;
  std::vector<int> decided(n * collectives, -99);
  testing::run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "agree", r, n, ShmOptions{});
    Executor ex(t);
    for (int k = 0; k < collectives; ++k) {
      if (r == late) std::this_thread::sleep_for(delay);
      CollectiveSpec spec;
      spec.seq = static_cast<uint64_t>(k);
      decided[k * n + r] = ex.agree_on_straggler(spec, window, std::chrono::seconds(20));
      // Like a real collective, nobody starts the next one before everybody took part.
      std::vector<float> buf(4, 1.0f);
      spec.numel = buf.size();
      ex.run(*ring_allreduce_schedule(r, n, buf.size()), spec, buf.data(),
             std::chrono::seconds(20));
    }
  });
  return decided;
}

TEST(DynamicStraggler, EveryRankAgreesOnTheLateRank) {
  const int n = 4;
  auto d = agree(n, 2, std::chrono::milliseconds(150), std::chrono::microseconds(1000));
  for (int v : d) EXPECT_EQ(v, 2);
}

TEST(DynamicStraggler, NobodyIsTheStragglerWhenAllArriveWithinTheWindow) {
  const int n = 3;
  auto d = agree(n, -1, std::chrono::milliseconds(0), std::chrono::microseconds(5000000));
  for (int v : d) EXPECT_EQ(v, -1);
}

TEST(DynamicStraggler, MissingRankTimesOutNamingIt) {
  testing::InMemoryRendezvous rdv;
  const int n = 3;
  std::vector<std::string> errors(n);
  testing::run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "agree_missing", r, n, ShmOptions{});
    if (r == 0) {
      while (!t.abort_reason()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    Executor ex(t);
    CollectiveSpec spec;
    try {
      // Window longer than the timeout: rank 0 never arrives, so ranks 1 and 2 must time out.
      ex.agree_on_straggler(spec, std::chrono::seconds(30), std::chrono::milliseconds(400));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (int r : {1, 2}) {
    EXPECT_NE(errors[r].find("rank 0 has not called all_reduce #0"), std::string::npos)
        << errors[r];
  }
}

TEST(Planner, DynamicModeOnlyWithStragglarOrAuto) {
  PlannerConfig c;
  c.straggler = Straggler::dynamic();
  EXPECT_EQ(Planner(4, c).choose(4096, 2).algorithm, Algorithm::Stragglar);
  EXPECT_TRUE(Planner(4, c).dynamic());
  c.algo = Algorithm::Ring;
  EXPECT_THROW(Planner(4, c), Error);
}

}  // namespace
}  // namespace stragg
