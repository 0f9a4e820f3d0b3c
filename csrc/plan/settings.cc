// The settings table (rows(): one row per STRAGG_* setting with its type, default, accepted
// values, meaning and parser) and the typed views built from it. The table is the one place
// every setting is spelled (C++, Python, pg_options, docs/settings.md).
#include "plan/settings.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>

#include "common/interfaces.h"

namespace stragg {
namespace {

std::string trim_lower(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string out = s.substr(b, e - b);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Shortest text that reads back as the same double ("60", "0.3", "1e-06").
std::string num(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

[[noreturn]] void reject(const SettingValue& v, const std::string& accepted) {
  throw SettingsError("stragg: " + v.source + "='" + v.raw + "' is not accepted (expected " +
                      accepted + ")");
}

bool read_int(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  auto r = std::from_chars(text.data(), text.data() + text.size(), *out);
  return r.ec == std::errc() && r.ptr == text.data() + text.size();
}

bool read_double(const std::string& text, double* out) {
  if (text.empty()) return false;
  auto r = std::from_chars(text.data(), text.data() + text.size(), *out);
  return r.ec == std::errc() && r.ptr == text.data() + text.size() && std::isfinite(*out);
}

int64_t int_in(const SettingValue& v, int64_t lo, int64_t hi, const std::string& accepted) {
  int64_t x = 0;
  if (!read_int(trim_lower(v.raw), &x) || x < lo || x > hi) reject(v, accepted);
  return x;
}

double float_in(const SettingValue& v, double lo, double hi, bool lo_open,
                const std::string& accepted) {
  double x = 0;
  if (!read_double(trim_lower(v.raw), &x) || x > hi || x < lo || (lo_open && x == lo)) {
    reject(v, accepted);
  }
  return x;
}

bool bool_of(const SettingValue& v, const std::string& accepted) {
  const std::string t = trim_lower(v.raw);
  if (t == "1" || t == "true" || t == "on" || t == "yes") return true;
  if (t == "0" || t == "false" || t == "off" || t == "no") return false;
  reject(v, accepted);
}

size_t size_of(const SettingValue& v, size_t lo, const std::string& accepted) {
  size_t x = 0;
  try {
    x = parse_size(v.raw, v.source);
  } catch (const SettingsError&) {
    reject(v, accepted);
  }
  if (x < lo) reject(v, accepted);
  return x;
}

Straggler straggler_of(const SettingValue& v, const std::string& accepted) {
  const std::string t = trim_lower(v.raw);
  if (t == "none") return Straggler::none();
  if (t == "auto") return Straggler::profiled();
  if (t == "dynamic") return Straggler::dynamic();
  int64_t r = 0;
  if (read_int(t, &r) && r >= 0 && r <= std::numeric_limits<int>::max()) {
    return Straggler::of_rank(static_cast<int>(r));
  }
  reject(v, accepted);
}

// "3=2,1=1.5" -> [{1, 1.5}, {3, 2}] (sorted by rank, each rank once, factors >= 1).
std::vector<Slowdown> slowdowns_of(const SettingValue& v, const std::string& accepted) {
  std::vector<Slowdown> out;
  const std::string t = trim_lower(v.raw);
  if (t.empty() || t == "none") return out;
  size_t start = 0;
  while (start <= t.size()) {
    const size_t comma = std::min(t.find(',', start), t.size());
    const std::string item = trim_lower(t.substr(start, comma - start));
    const size_t eq = item.find('=');
    int64_t rank = 0;
    double factor = 0;
    if (eq == std::string::npos || !read_int(trim_lower(item.substr(0, eq)), &rank) || rank < 0 ||
        rank > std::numeric_limits<int>::max() ||
        !read_double(trim_lower(item.substr(eq + 1)), &factor) || factor < 1) {
      reject(v, accepted);
    }
    for (const auto& s : out) {
      if (s.rank == rank) reject(v, accepted + "; rank " + std::to_string(rank) + " is given twice");
    }
    out.push_back({static_cast<int>(rank), factor});
    start = comma + 1;
  }
  std::sort(out.begin(), out.end(), [](const Slowdown& a, const Slowdown& b) {
    return a.rank < b.rank;
  });
  return out;
}

std::string slowdowns_text(const std::vector<Slowdown>& s) {
  if (s.empty()) return "none";
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ",") + std::to_string(x.rank) + "=" + num(x.factor);
  return out;
}

using Setter = void (*)(Settings&, const SettingValue&, const std::string& accepted);
using Getter = std::string (*)(const Settings&);

struct Row {
  SettingInfo info;
  Setter set;
  Getter get;
};

template <typename E, size_t N>
E choice_of(const SettingValue& v, const std::array<const char*, N>& names,
            const std::string& accepted) {
  const std::string t = trim_lower(v.raw);
  for (size_t i = 0; i < N; ++i) {
    if (t == names[i]) return static_cast<E>(i);
  }
  reject(v, accepted);
}

constexpr std::array<const char*, 5> kTransportNames = {"auto", "shm", "tcp", "gloo", "mixed"};
constexpr std::array<const char*, 3> kDebugNames = {"off", "info", "detail"};
constexpr std::array<const char*, 3> kHostLevelNames = {"auto", "on", "off"};

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      {{"transport", "STRAGG_TRANSPORT", "choice", "auto", "one of auto, shm, tcp, mixed, gloo",
        "auto: shared memory when all ranks are on one host (same boot and network namespace), "
        "TCP when every rank is alone on its host, mixed otherwise; mixed: shared memory to the "
        "ranks on the same host and TCP to the others; shm / tcp / mixed: force one; gloo: run "
        "the reduction on the inner Gloo backend (same semantics, no stragg transport)",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.transport = choice_of<TransportChoice>(v, kTransportNames, a);
       },
       [](const Settings& s) { return std::string(transport_choice_name(s.transport)); }},
      {{"algo", "STRAGG_ALGO", "choice", "auto", "one of " + algorithm_list(),
        "all_reduce schedule: ring (pipelined Ring), rhd, direct, bcast, stragglar, optcc, rd "
        "(recursive doubling), stragglar_direct (StragglAR's pre-arrival, pipelined direct "
        "post-arrival), or auto (chosen per call by the planner, see docs/algorithms.md)",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.algo = choice_of<Algorithm>(v, kAlgorithmNames, a);
       },
       [](const Settings& s) { return std::string(algorithm_name(s.algo)); }},
      {{"host_level", "STRAGG_HOST_LEVEL", "choice", "auto", "one of auto, on, off",
        "groups whose ranks share hosts: auto lets the cost model weigh host-level plans (a "
        "reduce-scatter inside each host, the cross-host schedule on 1/K of the buffer per host "
        "mate, an allgather inside each host) against flat ones; on: host-level plans only (an "
        "explicit STRAGG_ALGO then runs across hosts); off: flat plans only",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.host_level = choice_of<HostLevelPolicy>(v, kHostLevelNames, a);
       },
       [](const Settings& s) { return std::string(host_level_name(s.host_level)); }},
      {{"straggler", "STRAGG_STRAGGLER", "rank or mode", "auto",
        "a rank of the group, auto, dynamic or none",
        "auto: the profiler's persistent straggler, if any; a rank: known to arrive last "
        "(StragglAR lets the others reduce-scatter while it is late); dynamic: per call, "
        "whichever rank arrives last, agreed by all ranks; none",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.straggler = straggler_of(v, a);
       },
       [](const Settings& s) { return s.straggler.to_string(); }},
      {{"dynamic_window_us", "STRAGG_DYNAMIC_WINDOW_US", "microseconds or auto", "auto",
        "auto or an integer >= 0",
        "dynamic mode: how long the first n-1 arrivals wait for the last one before starting "
        "without it; auto: per call from the cost model",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.dynamic_window_us = trim_lower(v.raw) == "auto"
                                   ? -1
                                   : int_in(v, 0, std::numeric_limits<int64_t>::max() / 2, a);
       },
       [](const Settings& s) {
         return s.dynamic_window_us < 0 ? std::string("auto") : std::to_string(s.dynamic_window_us);
       }},
      {{"slowdown", "STRAGG_SLOWDOWN", "rank=factor list", "none",
        "none or RANK=L[,RANK=L...] with L >= 1 (e.g. 3=2)",
        "ranks whose links are slower by L, for OptCC (none: as measured by the link probes)",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) { s.slowdowns = slowdowns_of(v, a); },
       [](const Settings& s) { return slowdowns_text(s.slowdowns); }},
      {{"optcc_segments", "STRAGG_OPTCC_SEGMENTS", "int or auto", "auto",
        "auto or an integer from 1 to 1024",
        "OptCC's pipelined segments k (auto: the most segments the cost model predicts within 2% "
        "of the fastest count for the message size)",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.optcc_segments = trim_lower(v.raw) == "auto" ? 0 : static_cast<int>(int_in(v, 1, 1024, a));
       },
       [](const Settings& s) {
         return s.optcc_segments == 0 ? std::string("auto") : std::to_string(s.optcc_segments);
       }},
      {{"alpha_us", "STRAGG_ALPHA_US", "float", num(kDefaultAlphaS * 1e6), "a number >= 0",
        "cost-model latency per message (microseconds) until the link probes measure it", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.alpha_us = float_in(v, 0, 1e9, false, a);
       },
       [](const Settings& s) { return num(s.alpha_us); }},
      {{"bandwidth_gbps", "STRAGG_BANDWIDTH_GBPS", "float",
        num(kDefaultBandwidthBytesPerS / 1e9), "a number > 0",
        "cost-model bandwidth (GB/s) until the link probes measure it (over TCP, when this and "
        "STRAGG_ALPHA_US are left at their defaults: 1.25, a 10 Gbit/s network)",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.bandwidth_gbps = float_in(v, 0, 1e9, true, a);
       },
       [](const Settings& s) { return num(s.bandwidth_gbps); }},
      {{"shm_slot_bytes", "STRAGG_SHM_SLOT_BYTES", "size", "512KiB",
        "a size >= 4KiB (e.g. 512KiB, 1MiB)", "bytes per shared-memory staging slot", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.shm_slot_bytes = size_of(v, 4096, a);
       },
       [](const Settings& s) { return format_size(s.shm_slot_bytes); }},
      {{"shm_slots", "STRAGG_SHM_SLOTS", "int", "4", "an integer from 1 to 1024",
        "shared-memory staging slots per directed channel", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.shm_slots = static_cast<size_t>(int_in(v, 1, 1024, a));
       },
       [](const Settings& s) { return std::to_string(s.shm_slots); }},
      {{"spin_us", "STRAGG_SPIN_US", "microseconds or auto", "auto",
        "auto or an integer from 0 to 1000000",
        "how long a waiting rank busy-polls before yielding (microseconds); auto: 5, or 0 when "
        "a host has more ranks than CPUs (a spinning rank would only delay the peer it waits "
        "for, which needs its CPU)",
        false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.spin_us =
             trim_lower(v.raw) == "auto" ? -1 : static_cast<int>(int_in(v, 0, 1000000, a));
       },
       [](const Settings& s) {
         return s.spin_us < 0 ? std::string("auto") : std::to_string(s.spin_us);
       }},
      {{"yield_us", "STRAGG_YIELD_US", "int", "50", "an integer from 0 to 1000000",
        "how long a waiting rank yields before sleeping on a futex (microseconds)", false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.yield_us = static_cast<int>(int_in(v, 0, 1000000, a));
       },
       [](const Settings& s) { return std::to_string(s.yield_us); }},
      {{"oneshot_bytes", "STRAGG_ONESHOT_BYTES", "size", "16KiB", "a size (0: never)",
        "on one host, an all_reduce up to this size without a straggler runs the one-shot "
        "algorithm under auto: every rank puts its input in shared memory and reduces all "
        "inputs itself, in rank order (one synchronisation instead of log2(n) rounds); each "
        "rank's segment holds two buffers of this size",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.oneshot_bytes = size_of(v, 0, a);
       },
       [](const Settings& s) { return format_size(s.oneshot_bytes); }},
      {{"inline_bytes", "STRAGG_INLINE_BYTES", "size", "256KiB", "a size (0: never)",
        "an all_reduce up to this size runs on the calling thread when no call is queued or "
        "running (saves two thread hand-offs; it is then complete when all_reduce returns, "
        "async_op or not); larger ones run on the worker thread, overlapping the caller's work",
        false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.inline_bytes = size_of(v, 0, a);
       },
       [](const Settings& s) { return format_size(s.inline_bytes); }},
      {{"streaming_bytes", "STRAGG_STREAMING_BYTES", "size", "32MiB", "a size (0: never)",
        "an all_reduce of at least this size writes the data it receives by copying (Ring's "
        "all-gather half) with non-temporal stores: they skip reading the destination from "
        "memory first but leave it out of the caches, a gain once the buffers no longer fit in "
        "them (see docs/benchmarks.md)",
        false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.streaming_bytes = size_of(v, 0, a);
       },
       [](const Settings& s) { return format_size(s.streaming_bytes); }},
      {{"tcp_host", "STRAGG_TCP_HOST", "address", "", "an address or host name (empty: automatic)",
        "address this rank advertises for the TCP transport (default: the local address that "
        "routes to the TCPStore host / MASTER_ADDR)",
        false},
       [](Settings& s, const SettingValue& v, const std::string&) {
         std::string t = v.raw;
         while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
         while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.erase(0, 1);
         s.tcp_host = t;
       },
       [](const Settings& s) { return s.tcp_host; }},
      {{"socket_ifname", "STRAGG_SOCKET_IFNAME", "interfaces", "",
        "interface names as NCCL_SOCKET_IFNAME: a comma list of prefixes, '=' for exact names, "
        "'^' to exclude (empty: GLOO_SOCKET_IFNAME's, else automatic)",
        "network interface whose address this rank's TCP transport uses when STRAGG_TCP_HOST is "
        "not set (default: GLOO_SOCKET_IFNAME's interfaces, else the route toward the TCPStore "
        "host / MASTER_ADDR); of several matching interfaces the first is used",
        false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         try {
           parse_interface_spec(v.raw);
         } catch (const Error&) {
           reject(v, a);
         }
         const InterfaceSpec spec = parse_interface_spec(v.raw);
         s.socket_ifname = spec.empty() ? "" : v.raw;
       },
       [](const Settings& s) { return s.socket_ifname; }},
      {{"tcp_port", "STRAGG_TCP_PORT", "int", "0", "an integer from 0 to 65535",
        "fixed listening port for the TCP transport (0: ephemeral)", false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.tcp_port = static_cast<uint16_t>(int_in(v, 0, 65535, a));
       },
       [](const Settings& s) { return std::to_string(s.tcp_port); }},
      {{"tcp_staging_bytes", "STRAGG_TCP_STAGING_BYTES", "size", "512KiB", "a size >= 4KiB",
        "receive staging per peer for the TCP transport", false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.tcp_staging_bytes = size_of(v, 4096, a);
       },
       [](const Settings& s) { return format_size(s.tcp_staging_bytes); }},
      {{"tcp_pipeline_bytes", "STRAGG_TCP_PIPELINE_BYTES", "size", "64KiB", "a size (0: off)",
        "when a group reaches peers over TCP, schedules that need no staging (Ring, RHD, "
        "StragglAR, OptCC, ...) forward chunks larger than this in segments of about this size, "
        "so a rank passes data on while the rest of its chunk is still arriving (shared memory "
        "does not split)",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.tcp_pipeline_bytes = size_of(v, 0, a);
       },
       [](const Settings& s) { return format_size(s.tcp_pipeline_bytes); }},
      {{"tcp_unsent_bytes", "STRAGG_TCP_UNSENT_BYTES", "size", "256KiB", "a size (0: the kernel's)",
        "while StragglAR runs over TCP, the bytes a data connection holds unsent in the kernel "
        "(TCP_NOTSENT_LOWAT; 0: the kernel's): a send counts as done only when its bytes are about "
        "to leave, so rounds to different peers leave in the schedule's order",
        false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.tcp_unsent_bytes = size_of(v, 0, a);
       },
       [](const Settings& s) { return format_size(s.tcp_unsent_bytes); }},
      {{"plan_check", "STRAGG_PLAN_CHECK", "bool", "1", "1/0 (true/false, on/off, yes/no)",
        "time every move the profiler, the link probes and the host layout make the planner "
        "take (StragglAR for a straggler, OptCC for degraded links, host-level plans) on the "
        "same calls as the plan it would replace and the flat baseline, keep the fastest, and "
        "correct the cost model from what the calls took; 0: trust the cost model",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.plan_check = bool_of(v, a);
       },
       [](const Settings& s) { return std::string(s.plan_check ? "1" : "0"); }},
      {{"profile", "STRAGG_PROFILE", "bool", "1", "1/0 (true/false, on/off, yes/no)",
        "the straggler profiler (stragg.profiler)", true},
       [](Settings& s, const SettingValue& v, const std::string& a) { s.profile = bool_of(v, a); },
       [](const Settings& s) { return std::string(s.profile ? "1" : "0"); }},
      {{"profile_every", "STRAGG_PROFILE_EVERY", "int", "16", "an integer from 1 to 1000000",
        "calls between two profiler exchanges", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.profile_every = static_cast<int>(int_in(v, 1, 1000000, a));
       },
       [](const Settings& s) { return std::to_string(s.profile_every); }},
      {{"profile_window", "STRAGG_PROFILE_WINDOW", "int", "64", "an integer from 1 to 1000000",
        "calls the profiler's decision looks at", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.profile_window = static_cast<int>(int_in(v, 1, 1000000, a));
       },
       [](const Settings& s) { return std::to_string(s.profile_window); }},
      {{"profile_adopt", "STRAGG_PROFILE_ADOPT", "float", "0.5", "a number in (0, 1]",
        "share of the window's significant calls a rank must be last in to become the straggler",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.profile_adopt = float_in(v, 0, 1, true, a);
       },
       [](const Settings& s) { return num(s.profile_adopt); }},
      {{"profile_drop", "STRAGG_PROFILE_DROP", "float", "0.3",
        "a number in [0, 1], at most STRAGG_PROFILE_ADOPT",
        "share below which the straggler is dropped", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.profile_drop = float_in(v, 0, 1, false, a);
       },
       [](const Settings& s) { return num(s.profile_drop); }},
      {{"profile_patience", "STRAGG_PROFILE_PATIENCE", "int", "2", "an integer from 1 to 1000",
        "consecutive exchanges that must agree before the straggler changes", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.profile_patience = static_cast<int>(int_in(v, 1, 1000, a));
       },
       [](const Settings& s) { return std::to_string(s.profile_patience); }},
      {{"profile_min_gain_us", "STRAGG_PROFILE_MIN_GAIN_US", "float", "0", "a number",
        "predicted gain per call (microseconds) StragglAR must exceed to be adopted", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.profile_min_gain_us = float_in(v, -1e12, 1e12, false, a);
       },
       [](const Settings& s) { return num(s.profile_min_gain_us); }},
      {{"profile_noise_us", "STRAGG_PROFILE_NOISE_US", "float", "100", "a number >= 0",
        "delays below this (microseconds) count as nobody being late", true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.profile_noise_us = float_in(v, 0, 1e12, false, a);
       },
       [](const Settings& s) { return num(s.profile_noise_us); }},
      {{"probe_every", "STRAGG_PROBE_EVERY", "int", "64", "an integer from 0 to 1000000",
        "link probe every this many profiler exchanges, once the last probe has cost at most 0.5% of "
        "the job's time since it (0: only on demand)",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.probe_every = static_cast<int>(int_in(v, 0, 1000000, a));
       },
       [](const Settings& s) { return std::to_string(s.probe_every); }},
      {{"probe_budget", "STRAGG_PROBE_BUDGET", "float", "0.05", "a number in (0, 1]",
        "share of the job's time (between and in the calls) the link probes may take until the "
        "first probe has finished; later probes get 40% of it, and a re-probe on drifted call "
        "times waits until the last probe has cost at most this share of the time since it; a "
        "probe's transfers shrink until a slice takes about a quarter of a call",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.probe_budget = float_in(v, 0, 1, true, a);
       },
       [](const Settings& s) { return num(s.probe_budget); }},
      {{"debug", "STRAGG_DEBUG", "choice", "off", "one of off, INFO, DETAIL",
        "INFO: log each group's transport, algorithm and straggler and the profiler's "
        "decisions; DETAIL: also one line per all_reduce",
        false},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         s.debug = trim_lower(v.raw) == "0" ? DebugLevel::Off
                                            : choice_of<DebugLevel>(v, kDebugNames, a);
       },
       [](const Settings& s) {
         return std::string(s.debug == DebugLevel::Off    ? "off"
                            : s.debug == DebugLevel::Info ? "INFO"
                                                          : "DETAIL");
       }},
      {{"cuda_allreduce", "STRAGG_CUDA_ALLREDUCE", "choice", "stragg", "one of stragg, nccl",
        "all_reduce on CUDA tensors in a CUDA build: stragg's GPU executor or the inner NCCL "
        "backend",
        true},
       [](Settings& s, const SettingValue& v, const std::string& a) {
         const std::string t = trim_lower(v.raw);
         if (t != "stragg" && t != "nccl") reject(v, a);
         s.cuda_allreduce = t;
       },
       [](const Settings& s) { return s.cuda_allreduce; }},
  };
  return table;
}

