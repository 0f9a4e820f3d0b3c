// The dynamic straggler's wait-or-proceed rule (AdapCC §IV-C), as a pure function (no torch).
//
// After the (n-1)-th arrival the early ranks wait up to W for the last one; if it comes, plain
// Ring runs, otherwise StragglAR starts without it. From the (n-1)-th arrival, for a straggler
// delay d:   d <= W: d + T_ring        d > W: W + max(d - W, T_rs) + T_post
// Without history W = c, StragglAR's critical delay (App. B): the break-even (ski-rental) choice,
// never worse than twice the best. With recent delays (identical on every rank: they come from
// the profiler's exchanges) W minimises the expected cost over them; the candidates are "go at
// once" (kMinWindowS), just above each recent delay below c, and c.
#pragma once

#include <vector>

#include "plan/link_model.h"

namespace stragg {

inline constexpr double kMinWindowS = 50e-6;

// The window in seconds for a call of `bytes` among n ranks (n < 3: kMinWindowS).
double wait_or_proceed_window_s(int n, double bytes, const LinkModel& link,
                                const std::vector<double>& recent_delays_s);

}  // namespace stragg
