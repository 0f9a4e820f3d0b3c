// Host-level schedules (core/host_level.cc) and the simulator's two-level model.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/generators.h"
#include "core/simulator.h"
#include "core/verifier.h"

using namespace stragg;
using namespace stragg::core;

namespace {

std::vector<int> consecutive(int hosts, int per_host) {
  std::vector<int> h;
  for (int p = 0; p < hosts; ++p)
    for (int j = 0; j < per_host; ++j) h.push_back(p);
  return h;
}

HostLevelOptions cross(Algorithm a, int late = -1, int segments = 4) {
  HostLevelOptions o;
  o.cross = a;
  o.late_rank = late;
  o.cross_params.segments = segments;
  return o;
}

// Two-level model: network at beta (one NIC per host), shared memory 10x faster.
SimOptions two_level(const std::vector<int>& host_of, double bytes, double beta) {
  SimOptions o;
  o.nbytes = bytes;
  o.alpha = 0;
  o.beta = beta;
  o.host_of = host_of;
  o.local_alpha = 0;
  o.local_beta = beta / 10;
  return o;
}

double rel(double x, double y) { return std::fabs(x - y) / std::max(std::fabs(y), 1e-300); }

constexpr double kS = 8 << 20;
constexpr double kB = 1.0 / 37.5e6;  // 300 Mbit/s

}  // namespace

TEST(HostLevel, VerifiesForEveryCrossAlgorithmAndLateRank) {
  for (int hosts : {2, 3, 4, 5, 8}) {
    for (int k : {1, 2, 3, 4}) {
      const std::vector<int> host_of = consecutive(hosts, k);
      const int n = hosts * k;
      for (Algorithm a : {Algorithm::Ring, Algorithm::Rhd, Algorithm::Direct}) {
        for (int late : {-1, 0, n - 1, n / 2}) {
          const Schedule s = host_level(host_of, cross(a, late));
          VerifyResult v = verify(s);
          EXPECT_TRUE(v.ok) << algorithm_name(a) << " P=" << hosts << " K=" << k
                            << " late=" << late << ": " << v.error;
        }
      }
      for (int late = 0; late < n; ++late) {
        for (int seg : {1, 3}) {
          const Schedule s = host_level(host_of, cross(Algorithm::StragglarDirect, late, seg));
          VerifyResult v = verify(s);
          EXPECT_TRUE(v.ok) << "stragglar_direct P=" << hosts << " K=" << k << " late=" << late
                            << ": " << v.error;
          EXPECT_EQ(s.stragglers, std::vector<int>{late});
        }
        if (hosts >= 3) {
          VerifyResult v = verify(host_level(host_of, cross(Algorithm::Stragglar, late)));
          EXPECT_TRUE(v.ok) << "stragglar P=" << hosts << " K=" << k << ": " << v.error;
        }
      }
      if (hosts >= 3) {
        HostLevelOptions o = cross(Algorithm::Optcc, -1, 4);
        o.cross_params.stragglers = {1};
        o.cross_params.slowdowns = {2.0};
        VerifyResult v = verify(host_level(host_of, o));
        EXPECT_TRUE(v.ok) << "optcc P=" << hosts << " K=" << k << ": " << v.error;
      }
    }
  }
}

TEST(HostLevel, HostsNeedNotBeConsecutive) {
  // Ranks 0, 2 on host 0 and 1, 3 on host 1 (a round-robin placement).
  const Schedule s = host_level({0, 1, 0, 1}, cross(Algorithm::StragglarDirect, 3));
  EXPECT_TRUE(verify(s).ok) << verify(s).error;
}

