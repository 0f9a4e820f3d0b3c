// Link probes: the pairing, the directed probe plans, the alpha/beta estimate, and what the
// per-link matrix says about each rank (degraded links).
#include <gtest/gtest.h>

#include <map>

#include <cmath>
#include <set>
#include <vector>

#include "common/error.h"
#include "plan/link_probe.h"

namespace stragg {
namespace {

TEST(LinkProbe, EveryPairMeetsExactlyOnce) {
  EXPECT_EQ(probe_rounds(1), 0);
  for (int n = 2; n <= 9; ++n) {
    const int rounds = probe_rounds(n);
    EXPECT_EQ(rounds, n % 2 ? n : n - 1) << n;
    std::vector<int> met(n * n, 0);
    for (int round = 0; round < rounds; ++round) {
      int idle = 0;
      for (int r = 0; r < n; ++r) {
        const int p = probe_partner(n, round, r);
        if (p < 0) {
          ++idle;
          continue;
        }
        ASSERT_LT(p, n);
        ASSERT_NE(p, r);
        ASSERT_EQ(probe_partner(n, round, p), r) << "n=" << n << " round=" << round;
        ++met[r * n + p];
      }
      EXPECT_EQ(idle, n % 2) << "n=" << n << " round=" << round;
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) EXPECT_EQ(met[i * n + j], i == j ? 0 : 1) << n << " " << i << " " << j;
  }
  EXPECT_THROW(probe_rounds(0), Error);
  EXPECT_THROW(probe_partner(4, 3, 0), Error);
  EXPECT_THROW(probe_partner(4, 0, 4), Error);
}

TEST(LinkProbe, EveryDirectedLinkHasExactlyOneSender) {
  for (int n = 2; n <= 7; ++n) {
    std::vector<int> timed(n * n, 0);
    for (int round = 0; round < probe_rounds(n); ++round) {
      for (int direction : {0, 1}) {
        for (int r = 0; r < n; ++r) {
          if (!probe_sends(n, round, direction, r)) continue;
          const int p = probe_partner(n, round, r);
          ASSERT_GE(p, 0);
          EXPECT_FALSE(probe_sends(n, round, direction, p)) << "both ends send";
          ++timed[r * n + p];
        }
      }
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) EXPECT_EQ(timed[i * n + j], i == j ? 0 : 1) << n << " " << i << " " << j;
  }
  EXPECT_THROW(probe_sends(4, 0, 2, 0), Error);
}

TEST(LinkProbe, DirectedPlansMirrorEachOther) {
  const int n = 4, round = 1, m = 5;
  const size_t elems = 3;
  const int peer = probe_partner(n, round, 0);
  ASSERT_GT(peer, 0);  // rank 0 is the lower rank: it sends in direction 0
  for (ProbeShape shape : {ProbeShape::kMany, ProbeShape::kOne, ProbeShape::kTiny}) {
    const bool many = shape == ProbeShape::kMany;
    const LoweredSchedule snd = link_probe_schedule(n, 0, round, 0, m, elems, shape);
    const LoweredSchedule rcv = link_probe_schedule(n, peer, round, 0, m, elems, shape);
    EXPECT_EQ(snd.tag, kLinkProbeTag);
    const size_t payload_steps = many ? m : 1;
    const size_t payload_elems = shape == ProbeShape::kTiny ? 1 : m * elems;
    ASSERT_EQ(snd.steps.size(), payload_steps + 1);
    ASSERT_EQ(rcv.steps.size(), payload_steps + 1);
    size_t sent = 0;
    for (size_t i = 0; i < payload_steps; ++i) {
      EXPECT_EQ(snd.steps[i].id, rcv.steps[i].id);
      ASSERT_EQ(snd.steps[i].sends.size(), 1u);
      EXPECT_TRUE(snd.steps[i].recvs.empty());
      ASSERT_EQ(rcv.steps[i].recvs.size(), 1u);
      EXPECT_TRUE(rcv.steps[i].sends.empty());
      EXPECT_EQ(snd.steps[i].sends[0].peer, peer);
      EXPECT_EQ(rcv.steps[i].recvs[0].peer, 0);
      EXPECT_EQ(snd.steps[i].sends[0].count, rcv.steps[i].recvs[0].count);
      EXPECT_EQ(rcv.steps[i].recvs[0].offset, m * elems + snd.steps[i].sends[0].offset);
      EXPECT_FALSE(rcv.steps[i].recvs[0].reduce);
      sent += snd.steps[i].sends[0].count;
    }
    EXPECT_EQ(sent, payload_elems);
    // The acknowledgement goes back.
    const LoweredStep& ack_s = snd.steps.back();
    const LoweredStep& ack_r = rcv.steps.back();
    EXPECT_EQ(ack_s.id, ack_r.id);
    ASSERT_EQ(ack_s.recvs.size(), 1u);
    ASSERT_EQ(ack_r.sends.size(), 1u);
    EXPECT_EQ(ack_s.recvs[0].count, 1u);
    EXPECT_EQ(ack_r.sends[0].count, 1u);
    // It reads the payload's last landed element: the executor sends it only after the payload
    // arrived (else a warm TCP socket buffer makes the sender time its own buffering).
    const LoweredOp& last = rcv.steps[rcv.steps.size() - 2].recvs[0];
    EXPECT_EQ(ack_r.sends[0].offset, last.offset + last.count - 1);
  }
  // The shapes use different step ids (partners that disagree notice).
  std::multiset<uint32_t> ids;
  for (ProbeShape shape : {ProbeShape::kMany, ProbeShape::kOne, ProbeShape::kTiny}) {
    for (const auto& s : link_probe_schedule(n, 0, round, 0, m, elems, shape).steps)
      ids.insert(s.id);
  }
  for (uint32_t id : ids) EXPECT_EQ(ids.count(id), 1u) << id;
  // n = 3: the idle rank has no steps.
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(link_probe_schedule(3, r, 0, 1, 4, 8, ProbeShape::kMany).steps.empty(),
              probe_partner(3, 0, r) < 0);
  }
  EXPECT_THROW(link_probe_schedule(4, 0, 0, 0, 0, 3, ProbeShape::kMany), Error);
  EXPECT_THROW(link_probe_schedule(4, 0, 0, 0, 2, 0, ProbeShape::kOne), Error);
  EXPECT_THROW(link_probe_schedule(4, 0, 3, 0, 2, 3, ProbeShape::kOne), Error);
  EXPECT_THROW(link_probe_schedule(4, 0, 0, 5, 2, 3, ProbeShape::kOne), Error);
}

TEST(LinkProbe, HostsWithSeveralRanksAreProbedHostToHost) {
  const std::vector<int> host_of = {0, 0, 1, 1, 2, 2, 3, 3};
  const ProbePairing p(8, host_of);
  ASSERT_TRUE(p.by_host());
  ASSERT_EQ(p.rounds(), probe_rounds(4) + 1);
  std::map<std::pair<int, int>, int> met;
  for (int round = 0; round + 1 < p.rounds(); ++round) {
    for (int r = 0; r < 8; ++r) {
      const int q = p.partner(round, r);
      if (r % 2 == 1) {
        EXPECT_EQ(q, -1) << "only a host's first rank probes the network";
        continue;
      }
      ASSERT_GE(q, 0);
      EXPECT_EQ(q % 2, 0);
      EXPECT_EQ(p.partner(round, q), r);
      EXPECT_NE(p.sends(round, 0, r), p.sends(round, 0, q));
      ++met[{std::min(r, q), std::max(r, q)}];
    }
  }
  EXPECT_EQ(met.size(), 6u);  // every pair of hosts, once (counted from both ends)
  for (const auto& [pair, count] : met) EXPECT_EQ(count, 2) << pair.first << "," << pair.second;
  // The last round: each host's shared-memory link.
  const int last = p.rounds() - 1;
  for (int r = 0; r < 8; ++r) EXPECT_EQ(p.partner(last, r), r ^ 1);
  // The measured links become the n x n matrix: hosts' first ranks stand for their hosts.
  std::vector<LinkModel> m(64, LinkModel{-1, -1});
  m[0 * 8 + 2] = {1e-4, 2e-8};  // host 0 -> host 1
  m[0 * 8 + 1] = {1e-5, 3e-10};  // host 0's shared memory
  m[1 * 8 + 0] = {2e-5, 4e-10};
  const std::vector<LinkModel> e = p.expand(m);
  EXPECT_DOUBLE_EQ(e[1 * 8 + 3].beta_s_per_byte, 2e-8);  // rank 1 -> rank 3: host 0 -> host 1
  EXPECT_DOUBLE_EQ(e[0 * 8 + 1].alpha_s, 1e-5);
  EXPECT_DOUBLE_EQ(e[1 * 8 + 0].alpha_s, 2e-5);
  EXPECT_LT(e[2 * 8 + 0].alpha_s, 0);  // host 1 -> host 0 not measured
  EXPECT_LT(e[3 * 8 + 3].alpha_s, 0);
  // One rank per host, or one host: every rank pair, as before.
  for (const std::vector<int>& flat : {std::vector<int>{0, 1, 2, 3}, std::vector<int>{0, 0, 0, 0},
                                       std::vector<int>{}}) {
    const ProbePairing q(4, flat);
    EXPECT_FALSE(q.by_host());
    EXPECT_EQ(q.rounds(), probe_rounds(4));
    for (int round = 0; round < q.rounds(); ++round)
      for (int r = 0; r < 4; ++r) EXPECT_EQ(q.partner(round, r), probe_partner(4, round, r));
  }
  EXPECT_THROW(ProbePairing(4, {0, 0, 2, 2}), Error);
}

TEST(LinkProbe, EstimateLinkRecoversAlphaBeta) {
  const double alpha = 20e-6, beta = 1.0 / 5e9;
  const int m = 8;
  const size_t s = 64 * 1024;
  // m messages then an acknowledgement, against one message of m*s then one, and one element
  // then one.
  const double t_many = m * (alpha + s * beta) + alpha;
  const double t_one = alpha + m * s * beta + alpha;
  const double t_tiny = 2 * alpha;
  const LinkModel l = estimate_link(t_many, t_one, t_tiny, m, s);
  EXPECT_NEAR(l.alpha_s, alpha, alpha * 1e-9);
  EXPECT_NEAR(l.beta_s_per_byte, beta, beta * 1e-9);
  // Messages that overlap in a stream (shared memory: the many-message run costs no more than
  // the one-message run): alpha is half the round trip, beta the rest of the whole transfer.
  const LinkModel o = estimate_link(t_one, t_one, t_tiny, m, s);
  EXPECT_NEAR(o.alpha_s, alpha, alpha * 1e-9);
  EXPECT_NEAR(o.beta_s_per_byte, beta, beta * 1e-9);
  // Noise that makes the many-message run faster and no round trip measured: alpha clamps to a
  // tiny positive value and beta comes from the whole transfer.
  const LinkModel c = estimate_link(0.001, 0.002, 0.0, m, s);
  EXPECT_EQ(c.alpha_s, kMinProbeAlpha);
  EXPECT_NEAR(c.beta_s_per_byte, 0.002 / (m * double(s)), 1e-18);
  // Many messages stalled by noise (a busy host): alpha grows, beta stays the one message's
  // time above the round trip.
  const LinkModel f = estimate_link(0.010, 0.002, 0.0, m, s);
  EXPECT_NEAR(f.beta_s_per_byte, 0.002 / (m * double(s)), 1e-18);
  const LinkModel g = estimate_link(t_many + 0.005, t_one, t_tiny, m, s);
  EXPECT_GT(g.alpha_s, 10 * alpha);
  EXPECT_NEAR(g.beta_s_per_byte, beta, beta * 1e-9);
  const LinkModel z = estimate_link(0.0, 0.0, 0.0, m, s);
  EXPECT_GT(z.alpha_s, 0.0);
  EXPECT_GT(z.beta_s_per_byte, 0.0);
  EXPECT_THROW(estimate_link(1, 1, 1, 1, s), Error);
  EXPECT_THROW(estimate_link(1, 1, 1, m, 0), Error);
  EXPECT_THROW(estimate_link(-1, 1, 1, m, s), Error);
  EXPECT_THROW(estimate_link(1, NAN, 1, m, s), Error);
  EXPECT_THROW(estimate_link(1, 1, INFINITY, m, s), Error);
}

// A matrix where a link i -> j runs at the slower of i's send side and j's receive side.
std::vector<LinkModel> network(const std::vector<double>& send, const std::vector<double>& recv,
                               double beta, double alpha = 10e-6) {
  const int n = static_cast<int>(send.size());
  std::vector<LinkModel> m(n * n, LinkModel{-1, -1});
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i != j) m[i * n + j] = {alpha, beta * std::max(send[i], recv[j])};
    }
  }
  return m;
}

