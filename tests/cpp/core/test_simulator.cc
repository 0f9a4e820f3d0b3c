#include <gtest/gtest.h>

#include <cmath>

#include "core/closed_forms.h"
#include "core/generators.h"
#include "core/simulator.h"

using namespace stragg::core;
namespace cf = stragg::core::closed_form;

namespace {
SimOptions ab(double s, double a, double b) {
  SimOptions o;
  o.nbytes = s;
  o.alpha = a;
  o.beta = b;
  return o;
}
constexpr double kS = 1 << 30;       // 1 GiB
constexpr double kA = 3e-6;          // StragglAR §4.3: alpha = 3 us
constexpr double kB = 1.0 / 450e9;   // beta = 1 / (450 GB/s)
double rel(double x, double y) { return std::fabs(x - y) / std::max(std::fabs(y), 1e-300); }
}  // namespace

TEST(Simulator, RingMatchesClosedForm) {
  for (int n : {2, 3, 4, 7, 8, 16, 33, 64}) {
    SimResult r = simulate(ring_allreduce(n), ab(kS, kA, kB));
    EXPECT_LT(rel(r.time, cf::ring(n, kS, kA, kB)), 1e-12) << n;
    EXPECT_EQ(r.rounds, 2 * (n - 1));
    EXPECT_NEAR(r.max_bytes_sent, 2.0 * (n - 1) / n * kS, 1e-3);
    // Dataflow mode agrees on a symmetric schedule.
    SimOptions d = ab(kS, kA, kB);
    d.mode = SimMode::kDataflow;
    EXPECT_LT(rel(simulate(ring_allreduce(n), d).time, cf::ring(n, kS, kA, kB)), 1e-12) << n;
  }
}

TEST(Simulator, RhdAndDirectMatchClosedForms) {
  for (int n : {2, 4, 8, 32, 64, 256}) {
    EXPECT_LT(rel(simulate(rhd_allreduce(n), ab(kS, kA, kB)).time, cf::rhd(n, kS, kA, kB)), 1e-12);
    EXPECT_LT(rel(simulate(direct_allreduce(n), ab(kS, kA, kB)).time, cf::direct(n, kS, kA, kB)),
              1e-12);
  }
  // Non-power-of-2 RHD pays the fold and unfold of the whole buffer.
  const int n = 6, p = 4;
  const double expect = (2 * 2 + 2) * kA + (2.0 + 2.0 * (p - 1) / p) * kS * kB;
  EXPECT_LT(rel(simulate(rhd_allreduce(n), ab(kS, kA, kB)).time, expect), 1e-12);
}

TEST(Simulator, SlowLinkAndArrivalTimes) {
  // Ring with one degraded link: every round involves the slow rank, so beta scales by l.
  Schedule s = ring_allreduce(8);
  SimOptions o = ab(kS, 0, kB);
  o.slowdown.assign(8, 1.0);
  o.slowdown[3] = 2.0;
  EXPECT_LT(rel(simulate(s, o).time, 2.0 * cf::ring(8, kS, 0, kB)), 1e-12);
  // A late rank delays a straggler-agnostic schedule by exactly its delay.
  SimOptions late = ab(kS, kA, kB);
  late.arrival.assign(8, 0.0);
  late.arrival[5] = 1e-3;
  EXPECT_LT(rel(simulate(s, late).time, 1e-3 + cf::ring(8, kS, kA, kB)), 1e-12);
  late.arrival.resize(3);
  EXPECT_THROW(simulate(s, late), ScheduleError);
}

TEST(Simulator, UnequalChunkWeightsCostTheirBytes) {
  Schedule s = Schedule::make("t", Collective::kAllReduce, 2, 2);
  s.chunk_weights = {3.0, 1.0};
  s.add_step(0).transfers.push_back({0, 1, 0, 1, RecvAction::kReduce});
  s.add_step(0).transfers.push_back({1, 0, 1, 1, RecvAction::kReduce});
  SimResult r = simulate(s, ab(4.0, 0.0, 1.0));
  EXPECT_DOUBLE_EQ(r.round_end[0], 3.0);
  EXPECT_DOUBLE_EQ(r.time, 4.0);
}