TEST(HostLevel, UnevenHostsAndBadLayoutsRaise) {
  try {
    host_level({0, 0, 1}, cross(Algorithm::Ring));
    FAIL() << "uneven hosts accepted";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("different numbers of ranks (host 0: 2, host 1: 1)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(host_level({0, 0, 0}, cross(Algorithm::Ring)), ScheduleError);  // one host
  EXPECT_THROW(host_level({0, 2}, cross(Algorithm::Ring)), ScheduleError);     // host 1 missing
  EXPECT_THROW(host_level({0, 0, 1, 1}, cross(Algorithm::StragglarDirect)), ScheduleError);
}

TEST(HostLevel, PreArrivalStepsNeverInvolveTheLateRank) {
  const Schedule s = host_level(consecutive(4, 3), cross(Algorithm::StragglarDirect, 7, 2));
  int pre = 0;
  std::vector<Transfer> scratch;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    if (!s.steps[i].pre_arrival) continue;
    ++pre;
    for (const Transfer& t : s.transfers_of(i, scratch)) {
      EXPECT_NE(t.src, 7);
      EXPECT_NE(t.dst, 7);
    }
  }
  EXPECT_GT(pre, 0);
}

TEST(HostLevel, NicTrafficIsTheHostLevelShare) {
  // 4 hosts x 2: the flat Ring's NIC carries 2(PK-1)/(PK) = 1.75 of the buffer each way, the
  // host-level Ring 2(P-1)/P = 1.5 (plus the shared-memory phases at local_beta).
  const std::vector<int> host_of = consecutive(4, 2);
  const SimOptions o = two_level(host_of, kS, kB);
  const double flat = simulate(ring_allreduce(8), o).time;
  const double hier = simulate(host_level(host_of, cross(Algorithm::Ring)), o).time;
  const double u = kS * kB;
  // Flat: 14 rounds of S/8 on the NIC (the shared-memory hops of a round run beside it).
  EXPECT_LT(rel(flat, 14 * u / 8), 1e-9);
  // Host-level: one local step of S/2, 6 network rounds of S/8 per lane (two lanes per NIC:
  // S/4 a round), one local step of S/2.
  EXPECT_LT(rel(hier, 2 * 0.5 * u / 10 + 6 * u / 4), 1e-9);
  // Without host_of the flat model sees 8 separate links.
  SimOptions flat_model = o;
  flat_model.host_of.clear();
  EXPECT_LT(rel(simulate(ring_allreduce(8), flat_model).time, 14 * u / 8), 1e-9);
}

TEST(HostLevel, FlatStragglarDirectPaysForEveryRankOnTheNic) {
  // The flat StragglAR-direct's owners all-gather through their hosts' NICs: with 2 ranks a host
  // the late rank's host carries twice what one rank alone would.
  const std::vector<int> host_of = consecutive(4, 2);
  const double u = kS * kB;
  SimOptions o = two_level(host_of, kS, kB);
  o.arrival.assign(8, 0.0);
  o.arrival[7] = 1.0;  // long enough to hide every pre-arrival step
  const double flat = simulate(stragglar_direct(8, 7, 8), o).time - 1.0;
  const double hier = simulate(host_level(host_of, cross(Algorithm::StragglarDirect, 7, 8)), o)
                          .time - 1.0;
  // Host-level: the merge (S/2 locally), (k+1)/k u across hosts, the allgather (S/2 locally).
  EXPECT_LT(rel(hier, 2 * 0.5 * u / 10 + 9.0 / 8 * u), 1e-9);
  EXPECT_GT(flat, 1.4 * hier);
}

TEST(HostLevel, LateRankWithAnyCrossAlgorithm) {
  // Ring across hosts with a late rank: its mates reduce-scatter before it arrives.
  const Schedule s = host_level(consecutive(3, 4), cross(Algorithm::Ring, 5));
  EXPECT_TRUE(verify(s).ok) << verify(s).error;
  EXPECT_EQ(s.stragglers, std::vector<int>{5});
}

TEST(HostLevel, RegistryBuildsTheSameSchedule) {
  const Schedule a =
      build("host_level", 8, R"({"cross": "stragglar_direct", "ranks_per_host": 2, "straggler": 7,
                                 "segments": 4})");
  const Schedule b = host_level(consecutive(4, 2), cross(Algorithm::StragglarDirect, 7, 4));
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].transfers, b.steps[i].transfers);
  // Slow ranks name their hosts: ranks 2 and 3 are host 1.
  const Schedule o = build("host_level", 8,
                           R"({"cross": "optcc", "hosts": [0,0,1,1,2,2,3,3], "stragglers": [2, 3],
                               "slowdowns": [2.0, 1.5], "segments": 2})");
  EXPECT_TRUE(verify(o).ok) << verify(o).error;
  EXPECT_EQ(o.rank_slowdown[2], 2.0);
  EXPECT_EQ(o.rank_slowdown[3], 2.0);
  EXPECT_EQ(o.rank_slowdown[0], 1.0);
  EXPECT_THROW(build("host_level", 8, R"({"cross": "auto", "ranks_per_host": 2})"),
               ScheduleError);
  EXPECT_THROW(build("host_level", 8, R"({"ranks_per_host": 3})"), ScheduleError);
}

TEST(Simulator, TwoLevelModelChecksItsInputs) {
  SimOptions o = two_level({0, 0, 1}, kS, kB);
  EXPECT_THROW(simulate(ring_allreduce(4), o), ScheduleError);  // wrong size
  o.host_of = {0, 0, 1, 1};
  o.mode = SimMode::kDataflow;
  EXPECT_THROW(simulate(ring_allreduce(4), o), ScheduleError);  // lockstep only
}