TEST(LinkAnalysis, FindsTheDegradedRankAndItsFactor) {
  const double beta = 1.0 / 37.5e6;  // 300 Mbit/s
  const auto a = analyze_links(network({1, 1, 1, 2}, {1, 1, 1, 2}, beta), 4, 1.1);
  ASSERT_EQ(a.degraded.size(), 1u);
  EXPECT_EQ(a.degraded[0].rank, 3);
  EXPECT_NEAR(a.degraded[0].factor, 2.0, 1e-9);
  EXPECT_NEAR(a.reference.beta_s_per_byte, beta, beta * 1e-9);
  EXPECT_NEAR(a.reference.alpha_s, 10e-6, 1e-12);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(a.slowdown[r], 1.0);
  // Only its sending side is slow (a degraded uplink): still found, from its outgoing links.
  const auto up = analyze_links(network({1, 1.33, 1, 1}, {1, 1, 1, 1}, beta), 4, 1.1);
  ASSERT_EQ(up.degraded.size(), 1u);
  EXPECT_EQ(up.degraded[0].rank, 1);
  EXPECT_NEAR(up.degraded[0].factor, 1.33, 1e-9);
  EXPECT_NEAR(up.send_beta[1], 1.33 * beta, 1e-18);
  EXPECT_NEAR(up.recv_beta[1], beta, 1e-18);
  // Two degraded ranks of five.
  const auto two = analyze_links(network({1, 3, 1, 1, 1.5}, {1, 3, 1, 1, 1.5}, beta), 5, 1.1);
  ASSERT_EQ(two.degraded.size(), 2u);
  EXPECT_EQ(two.degraded[0].rank, 1);
  EXPECT_NEAR(two.degraded[0].factor, 3.0, 1e-9);
  EXPECT_EQ(two.degraded[1].rank, 4);
  EXPECT_NEAR(two.degraded[1].factor, 1.5, 1e-9);
}

