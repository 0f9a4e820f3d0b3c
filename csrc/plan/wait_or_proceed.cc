#include "plan/wait_or_proceed.h"

#include <algorithm>

#include "core/closed_forms.h"

namespace stragg {

double wait_or_proceed_window_s(int n, double bytes, const LinkModel& link,
                                const std::vector<double>& delays) {
  constexpr double kAbove = 20e-6;  // margin above an observed delay
  namespace cf = core::closed_form;
  const double a = link.alpha_s, beta = link.beta_s_per_byte;
  const double c = n >= 3 ? cf::stragglar_critical_delay(n, bytes, a, beta) : 0.0;
  double best = std::max(kMinWindowS, c);
  if (n < 3 || delays.empty()) return best;
  const double t_ring = cf::ring(n, bytes, a, beta);
  const double t_rs = cf::stragglar_reduce_scatter(n, bytes, a, beta);
  const double t_post = cf::stragglar_best(n, bytes, a, beta);
  auto expected = [&](double w) {
    double total = 0;
    for (double d : delays) total += d <= w ? d + t_ring : w + std::max(d - w, t_rs) + t_post;
    return total;
  };
  std::vector<double> candidates = {kMinWindowS, best};
  for (double d : delays) {
    if (d + kAbove < c) candidates.push_back(d + kAbove);
  }
  std::sort(candidates.begin(), candidates.end());
  double best_cost = expected(candidates.front());
  best = candidates.front();
  for (double w : candidates) {
    const double cost = expected(w);
    if (cost < best_cost * (1 - 1e-12)) {
      best_cost = cost;
      best = w;
    }
  }
  return best;
}

}  // namespace stragg
