// Persistent-straggler detection (StragglerProfiler) on synthetic
// duration matrices as the backend would exchange them every K calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "core/closed_forms.h"
#include "plan/recent_buffer.h"
#include "plan/straggler_profiler.h"

namespace stragg {
namespace {

namespace cf = core::closed_form;

constexpr int64_t kMiB = 1 << 20;

// One call as the test describes it: which rank was late and by how much (late < 0: nobody, all
// ranks within a fraction of a microsecond), or a failed call.
struct Call {
  int late = -1;
  double delay = 0;
  bool failed = false;
};

Call late(int rank, double delay) { return Call{rank, delay, false}; }
Call nobody() { return Call{-1, 0, false}; }
Call failed() { return Call{-1, 0, true}; }

// Durations as the ranks measure them: everyone finishes together, so a rank's duration is
// (finish - its arrival); the late rank waited least. Early ranks differ by 0.1 us (no ties).
std::vector<double> durations_for(int n, const std::vector<Call>& calls) {
  const size_t k = calls.size();
  std::vector<double> d(n * k);
  for (size_t i = 0; i < k; ++i) {
    for (int r = 0; r < n; ++r) {
      double v = 2.0 + 1e-7 * r;
      if (calls[i].late == r) v = 2.0 - calls[i].delay;
      if (calls[i].failed && r == 0) v = -1;
      d[r * k + i] = v;
    }
  }
  return d;
}

// Feeds `calls` in batches of the profiler's exchange_every; returns the calls at which
// add_batch reported a change (first_call + k).
struct Feeder {
  StragglerProfiler& p;
  int n;
  int64_t bytes = kMiB;
  LinkModel link{};
  uint64_t next = 0;