// short-circuit-rings §2.3: on a static ring, Recursive Doubling's propagation sums to the same
// (n-1) * delta as Ring's, but its congestion makes it slower; Ring <= static RD.
TEST(ShortCircuit, SimulatorMatchesRingTopologyCostModel) {
  const double d = 100e-9, r = 1e-6, m = 1 << 20, b = 1.0 / 100e9, a = 0.0;
  for (int n : {4, 8, 16, 32}) {
    const int L = static_cast<int>(std::log2(n));
    SimOptions o = ab(m, a, b);
    o.ring_topology = true;
    o.hop_delay = d;
    o.reconfig_delay = r;
    // Static RD all the way (tau = L) and ring.
    Schedule rd = rhd_reduce_scatter(n);
    EXPECT_LT(rel(simulate(rd, o).time, cf::sc_rd_reduce_scatter(n, m, a, b, d, r, L)), 1e-12);
    EXPECT_LT(rel(simulate(ring_reduce_scatter(n), o).time, cf::sc_ring_reduce_scatter(n, m, a, b, d)),
              1e-12);
    for (int tau = 0; tau <= L; ++tau) {
      Schedule sc = short_circuit(n, m, a, b, d, r, tau, L - tau);
      const double expect = cf::sc_rd_reduce_scatter(n, m, a, b, d, r, tau) +
                            cf::sc_rd_allgather(n, m, a, b, d, r, L - tau);
      EXPECT_LT(rel(simulate(sc, o).time, expect), 1e-12) << n << " " << tau;
    }
    // Propagation terms are equal: with beta = 0, alpha = 0 both take (n-1) * delta.
    SimOptions prop = o;
    prop.beta = 0;
    EXPECT_NEAR(simulate(rd, prop).time, (n - 1) * d, 1e-15);
    EXPECT_NEAR(simulate(ring_reduce_scatter(n), prop).time, (n - 1) * d, 1e-15);
  }
}

TEST(ShortCircuit, RingNeverWorseThanStaticRecursiveDoubling) {
  for (int n : {4, 8, 16, 32, 64})
    for (double m : {1e3, 1e5, 1e7, 1e9})
      for (double d : {0.0, 1e-8, 1e-6}) {
        SimOptions o = ab(m, 0.0, 1.0 / 100e9);
        o.ring_topology = true;
        o.hop_delay = d;
        const double ring = simulate(ring_allreduce(n), o).time;
        const double rd = simulate(rhd_allreduce(n), o).time;
        EXPECT_LE(ring, rd * (1 + 1e-12)) << n << " " << m << " " << d;
      }
}

TEST(ShortCircuit, ReconfiguringBeatsRingForSmallMessagesAndNeverLoses) {
  const double b = 1.0 / 100e9;
  for (int n : {8, 16, 32, 64}) {
    // Small message, reconfiguration cheap relative to propagation: RD with circuits wins.
    {
      const double m = 1024, d = 1e-6, r = 1e-7;
      auto c = cf::sc_choose(n, m, 0.0, b, d, r);
      ASSERT_GE(c.tau_rs, 0);
      SimOptions o = ab(m, 0.0, b);
      o.ring_topology = true;
      o.hop_delay = d;
      o.reconfig_delay = r;
      const double t = simulate(short_circuit(n, m, 0.0, b, d, r), o).time;
      const double ring = simulate(ring_allreduce(n), o).time;
      EXPECT_LT(t, 0.5 * ring) << n;
      EXPECT_LT(rel(t, c.time), 1e-12);
    }
    // Whatever the parameters, the rule never loses to Ring.
    for (double m : {1e2, 1e4, 1e6, 1e8})
      for (double d : {1e-8, 1e-7, 1e-6})
        for (double r : {1e-7, 1e-6, 1e-5, 1e-4}) {
          SimOptions o = ab(m, 0.0, b);
          o.ring_topology = true;
          o.hop_delay = d;
          o.reconfig_delay = r;
          const double t = simulate(short_circuit(n, m, 0.0, b, d, r), o).time;
          const double ring = simulate(ring_allreduce(n), o).time;
          EXPECT_LE(t, ring * (1 + 1e-12)) << n << " " << m << " " << d << " " << r;
        }
  }
}