const Row* find_row(const std::string& key) {
  for (const Row& r : rows()) {
    if (r.info.key == key) return &r;
  }
  return nullptr;
}

}  // namespace

const char* transport_choice_name(TransportChoice t) {
  const auto i = static_cast<size_t>(t);
  return i < kTransportNames.size() ? kTransportNames[i] : "unknown";
}

const char* host_level_name(HostLevelPolicy p) {
  const auto i = static_cast<size_t>(p);
  return i < kHostLevelNames.size() ? kHostLevelNames[i] : "unknown";
}

std::string Straggler::to_string() const {
  switch (kind) {
    case Kind::None:
      return "none";
    case Kind::Rank:
      return std::to_string(rank);
    case Kind::Profiled:
      return "auto";
    case Kind::Dynamic:
      return "dynamic";
  }
  return "unknown";
}

LinkModel Settings::link_model() const {
  LinkModel m;
  m.alpha_s = alpha_us * 1e-6;
  m.beta_s_per_byte = 1.0 / (bandwidth_gbps * 1e9);
  return m;
}

LinkModel Settings::initial_link_model(bool over_network) const {
  LinkModel m = link_model();
  if (over_network && alpha_us == kDefaultAlphaS * 1e6 &&
      bandwidth_gbps == kDefaultBandwidthBytesPerS / 1e9) {
    m.beta_s_per_byte = 1.0 / kNetworkBandwidthBytesPerS;
  }
  return m;
}