  bool batch(const std::vector<Call>& calls) {
    const int k = static_cast<int>(calls.size());
    std::vector<int64_t> b(k, bytes);
    const bool changed = p.add_batch(durations_for(n, calls), k, b, link, next);
    next += k;
    return changed;
  }
  // `batches` batches of K copies of `c`; returns the number of changes.
  int repeat(Call c, int batches) {
    int changes = 0;
    const int k = p.settings().exchange_every;
    for (int i = 0; i < batches; ++i) changes += batch(std::vector<Call>(k, c));
    return changes;
  }
};

ProfilerSettings defaults() { return ProfilerSettings{}; }

// ---- cost model ------------------------------------------------------------------------------

TEST(StragglarCallGain, MatchesClosedForms) {
  const LinkModel l;
  const double s = kMiB;
  const double a = l.alpha_s, b = l.beta_s_per_byte;
  const double c = cf::stragglar_critical_delay(8, s, a, b);
  EXPECT_DOUBLE_EQ(stragglar_call_gain(8, s, 0.005, false, l), -c);
  // Delay covers the reduce-scatter: gain = Ring - StragglAR's post-arrival part.
  EXPECT_NEAR(stragglar_call_gain(8, s, 0.005, true, l),
              cf::ring(8, s, a, b) - cf::stragglar_best(8, s, a, b), 1e-12);
  // No delay at all: StragglAR runs its worst case, i.e. loses exactly c.
  EXPECT_NEAR(stragglar_call_gain(8, s, 0.0, true, l), -c, 1e-12);
  EXPECT_EQ(stragglar_call_gain(2, s, 0.005, true, l), 0.0);
}

TEST(StragglarDirectCallGain, MatchesTheLockStepModel) {
  // 4 ranks, 1.85 MB over 25 MB/s links (the CI training benchmark's emulated hosts).
  LinkModel l;
  l.alpha_s = 125e-6;
  l.beta_s_per_byte = 1.0 / 25e6;
  const double s = 1.85e6, a = l.alpha_s, b = l.beta_s_per_byte;
  const double k = std::round(std::sqrt(s * b / a));
  const double rounds = (k + 1) * (a + s * b / k);
  const double rs = cf::stragglar_reduce_scatter(4, s, a, b);
  EXPECT_NEAR(stragglar_direct_call_gain(4, s, 0.06, true, l), cf::ring(4, s, a, b) - rounds,
              1e-12);
  EXPECT_NEAR(stragglar_direct_call_gain(4, s, 0.06, false, l), cf::ring(4, s, a, b) - rs - rounds,
              1e-12);
  // Its rounds beat StragglAR's n + log2(n) - 2 = 4 rounds of s/(n-1) here.
  EXPECT_GT(stragglar_direct_call_gain(4, s, 0.06, true, l),
            stragglar_call_gain(4, s, 0.06, true, l));
  EXPECT_EQ(stragglar_direct_call_gain(2, s, 0.06, true, l), 0.0);
}

// ---- adoption --------------------------------------------------------------------------------

// Links as in the CI training benchmark; rank 3 late by 55 ms in 2 of every 3 calls, another rank
// in the third. StragglAR's model gains less than the third call costs it; where the planner
// may run StragglAR-direct (over a network), that variant's gain counts.
TEST(StragglerProfiler, DirectVariantCountsWhereThePlannerMayRunIt) {
  LinkModel l;
  l.alpha_s = 125e-6;
  l.beta_s_per_byte = 1.0 / 25e6;
  std::vector<Call> calls;
  for (int i = 0; i < 48; ++i) calls.push_back(i % 3 == 2 ? late(i % 2, 0.055) : late(3, 0.055));
  for (const bool direct : {false, true}) {
    StragglerProfiler p(4, defaults());
    p.set_direct_variant(direct);
    Feeder f{p, 4, 1850000, l};
    for (int b = 0; b < 4; ++b)
      f.batch(std::vector<Call>(calls.begin() + 12 * b, calls.begin() + 12 * (b + 1)));
    EXPECT_EQ(p.straggler(), direct ? 3 : -1) << "direct variant " << direct;
    EXPECT_EQ(p.summary().predicted_gain_s > 0, direct) << p.summary().predicted_gain_s;
  }
}

TEST(StragglerProfiler, PersistentStragglerAdoptedAfterPatience) {
  StragglerProfiler p(8, defaults());
  Feeder f{p, 8};
  EXPECT_FALSE(f.batch(std::vector<Call>(16, late(3, 0.005))));
  EXPECT_EQ(p.straggler(), -1);
  EXPECT_TRUE(f.batch(std::vector<Call>(16, late(3, 0.005))));
  EXPECT_EQ(p.straggler(), 3);
  const auto s = p.summary();
  ASSERT_EQ(s.decisions.size(), 1u);
  EXPECT_EQ(s.decisions[0].call, 32u);  // first call of the next batch
  EXPECT_EQ(s.decisions[0].straggler, 3);
  EXPECT_NE(s.decisions[0].reason.find("rank 3"), std::string::npos) << s.decisions[0].reason;
  EXPECT_NE(s.decisions[0].reason.find("100.0%"), std::string::npos) << s.decisions[0].reason;
  EXPECT_NE(s.decisions[0].reason.find("gain"), std::string::npos) << s.decisions[0].reason;
  EXPECT_EQ(s.calls, 32u);
  EXPECT_EQ(s.exchanges, 2u);
  EXPECT_EQ(s.candidate, 3);
  EXPECT_DOUBLE_EQ(s.candidate_share, 1.0);
  EXPECT_NEAR(s.median_delay_s, 0.005, 1e-6);
  const LinkModel l;
  EXPECT_DOUBLE_EQ(s.critical_delay_s,
                   cf::stragglar_critical_delay(8, kMiB, l.alpha_s, l.beta_s_per_byte));
  EXPECT_NEAR(s.predicted_gain_s,
              cf::ring(8, kMiB, l.alpha_s, l.beta_s_per_byte) -
                  cf::stragglar_best(8, kMiB, l.alpha_s, l.beta_s_per_byte),
              1e-9);
  EXPECT_EQ(s.last_counts, (std::vector<int64_t>{0, 0, 0, 32, 0, 0, 0, 0}));
  EXPECT_EQ(s.window_last_counts, (std::vector<int64_t>{0, 0, 0, 32, 0, 0, 0, 0}));
  ASSERT_EQ(s.recent_delays_s.size(), 32u);
  ASSERT_EQ(s.recent_last.size(), 32u);
  EXPECT_EQ(s.recent_last[0], 3);
  // Steady state: nothing more happens.
  EXPECT_EQ(f.repeat(late(3, 0.005), 10), 0);
  EXPECT_EQ(p.summary().decisions.size(), 1u);
  EXPECT_EQ(p.summary().recent_delays_s.size(), 192u);
}

TEST(StragglerProfiler, PatienceDelaysAdoption) {
  ProfilerSettings st;
  st.patience = 3;
  st.exchange_every = 8;
  StragglerProfiler p(6, st);
  Feeder f{p, 6};
  // Window 64 needs >= 16 significant calls: batch 0 (8 calls) does not count yet.
  f.repeat(late(5, 0.01), 3);
  EXPECT_EQ(p.straggler(), -1);
  EXPECT_EQ(f.repeat(late(5, 0.01), 1), 1);
  EXPECT_EQ(p.straggler(), 5);
  EXPECT_EQ(p.summary().decisions.at(0).call, 32u);
}

TEST(StragglerProfiler, SwitchesWithHysteresis) {
  StragglerProfiler p(8, defaults());
  Feeder f{p, 8};
  f.repeat(late(2, 0.005), 4);
  EXPECT_EQ(p.straggler(), 2);
  // Rank 5 takes over. Window shares of rank 2: .75, .5 (keep: between the thresholds),
  // .25 (should go; rank 5 at .75 qualifies), 0 (second batch: switch).
  EXPECT_FALSE(f.batch(std::vector<Call>(16, late(5, 0.005))));
  EXPECT_FALSE(f.batch(std::vector<Call>(16, late(5, 0.005))));
  EXPECT_FALSE(f.batch(std::vector<Call>(16, late(5, 0.005))));
  EXPECT_EQ(p.straggler(), 2);
  EXPECT_TRUE(f.batch(std::vector<Call>(16, late(5, 0.005))));
  EXPECT_EQ(p.straggler(), 5);
  const auto s = p.summary();
  ASSERT_EQ(s.decisions.size(), 2u);  // direct switch, no detour through -1
  EXPECT_EQ(s.decisions[1].call, 128u);
  EXPECT_EQ(s.decisions[1].straggler, 5);
  EXPECT_NE(s.decisions[1].reason.find("replaces rank 2"), std::string::npos) << s.decisions[1].reason;
  // Why rank 2 went (rank 5 was last in the whole window: no share, and StragglAR for rank 2
  // would lose its critical delay on every call), then why rank 5 came.
  EXPECT_EQ(s.decisions[1].reason.rfind("rank 5 replaces rank 2: rank 2 dropped for its share and "
                                        "its gain: last in 0.0% of the window's 64 significant "
                                        "calls, drop below 30.0%; predicted gain -",
                                        0),
            0u)
      << s.decisions[1].reason;
  EXPECT_NE(s.decisions[1].reason.find("; adopted: rank 5 was last in 100.0% of the window's "
                                       "64 significant calls, adopt at 50.0%, and its predicted "
                                       "gain "),
            std::string::npos)
      << s.decisions[1].reason;
}

// Every decision text names the rule that applied: an adoption both (share and gain must
// qualify) and the schedule its gain is for; a drop the rule that failed, then the other.
TEST(StragglerProfiler, DecisionTextsNameTheReasonThatApplied) {
  const auto npos = std::string::npos;
  {
    // StragglAR's gain: named with its critical delay.
    StragglerProfiler p(8, defaults());
    Feeder f{p, 8};
    f.repeat(late(3, 0.005), 4);
    ASSERT_EQ(p.straggler(), 3);
    const std::string r = p.summary().decisions.at(0).reason;
    EXPECT_EQ(r.rfind("adopted: rank 3 was last in 100.0% of the window's ", 0), 0u) << r;
    EXPECT_NE(r.find(" significant calls, adopt at 50.0%, and its predicted gain "), npos) << r;
    EXPECT_NE(r.find(" per call over Ring with StragglAR (critical delay "), npos) << r;
    EXPECT_NE(r.find("bytes), needs > 0.000 ms (median delay 5.000 ms)"), npos) << r;
    EXPECT_EQ(r.find("stragglar_direct"), npos) << r;
  }
  {
    // StragglAR-direct allowed, and its gain the larger at 1 MiB on the default link: the text
    // names it and not StragglAR's critical delay, which the decision did not use.
    StragglerProfiler p(8, defaults());
    p.set_direct_variant(true);
    Feeder f{p, 8};
    f.repeat(late(3, 0.005), 4);
    ASSERT_EQ(p.straggler(), 3);
    std::string r = p.summary().decisions.at(0).reason;
    EXPECT_NE(r.find(" per call over Ring with stragglar_direct, needs > 0.000 ms"), npos) << r;
    EXPECT_EQ(r.find("critical delay"), npos) << r;
    // Nobody late any more: too few significant calls for a share. Its gain (StragglAR-direct
    // beats Ring even on time at 1 MiB) did not decide it.
    f.repeat(nobody(), 8);
    ASSERT_EQ(p.straggler(), -1);
    r = p.summary().decisions.back().reason;
    EXPECT_EQ(r.rfind("rank 3 dropped for its share: only 0 of the window's 64 calls significant "
                      "(a share needs 16), drop below 30.0% (not for its gain: predicted gain ",
                      0),
              0u)
        << r;
    EXPECT_NE(r.find(" per call over Ring with stragglar_direct, needs > 0.000 ms;"), npos) << r;
  }
  {
    // 1 GiB among 4 ranks: a 1 s straggler is adopted; late by 1 ms it is still last in every
    // call, but StragglAR no longer pays: dropped for its gain, not its share.
    StragglerProfiler p(4, defaults());
    Feeder f{p, 4};
    f.bytes = 1024 * kMiB;
    f.repeat(late(2, 1.0), 2);
    ASSERT_EQ(p.straggler(), 2);
    f.repeat(late(2, 0.001), 8);
    ASSERT_EQ(p.straggler(), -1);
    const std::string r = p.summary().decisions.back().reason;
    EXPECT_EQ(r.rfind("rank 2 dropped for its gain: predicted gain -", 0), 0u) << r;
    EXPECT_NE(r.find(", needs > 0.000 ms (not for its share: last in 100.0% of the window's 64 "
                     "significant calls, drop below 30.0%; median delay "),
              npos)
        << r;
  }
}

TEST(StragglerProfiler, NoFlappingBetweenThresholds) {
  StragglerProfiler p(8, defaults());
  Feeder f{p, 8};
  f.repeat(late(2, 0.005), 4);
  ASSERT_EQ(p.straggler(), 2);
  // Rank 2 late in 40% of the calls, ranks 5 and 6 in 30% each: rank 2's share stays between
  // drop (0.3) and adopt (0.5), and nobody else reaches adopt.
  std::vector<Call> mixed;
  const int pattern[10] = {2, 5, 6, 2, 5, 6, 2, 5, 6, 2};
  for (int i = 0; i < 10; ++i) mixed.push_back(late(pattern[i], 0.005));
  for (int b = 0; b < 20; ++b) EXPECT_FALSE(f.batch(mixed));
  EXPECT_EQ(p.straggler(), 2);
  EXPECT_EQ(p.summary().decisions.size(), 1u);
  EXPECT_NEAR(p.summary().straggler_share, 0.4, 0.03);
  EXPECT_GT(p.summary().straggler_gain_s, 0.0);

  // The same mix never gets a straggler adopted in the first place.
  StragglerProfiler q(8, defaults());
  Feeder g{q, 8};
  for (int b = 0; b < 20; ++b) EXPECT_FALSE(g.batch(mixed));
  EXPECT_EQ(q.straggler(), -1);
  EXPECT_EQ(q.summary().candidate, 2);
  EXPECT_TRUE(q.summary().decisions.empty());
}

TEST(StragglerProfiler, AbsentStragglerStaysNone) {
  // Random late ranks with large delays.
  StragglerProfiler p(8, defaults());
  Feeder f{p, 8};
  std::mt19937 rng(1);
  for (int b = 0; b < 50; ++b) {
    std::vector<Call> calls;
    for (int i = 0; i < 16; ++i) calls.push_back(late(static_cast<int>(rng() % 8), 0.005));
    EXPECT_FALSE(f.batch(calls));
  }
  EXPECT_EQ(p.straggler(), -1);
  EXPECT_LT(p.summary().candidate_share, 0.4);

  // Everybody on time (delays below the noise floor).
  StragglerProfiler q(8, defaults());
  Feeder g{q, 8};
  EXPECT_EQ(g.repeat(late(4, 10e-6), 10), 0);
  EXPECT_EQ(g.repeat(nobody(), 10), 0);
  const auto s = q.summary();
  EXPECT_EQ(s.straggler, -1);
  EXPECT_EQ(s.candidate, -1);
  EXPECT_EQ(s.insignificant_calls, 320u);
  EXPECT_EQ(s.last_counts, std::vector<int64_t>(8, 0));
  EXPECT_EQ(s.recent_last.back(), -1);
  EXPECT_EQ(s.median_delay_s, 0.0);
}

TEST(StragglerProfiler, DisappearingStragglerDropped) {
  StragglerProfiler p(8, defaults());
  Feeder f{p, 8};
  f.repeat(late(1, 0.005), 4);
  ASSERT_EQ(p.straggler(), 1);
  // Window after each on-time batch: 48, 32 significant calls (predicted gain still positive),
  // 16 (gain negative: should go), 0 (second batch: dropped).
  EXPECT_EQ(f.repeat(nobody(), 3), 0);
  EXPECT_EQ(p.straggler(), 1);
  EXPECT_EQ(f.repeat(nobody(), 1), 1);
  EXPECT_EQ(p.straggler(), -1);
  const auto s = p.summary();
  ASSERT_EQ(s.decisions.size(), 2u);
  EXPECT_EQ(s.decisions[1].call, 128u);
  EXPECT_EQ(s.decisions[1].straggler, -1);
  EXPECT_NE(s.decisions[1].reason.find("rank 1 dropped"), std::string::npos) << s.decisions[1].reason;
  EXPECT_EQ(f.repeat(nobody(), 5), 0);
}

TEST(StragglerProfiler, NoGainNotAdopted) {
  // 1 GiB among 4 ranks: the critical delay is ~0.27 s; a 1 ms straggler does not pay off.
  StragglerProfiler p(4, defaults());
  Feeder f{p, 4};
  f.bytes = 1024 * kMiB;
  EXPECT_EQ(f.repeat(late(2, 0.001), 20), 0);
  const auto s = p.summary();
  EXPECT_EQ(s.straggler, -1);
  EXPECT_EQ(s.candidate, 2);
  EXPECT_DOUBLE_EQ(s.candidate_share, 1.0);
  EXPECT_LT(s.predicted_gain_s, 0.0);
  EXPECT_LT(s.median_delay_s, s.critical_delay_s / 100);

  // Same size, a 1 s straggler covers the reduce-scatter: adopted.
  StragglerProfiler q(4, defaults());
  Feeder g{q, 4};
  g.bytes = 1024 * kMiB;
  EXPECT_EQ(g.repeat(late(2, 1.0), 2), 1);
  EXPECT_EQ(q.straggler(), 2);

  // min_gain_s above the predicted gain: not adopted either.
  ProfilerSettings st;
  st.min_gain_s = 1.0;
  StragglerProfiler r(4, st);
  Feeder h{r, 4};
  h.bytes = 1024 * kMiB;
  EXPECT_EQ(h.repeat(late(2, 1.0), 5), 0);
}

TEST(StragglerProfiler, TwoRanksNever) {
  StragglerProfiler p(2, defaults());
  Feeder f{p, 2};
  EXPECT_EQ(f.repeat(late(1, 0.05), 10), 0);
  EXPECT_EQ(p.straggler(), -1);
  EXPECT_EQ(p.summary().candidate, 1);
  StragglerProfiler one(1, defaults());
  Feeder g{one, 1};
  EXPECT_EQ(g.repeat(nobody(), 3), 0);
  EXPECT_EQ(one.summary().candidate, -1);
  EXPECT_EQ(one.summary().calls, 48u);
}

TEST(StragglerProfiler, FailedCallsSkipped) {
  StragglerProfiler p(8, defaults());
  Feeder f{p, 8};
  // Every other call failed; in those, rank 6 would look 50 ms late.
  std::vector<Call> calls;
  for (int i = 0; i < 16; ++i) {
    Call c = i % 2 ? failed() : late(3, 0.005);
    if (i % 2) c.late = 6, c.delay = 0.05;
    calls.push_back(c);
  }
  // 8 valid calls per batch: the first batch holds fewer than window/4 significant calls.
  EXPECT_FALSE(f.batch(calls));
  EXPECT_FALSE(f.batch(calls));
  EXPECT_TRUE(f.batch(calls));
  EXPECT_EQ(p.straggler(), 3);
  auto s = p.summary();
  EXPECT_EQ(s.decisions.at(0).call, 48u);
  EXPECT_EQ(s.calls, 24u);
  EXPECT_EQ(s.skipped_calls, 24u);
  EXPECT_EQ(s.last_counts[6], 0);
  EXPECT_EQ(s.recent_delays_s.size(), 24u);

  // NaN durations are unknown too; a batch with no valid call does not advance the hysteresis.
  StragglerProfiler q(8, defaults());
  Feeder g{q, 8};
  EXPECT_FALSE(g.batch(std::vector<Call>(16, late(4, 0.005))));
  for (int b = 0; b < 3; ++b) EXPECT_FALSE(g.batch(std::vector<Call>(16, failed())));
  std::vector<double> d = durations_for(8, std::vector<Call>(16, late(4, 0.005)));
  for (int i = 0; i < 16; ++i) d[2 * 16 + i] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(q.add_batch(d, 16, std::vector<int64_t>(16, kMiB), LinkModel{}, g.next));
  g.next += 16;
  EXPECT_EQ(q.straggler(), -1);
  EXPECT_TRUE(g.batch(std::vector<Call>(16, late(4, 0.005))));
  EXPECT_EQ(q.summary().decisions.at(0).call, g.next);
  EXPECT_EQ(q.summary().skipped_calls, 64u);
}

void expect_same(const ProfilerSummary& a, const ProfilerSummary& b) {
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.calls, b.calls);
  EXPECT_EQ(a.exchanges, b.exchanges);
  EXPECT_EQ(a.skipped_calls, b.skipped_calls);
  EXPECT_EQ(a.insignificant_calls, b.insignificant_calls);
  EXPECT_EQ(a.straggler, b.straggler);
  EXPECT_EQ(a.candidate, b.candidate);
  EXPECT_EQ(a.candidate_share, b.candidate_share);
  EXPECT_EQ(a.median_delay_s, b.median_delay_s);
  EXPECT_EQ(a.critical_delay_s, b.critical_delay_s);
  EXPECT_EQ(a.predicted_gain_s, b.predicted_gain_s);
  EXPECT_EQ(a.straggler_share, b.straggler_share);
  EXPECT_EQ(a.straggler_gain_s, b.straggler_gain_s);
  EXPECT_EQ(a.last_counts, b.last_counts);
  EXPECT_EQ(a.window_last_counts, b.window_last_counts);
  EXPECT_EQ(a.recent_delays_s, b.recent_delays_s);
  EXPECT_EQ(a.recent_last, b.recent_last);
  ASSERT_EQ(a.decisions.size(), b.decisions.size());
  for (size_t i = 0; i < a.decisions.size(); ++i) {
    EXPECT_EQ(a.decisions[i].call, b.decisions[i].call);
    EXPECT_EQ(a.decisions[i].straggler, b.decisions[i].straggler);
    EXPECT_EQ(a.decisions[i].reason, b.decisions[i].reason);
  }
  EXPECT_EQ(a.link.alpha_s, b.link.alpha_s);
  EXPECT_EQ(a.link.beta_s_per_byte, b.link.beta_s_per_byte);
}

TEST(StragglerProfiler, Deterministic) {
  // A noisy run with phases (rank 3 persistent, then random, then rank 6), identical input on
  // two profilers (as on two ranks): identical decisions and summaries.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  const int n = 8, k = 16;
  std::vector<std::vector<double>> batches;
  std::vector<std::vector<int64_t>> sizes;
  for (int b = 0; b < 60; ++b) {
    std::vector<double> d(n * k);
    std::vector<int64_t> bytes(k);
    for (int i = 0; i < k; ++i) {
      bytes[i] = static_cast<int64_t>(kMiB * (1 + rng() % 8));
      int lr = b < 20 ? 3 : b < 40 ? static_cast<int>(rng() % n) : 6;
      if (u(rng) < 0.2) lr = static_cast<int>(rng() % n);
      const double delay = u(rng) * 0.01;
      for (int r = 0; r < n; ++r) d[r * k + i] = 0.02 + u(rng) * 20e-6 + (r == lr ? -delay : 0.0);
      if (u(rng) < 0.05) d[(rng() % n) * k + i] = -1;
    }
    batches.push_back(d);
    sizes.push_back(bytes);
  }
  StragglerProfiler a(n, defaults()), b(n, defaults());
  for (size_t i = 0; i < batches.size(); ++i) {
    const bool ca = a.add_batch(batches[i], k, sizes[i], LinkModel{}, i * k);
    const bool cb = b.add_batch(batches[i], k, sizes[i], LinkModel{}, i * k);
    EXPECT_EQ(ca, cb);
  }
  expect_same(a.summary(), b.summary());
  EXPECT_GE(a.summary().decisions_total, 2u);  // rank 3 adopted, later rank 6
  EXPECT_EQ(a.straggler(), 6);
}

TEST(StragglerProfiler, TiesGoToLowestRank) {
  StragglerProfiler p(4, defaults());
  // Call 0: ranks 1 and 3 tie for the shortest duration: last = 1, delay 0 (insignificant).
  // Call 1: rank 2 alone shortest by 1 ms.
  // d[r*2 + i]
  const std::vector<double> d = {0.005, 0.005, /*r1*/ 0.001, 0.005, /*r2*/ 0.005, 0.004, /*r3*/ 0.001, 0.005};
  p.add_batch(d, 2, {kMiB, kMiB}, LinkModel{}, 0);
  const auto s = p.summary();
  ASSERT_EQ(s.recent_last.size(), 2u);
  EXPECT_EQ(s.recent_last[0], -1);
  EXPECT_EQ(s.recent_delays_s[0], 0.0);
  EXPECT_EQ(s.recent_last[1], 2);
  EXPECT_NEAR(s.recent_delays_s[1], 0.001, 1e-12);
}

TEST(StragglerProfiler, ResetAndDisabled) {
  StragglerProfiler p(8, defaults());
  Feeder f{p, 8};
  f.repeat(late(3, 0.005), 2);
  ASSERT_EQ(p.straggler(), 3);
  p.reset_decision("user asked");
  EXPECT_EQ(p.straggler(), -1);
  auto s = p.summary();
  ASSERT_EQ(s.decisions.size(), 2u);
  EXPECT_EQ(s.decisions[1].straggler, -1);
  EXPECT_EQ(s.decisions[1].reason, "user asked");
  EXPECT_EQ(s.decisions[1].call, 32u);
  p.reset_decision("again");  // no change, no decision
  EXPECT_EQ(p.summary().decisions.size(), 2u);
  // Hysteresis restarts: needs `patience` batches again.
  EXPECT_FALSE(f.batch(std::vector<Call>(16, late(3, 0.005))));
  EXPECT_TRUE(f.batch(std::vector<Call>(16, late(3, 0.005))));

  ProfilerSettings st;
  st.enabled = false;
  StragglerProfiler q(8, st);
  Feeder g{q, 8};
  EXPECT_EQ(g.repeat(late(3, 0.005), 5), 0);
  EXPECT_EQ(q.straggler(), -1);
  EXPECT_EQ(q.summary().candidate, 3);
  EXPECT_EQ(q.summary().calls, 80u);
}

TEST(StragglerProfiler, BoundedMemory) {
  StragglerProfiler p(4, defaults());
  Feeder f{p, 4};
  f.repeat(late(1, 0.005), 300);  // 4800 calls
  const auto s = p.summary();
  EXPECT_EQ(s.recent_delays_s.size(), StragglerProfiler::kRecentCalls);
  EXPECT_EQ(s.recent_last.size(), StragglerProfiler::kRecentCalls);
  EXPECT_EQ(s.window_last_counts[1], 64);
  EXPECT_EQ(s.last_counts[1], 4800);
}

TEST(StragglerProfiler, RecentDelaysAreTheNewestInOrder) {
  // Distinct delays (1 us apart; the early ranks differ by 0.1 us) across more calls than the
  // profiler keeps: the summary lists the newest
  // kRecentCalls oldest first, recent_delays(count) the newest `count`, the window its last 64.
  StragglerProfiler p(3, defaults());
  const size_t total = StragglerProfiler::kRecentCalls + 1000;
  std::vector<Call> calls;
  for (size_t i = 0; i < total; ++i) calls.push_back(late(static_cast<int>(i % 3), 1e-3 + 1e-6 * i));
  for (size_t first = 0; first < total; first += 700) {
    const std::vector<Call> batch(calls.begin() + first,
                                  calls.begin() + std::min(total, first + 700));
    p.add_batch(durations_for(3, batch), static_cast<int>(batch.size()),
                std::vector<int64_t>(batch.size(), kMiB), LinkModel{}, first);
  }
  const auto s = p.summary();
  ASSERT_EQ(s.recent_delays_s.size(), StragglerProfiler::kRecentCalls);
  for (size_t j = 0; j < s.recent_delays_s.size(); ++j) {
    const size_t i = total - StragglerProfiler::kRecentCalls + j;
    EXPECT_NEAR(s.recent_delays_s[j], 1e-3 + 1e-6 * i, 2e-7) << j;
    EXPECT_EQ(s.recent_last[j], static_cast<int>(i % 3)) << j;
  }
  const std::vector<double> last5 = p.recent_delays(5);
  ASSERT_EQ(last5.size(), 5u);
  EXPECT_NEAR(last5.back(), 1e-3 + 1e-6 * (total - 1), 2e-7);
  EXPECT_NEAR(last5.front(), 1e-3 + 1e-6 * (total - 5), 2e-7);
  int64_t window = 0;
  for (int64_t c : s.window_last_counts) window += c;
  EXPECT_EQ(window, 64);
}

TEST(RecentBuffer, KeepsTheNewestOldestFirst) {
  RecentBuffer<int> b(3);
  EXPECT_TRUE(b.empty());
  b.push(1);
  b.push(2);
  EXPECT_EQ(std::vector<int>(b.begin(), b.end()), (std::vector<int>{1, 2}));
  for (int v = 3; v <= 7; ++v) b.push(v);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], 5);
  EXPECT_EQ(b[2], 7);
  EXPECT_EQ(std::vector<int>(b.begin(), b.end()), (std::vector<int>{5, 6, 7}));
}

