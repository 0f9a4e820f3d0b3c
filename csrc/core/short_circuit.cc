// Short-circuit-rings (§3): Recursive Doubling that reconfigures the ring into direct circuits
// from step tau on, with the paper's rule for tau; falls back to Ring per phase when no tau is
// at least as fast. The schedule marks reconfigured steps (Step::reconfigure) so the
// ring-topology cost model charges reconfiguration instead of hops and congestion.
#include <numeric>

#include "core/closed_forms.h"
#include "core/generators.h"

namespace stragg {
namespace core {

Schedule short_circuit(int n, double nbytes, double alpha, double beta, double hop_delay,
                       double reconfig_delay, int tau_rs, int tau_ag) {
  if (!detail::is_pow2(n))
    throw ScheduleError("short_circuit: needs a power-of-2 n, got " + std::to_string(n));
  const int L = detail::ceil_log2(n);
  if (tau_rs == -2 || tau_ag == -2) {
    closed_form::ShortCircuitChoice c =
        closed_form::sc_choose(n, nbytes, alpha, beta, hop_delay, reconfig_delay);
    if (tau_rs == -2) tau_rs = c.tau_rs;
    if (tau_ag == -2) tau_ag = c.tau_ag;
  }
  if (tau_rs < -1 || tau_rs > L || tau_ag < -1 || tau_ag > L)
    throw ScheduleError("short_circuit: tau must be in [0, log2 n] or -1 (ring)");

  // Every variant leaves rank r owning chunk bitreverse(r) after the reduce-scatter, so RD and
  // Ring halves combine freely.
  Schedule rd_rs = rhd_reduce_scatter(n);
  Schedule rd_ag = rhd_allgather(n);
  std::vector<int> ranks(n), owned(n);
  std::iota(ranks.begin(), ranks.end(), 0);
  for (int c = 0; c < n; ++c) owned[rd_rs.chunk_owner[c]] = c;

  Schedule s = Schedule::make("short_circuit", Collective::kAllReduce, n, n);
  s.phases = {"reduce_scatter", "allgather"};
  if (tau_rs >= 0) {
    for (int i = tau_rs; i < L; ++i) rd_rs.steps[i].reconfigure = true;
    append_steps(s, rd_rs);
  } else {
    detail::append_ring_reduce_scatter(s, ranks, owned, 1, 0, false);
  }
  if (tau_ag >= 0) {
    for (int j = 0; j < tau_ag && j < L; ++j) rd_ag.steps[j].reconfigure = true;
    append_steps(s, rd_ag);
  } else {
    detail::append_ring_allgather(s, ranks, owned, 1, 1, false);
  }
  s.chunk_owner.assign(n, -1);
  s.params_json = "{\"tau_rs\": " + std::to_string(tau_rs) + ", \"tau_ag\": " +
                  std::to_string(tau_ag) + "}";
  return s;
}

}  // namespace core
}  // namespace stragg