ProfilerSettings Settings::profiler_settings() const {
  ProfilerSettings p;
  p.enabled = profile;
  p.exchange_every = profile_every;
  p.window = profile_window;
  p.adopt_share = profile_adopt;
  p.drop_share = profile_drop;
  p.patience = profile_patience;
  p.min_gain_s = profile_min_gain_us * 1e-6;
  p.noise_floor_s = profile_noise_us * 1e-6;
  return p;
}

const std::vector<SettingInfo>& settings_table() {
  static const std::vector<SettingInfo> table = [] {
    std::vector<SettingInfo> out;
    for (const Row& r : rows()) out.push_back(r.info);
    return out;
  }();
  return table;
}

Settings parse_settings(const std::vector<SettingValue>& values) {
  Settings s;
  std::map<std::string, std::string> source_of;
  for (const SettingValue& v : values) {
    const Row* row = find_row(v.key);
    if (row == nullptr) {
      std::string known;
      for (const Row& r : rows()) known += (known.empty() ? "" : ", ") + r.info.key;
      throw SettingsError("stragg: " + v.source + ": unknown setting '" + v.key +
                          "' (known: " + known + ")");
    }
    SettingValue value = v;
    if (trim_lower(value.raw).empty()) value.raw = row->info.default_text;
    row->set(s, value, row->info.accepted);
    source_of[v.key] = v.source + "=" + v.raw;
  }
  if (s.profile_drop > s.profile_adopt) {
    auto src = [&](const char* key, const char* env, double x) {
      auto it = source_of.find(key);
      return it != source_of.end() ? it->second : std::string(env) + "=" + num(x) + " (default)";
    };
    throw SettingsError("stragg: " + src("profile_drop", "STRAGG_PROFILE_DROP", s.profile_drop) +
                        " must not exceed " +
                        src("profile_adopt", "STRAGG_PROFILE_ADOPT", s.profile_adopt));
  }
  return s;
}