TEST(LinkAnalysis, NoiseBelowTheThresholdIsNotADegradedLink) {
  const double beta = 1e-9;
  const auto a = analyze_links(network({1, 1.04, 0.97, 1.02}, {1.03, 1, 1, 0.98}, beta), 4, 1.1);
  EXPECT_TRUE(a.degraded.empty());
  // Unmeasured links are ignored; nothing measured gives the defaults.
  std::vector<LinkModel> none(9, LinkModel{-1, -1});
  const auto e = analyze_links(none, 3, 1.1);
  EXPECT_TRUE(e.degraded.empty());
  EXPECT_EQ(e.reference.alpha_s, LinkModel{}.alpha_s);
  EXPECT_EQ(e.send_beta[0], -1);
  EXPECT_THROW(analyze_links(none, 2, 1.1), Error);
  EXPECT_THROW(analyze_links(none, 3, 0.5), Error);
}

// p = 8, host 7 at l = 1.14: one probe read healthy host 0 at 1.12 as well. A newly slow rank
// below the sure factor asks for a second probe; each link's mean reading of the two decides,
// so a host slowed for one probe only drops below the threshold while the degraded one stays.
// p = 8, host 5's NIC at half rate; one probe also read healthy host 1 at 1.06. The confirming
// probe is for rank 1; rank 5 at 2 acts at once (a 60-step job would end before a second probe).
TEST(LinkAnalysis, ASureNewRankActsBeforeTheConfirmation) {
  const double beta = 1.0 / 37.5e6;  // 300 Mbit/s
  std::vector<double> send(8, 1.0);
  send[1] = 1.06;
  send[5] = 2.0;
  const LinkAnalysis a = analyze_links(network(send, send, beta), 8, 1.05);
  ASSERT_EQ(a.degraded.size(), 2u);
  EXPECT_TRUE(needs_confirmation(a, {}, 1.25));
  const std::vector<Slowdown> now = sure_degraded(a, {}, 1.25);
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].rank, 5);
  EXPECT_NEAR(now[0].factor, 2.0, 1e-9);
  // The second probe read rank 1 healthy and rank 2 (healthy in the first) at 1.6: the verdict
  // is what both read, rank 5 at the lower of its two factors.
  std::vector<double> again(8, 1.0);
  again[2] = 1.6;
  again[5] = 1.9;
  const LinkAnalysis b = analyze_links(network(again, again, beta), 8, 1.05);
  const std::vector<Slowdown> both = confirmed_degraded(a, b, {});
  ASSERT_EQ(both.size(), 1u);
  EXPECT_EQ(both[0].rank, 5);
  EXPECT_NEAR(both[0].factor, 1.9, 1e-9);
  const std::vector<double> ones(8, 1.0);
  const LinkAnalysis healthy = analyze_links(network(ones, ones, beta), 8, 1.05);
  EXPECT_TRUE(confirmed_degraded(a, healthy, {}).empty());
  // A known slow rank read healthy once stays; read healthy twice, it is dropped.
  const std::vector<Slowdown> kept = confirmed_degraded(healthy, b, {{2, 1.5}});
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].rank, 2);
  EXPECT_NEAR(kept[0].factor, 1.6, 1e-9);
  EXPECT_TRUE(confirmed_degraded(healthy, healthy, {{2, 1.5}}).empty());
}

