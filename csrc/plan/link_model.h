// The alpha-beta cost model of a link (no torch here): a message of m bytes takes
// alpha_s + m * beta_s_per_byte. The defaults are THE cost-model defaults of stragg (used until
// link probes measure the real values; STRAGG_ALPHA_US / STRAGG_BANDWIDTH_GBPS override them).
#pragma once

namespace stragg {

inline constexpr double kDefaultAlphaS = 60e-6;
inline constexpr double kDefaultBandwidthBytesPerS = 3e9;
// The bandwidth a group over TCP assumes instead (10 Gbit/s) when neither default was overridden:
// 3 GB/s is one host's memory, and under it RHD's fewer latencies win large calls that Ring runs
// faster on a network (the first calls of a job, until the calls' rate or a probe corrects it).
inline constexpr double kNetworkBandwidthBytesPerS = 1.25e9;
// Host mates' latency over shared memory (a futex wake-up) until the link probes measure it.
inline constexpr double kDefaultLocalAlphaS = 10e-6;

// A rank whose link is slower by `factor` (measured, or STRAGG_SLOWDOWN=RANK=L,...): OptCC's l.
struct Slowdown {
  int rank = -1;
  double factor = 1.0;
  bool operator==(const Slowdown& o) const { return rank == o.rank && factor == o.factor; }
};

struct LinkModel {
  double alpha_s = kDefaultAlphaS;
  double beta_s_per_byte = 1.0 / kDefaultBandwidthBytesPerS;
};

}  // namespace stragg