std::string setting_text(const Settings& s, const std::string& key) {
  const Row* row = find_row(key);
  if (row == nullptr) throw SettingsError("stragg: unknown setting '" + key + "'");
  return row->get(s);
}

std::vector<std::pair<std::string, std::string>> must_match_values(const Settings& s) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Row& r : rows()) {
    if (r.info.must_match) out.emplace_back(r.info.key, r.get(s));
  }
  return out;
}

size_t parse_size(const std::string& text, const std::string& what) {
  const std::string t = trim_lower(text);
  size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  std::string unit = t.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  static const std::map<std::string, size_t> kUnits = {
      {"", 1},           {"b", 1},           {"kib", size_t{1} << 10}, {"mib", size_t{1} << 20},
      {"gib", size_t{1} << 30}, {"kb", 1000}, {"mb", 1000000},       {"gb", 1000000000}};
  int64_t value = 0;
  auto it = kUnits.find(unit);
  if (i == 0 || it == kUnits.end() || !read_int(t.substr(0, i), &value)) {
    const bool ambiguous = unit == "k" || unit == "m" || unit == "g";
    throw SettingsError("stragg: " + what + "='" + text + "' is not a size (expected an integer " +
                        "with an optional unit B, KiB, MiB, GiB (powers of 2) or KB, MB, GB " +
                        "(powers of 10)" + (ambiguous ? "; '" + unit + "' is ambiguous" : "") +
                        ")");
  }
  const auto v = static_cast<size_t>(value);
  if (v != 0 && it->second > std::numeric_limits<size_t>::max() / v) {
    throw SettingsError("stragg: " + what + "='" + text + "' is too large");
  }
  return v * it->second;
}

std::string format_size(size_t bytes) {
  if (bytes == 0) return "0";
  static const std::pair<size_t, const char*> kUnits[] = {
      {size_t{1} << 30, "GiB"}, {size_t{1} << 20, "MiB"}, {size_t{1} << 10, "KiB"}};
  for (const auto& [scale, name] : kUnits) {
    if (bytes % scale == 0) return std::to_string(bytes / scale) + name;
  }
  return std::to_string(bytes);
}

}  // namespace stragg
