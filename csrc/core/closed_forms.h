// Closed-form costs from the papers (the tests' ground truth for the simulator, and a quick
// reference for the planner and CLIs). s = buffer bytes; times in the unit of alpha / beta*byte.
#pragma once

#include <vector>

namespace stragg {
namespace core {
namespace closed_form {

// StragglAR §3.2, Table 1, App. B, App. F.
double ring(int n, double s, double alpha, double beta);    // 2(n-1)a + 2(n-1)/n s b
double rhd(int n, double s, double alpha, double beta);     // 2 log2(n) a + 2(n-1)/n s b (n = 2^k)
double direct(int n, double s, double alpha, double beta);  // 2a + 2(n-1)/n s b
// Ring reduce-scatter among the n-1 early ranks: (n-2)(a + s b/(n-1)).
double stragglar_reduce_scatter(int n, double s, double alpha, double beta);
// Ideal (straggler delay >= reduce-scatter): (n + log n - 2)(a + s b/(n-1)).
double stragglar_best(int n, double s, double alpha, double beta);
// No delay: (2(n-2) + log n)(a + s b/(n-1)).
double stragglar_worst(int n, double s, double alpha, double beta);
// Delay above which StragglAR beats Ring (exact: worst - ring, App. B before simplification).
double stragglar_critical_delay(int n, double s, double alpha, double beta);
// App. B's simplified form (log n - 2) a + (log n / n) s b.
double stragglar_critical_delay_approx(int n, double s, double alpha, double beta);
double bcast_best(int n, double s, double alpha, double beta);   // log n (a + s b)
double bcast_worst(int n, double s, double alpha, double beta);  // (2n+log n-4)a + (log n + 2(n-2)/(n-1)) s b

// OptCC (bandwidth-only model, in units of s*beta; T0 = 2(p-1)/p).
double optcc_t0(int p);
// Table 3 limits as k -> infinity.
double optcc_single_limit(int p, double l);
double optcc_multi_limit(int p, const std::vector<double>& l);
// Lower bounds: Theorem 6 (single straggler) and Theorem 2 (multiple).
double optcc_single_lower_bound(int p, double l);
double optcc_multi_lower_bound(int p, const std::vector<double>& l);
// Finite-k time of our construction (see optcc.cc): (k+1)/k times the limit for s3_first.
double optcc_single_finite(int p, double l, int k);

// short-circuit-rings §2.3/§3 (n = 2^k, message m bytes, per-hop delay d, reconfiguration r).
// Reduce-scatter by recursive halving with step i at distance 2^i, message m/2^(i+1):
// static ring step i costs a + 2^i d + 2^i (m/2^(i+1)) b (congestion 2^i); a reconfigured step
// costs a + r + d + (m/2^(i+1)) b. Steps i >= tau are reconfigured (tau = log n: never).
double sc_rd_reduce_scatter(int n, double m, double alpha, double beta, double d, double r, int tau);
// Allgather mirror: step j (distance 2^(log n - 1 - j)) is reconfigured for j < tau_ag.
double sc_rd_allgather(int n, double m, double alpha, double beta, double d, double r, int tau_ag);
// Ring reduce-scatter (= allgather) on the static ring: (n-1)(a + d + m/n b).
double sc_ring_reduce_scatter(int n, double m, double alpha, double beta, double d);

struct ShortCircuitChoice {
  int tau_rs = -1;  // -1: use Ring for the reduce-scatter
  int tau_ag = -1;  // -1: use Ring for the allgather
  double time = 0;  // predicted allreduce time of the choice
  double ring_time = 0;
};
// The paper's rule: smallest tau with RD(tau) <= Ring for the reduce-scatter (and the mirror
// for the allgather), otherwise fall back to Ring; never worse than Ring by construction.
ShortCircuitChoice sc_choose(int n, double m, double alpha, double beta, double d, double r);

}  // namespace closed_form
}  // namespace core
}  // namespace stragg