TEST(LinkAnalysis, SmallNewFactorsAreConfirmedByASecondProbe) {
  const double beta = 1.0 / 18.75e6;  // 150 Mbit/s
  const std::vector<double> ones(8, 1.0);
  std::vector<double> first_send = ones, second_send = ones;
  first_send[0] = 1.12;
  first_send[7] = second_send[7] = 1.21;
  const auto first = network(first_send, first_send, beta);
  const auto second = network(second_send, second_send, beta);
  const LinkAnalysis a = analyze_links(first, 8, 1.08);
  ASSERT_EQ(a.degraded.size(), 2u);
  EXPECT_TRUE(needs_confirmation(a, {}, 1.25));
  // Already known slow ranks, or a factor past the sure one, need no second probe.
  EXPECT_FALSE(needs_confirmation(a, {{0, 1.1}, {7, 1.2}}, 1.25));
  EXPECT_FALSE(needs_confirmation(a, {}, 1.1));
  // A known rank that vanishes, or whose factor moved past `sure` either way, is confirmed too.
  EXPECT_TRUE(needs_confirmation(a, {{0, 1.1}, {7, 1.2}, {3, 2.0}}, 1.25));
  EXPECT_TRUE(needs_confirmation(a, {{0, 1.1}, {7, 1.6}}, 1.25));
  EXPECT_TRUE(needs_confirmation(a, {{0, 1.1}, {7, 0.9}}, 1.25));
  // Meanwhile only what is sure acts: no new rank reaches 1.25 here; known ranks stay as known.
  EXPECT_TRUE(sure_degraded(a, {}, 1.25).empty());
  const std::vector<Slowdown> known = {{0, 1.1}, {3, 2.0}};
  EXPECT_EQ(sure_degraded(a, known, 1.25), known);
  const std::vector<Slowdown> low = sure_degraded(a, {{3, 2.0}}, 1.1);
  ASSERT_EQ(low.size(), 3u);
  EXPECT_EQ(low[0].rank, 0);
  EXPECT_NEAR(low[0].factor, 1.12, 1e-9);
  EXPECT_EQ(low[1], (Slowdown{3, 2.0}));
  EXPECT_EQ(low[2].rank, 7);
  const LinkAnalysis both = analyze_links(average_links(first, second), 8, 1.08);
  ASSERT_EQ(both.degraded.size(), 1u);
  EXPECT_EQ(both.degraded[0].rank, 7);
  EXPECT_NEAR(both.degraded[0].factor, 1.21, 1e-9);
  // Unmeasured in either probe: unmeasured; different sizes: an error naming both.
  std::vector<LinkModel> gap = second;
  gap[1] = LinkModel{-1, -1};
  EXPECT_EQ(average_links(first, gap)[1].alpha_s, -1);
  try {
    average_links(first, std::vector<LinkModel>(4));
    FAIL() << "sizes differ";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("64 and 4 links"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stragg
