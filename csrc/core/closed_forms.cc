#include "core/closed_forms.h"

#include <algorithm>
#include <cmath>

#include "core/ir.h"

namespace stragg {
namespace core {
namespace closed_form {

namespace {
double lg(int n) { return std::log2(static_cast<double>(n)); }
int ilog2_exact(int n, const char* what) {
  int l = 0;
  while ((1 << l) < n) ++l;
  if ((1 << l) != n)
    throw ScheduleError(std::string(what) + ": needs a power-of-2 n, got " + std::to_string(n));
  return l;
}
}  // namespace

double ring(int n, double s, double a, double b) { return 2.0 * (n - 1) * a + 2.0 * (n - 1) / n * s * b; }
double rhd(int n, double s, double a, double b) { return 2.0 * lg(n) * a + 2.0 * (n - 1) / n * s * b; }
double direct(int n, double s, double a, double b) { return 2.0 * a + 2.0 * (n - 1) / n * s * b; }

double stragglar_reduce_scatter(int n, double s, double a, double b) {
  return (n - 2) * (a + s * b / (n - 1));
}
double stragglar_best(int n, double s, double a, double b) {
  return (n + lg(n) - 2) * (a + s * b / (n - 1));
}
double stragglar_worst(int n, double s, double a, double b) {
  return (2.0 * (n - 2) + lg(n)) * (a + s * b / (n - 1));
}
double stragglar_critical_delay(int n, double s, double a, double b) {
  return stragglar_worst(n, s, a, b) - ring(n, s, a, b);
}
double stragglar_critical_delay_approx(int n, double s, double a, double b) {
  return (lg(n) - 2) * a + lg(n) / n * s * b;
}
double bcast_best(int n, double s, double a, double b) { return lg(n) * (a + s * b); }
double bcast_worst(int n, double s, double a, double b) {
  return (2.0 * n + lg(n) - 4) * a + (lg(n) + 2.0 * (n - 2) / (n - 1)) * s * b;
}

double optcc_t0(int p) { return 2.0 * (p - 1) / p; }
double optcc_single_limit(int p, double l) {
  return l >= 2 ? l : 2.0 * (p - 1) * l / ((p - 2) * l + 2);
}
double optcc_multi_limit(int p, const std::vector<double>& l) {
  const int m = static_cast<int>(l.size());
  const double l1 = *std::max_element(l.begin(), l.end());
  return l1 < 2 ? 2.0 * (p - 1) / (p - m) : l1 + 2.0 * (m - 1) / (p - m);
}
double optcc_single_lower_bound(int p, double l) {
  return std::max(2.0 * l * (p - 1) / (l * (p - 2) + 2), l);
}
double optcc_multi_lower_bound(int p, const std::vector<double>& l) {
  const int m = static_cast<int>(l.size());
  double inv = 0;
  for (double x : l) inv += 1.0 / x;
  const double l1 = *std::max_element(l.begin(), l.end());
  return std::max(2.0 * (p - 1) / (p - m + inv), l1);
}
double optcc_single_finite(int p, double l, int k) {
  return optcc_single_limit(p, l) * (k + 1.0) / k;
}

double sc_rd_reduce_scatter(int n, double m, double a, double b, double d, double r, int tau) {
  const int L = ilog2_exact(n, "sc_rd_reduce_scatter");
  double t = 0;
  for (int i = 0; i < L; ++i) {
    const double msg = m / std::pow(2.0, i + 1);
    if (i < tau)
      t += a + std::pow(2.0, i) * d + std::pow(2.0, i) * msg * b;
    else
      t += a + r + d + msg * b;
  }
  return t;
}
double sc_rd_allgather(int n, double m, double a, double b, double d, double r, int tau_ag) {
  const int L = ilog2_exact(n, "sc_rd_allgather");
  double t = 0;
  for (int j = 0; j < L; ++j) {
    const int i = L - 1 - j;  // distance 2^i, message m/2^(i+1)
    const double msg = m / std::pow(2.0, i + 1);
    if (j < tau_ag)
      t += a + r + d + msg * b;
    else
      t += a + std::pow(2.0, i) * d + std::pow(2.0, i) * msg * b;
  }
  return t;
}
double sc_ring_reduce_scatter(int n, double m, double a, double b, double d) {
  return (n - 1) * (a + d + m / n * b);
}

ShortCircuitChoice sc_choose(int n, double m, double a, double b, double d, double r) {
  const int L = ilog2_exact(n, "sc_choose");
  ShortCircuitChoice c;
  const double ring_half = sc_ring_reduce_scatter(n, m, a, b, d);
  c.ring_time = 2 * ring_half;
  double rs = ring_half, ag = ring_half;
  for (int tau = 0; tau <= L; ++tau) {
    const double t = sc_rd_reduce_scatter(n, m, a, b, d, r, tau);
    if (t <= ring_half) {
      c.tau_rs = tau;
      rs = t;
      break;
    }
  }
  for (int tau = L; tau >= 0; --tau) {  // mirror of "smallest tau": most reconfigured first
    const double t = sc_rd_allgather(n, m, a, b, d, r, tau);
    if (t <= ring_half) {
      c.tau_ag = tau;
      ag = t;
      break;
    }
  }
  c.time = rs + ag;
  return c;
}

}  // namespace closed_form
}  // namespace core
}  // namespace stragg