void expect_setting_error(const ProfilerSettings& st, const std::string& field) {
  try {
    StragglerProfiler p(4, st);
    ADD_FAILURE() << "no error for " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(StragglerProfiler, SettingsValidation) {
  auto with = [](auto edit) {
    ProfilerSettings s;
    edit(s);
    return s;
  };
  expect_setting_error(with([](ProfilerSettings& s) { s.exchange_every = 0; }), "exchange_every");
  expect_setting_error(with([](ProfilerSettings& s) { s.window = 0; }), "window");
  expect_setting_error(with([](ProfilerSettings& s) { s.patience = 0; }), "patience");
  expect_setting_error(with([](ProfilerSettings& s) { s.adopt_share = 0; }), "adopt_share");
  expect_setting_error(with([](ProfilerSettings& s) { s.adopt_share = 1.5; }), "adopt_share");
  expect_setting_error(with([](ProfilerSettings& s) { s.drop_share = -0.1; }), "drop_share");
  expect_setting_error(with([](ProfilerSettings& s) { s.drop_share = 0.7; }), "drop_share");
  expect_setting_error(with([](ProfilerSettings& s) { s.min_gain_s = NAN; }), "min_gain_s");
  expect_setting_error(with([](ProfilerSettings& s) { s.noise_floor_s = -1; }), "noise_floor_s");
  EXPECT_THROW(StragglerProfiler(0, ProfilerSettings{}), Error);

  StragglerProfiler p(4, ProfilerSettings{});
  EXPECT_THROW(p.add_batch(std::vector<double>(7), 2, {1, 1}, LinkModel{}, 0), Error);
  EXPECT_THROW(p.add_batch(std::vector<double>(8), 2, {1}, LinkModel{}, 0), Error);
  EXPECT_THROW(p.add_batch(std::vector<double>(8), 2, {1, -1}, LinkModel{}, 0), Error);
  EXPECT_THROW(p.add_batch(std::vector<double>(8), 2, {1, 1}, LinkModel{-1, 1e-9}, 0), Error);
  EXPECT_THROW(p.add_batch({}, -1, {}, LinkModel{}, 0), Error);
  EXPECT_FALSE(p.add_batch({}, 0, {}, LinkModel{}, 0));
}

}  // namespace
}  // namespace stragg
