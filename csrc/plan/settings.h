// stragg's settings: one typed struct, one table, one parser (no torch here).
//
// Every setting has exactly one row in settings_table(): its key, its environment variable, its
// type, default, accepted values and meaning, and whether all ranks of a group must agree on it.
// The same table serves the environment (STRAGG_*), Python (stragg.set_policy,
// stragg.profiler.configure) and torch's backend options (init_process_group(pg_options=...)):
// Python collects raw text per key, parse_settings() turns it into a Settings or raises a
// SettingsError naming where the value came from, the value, and what is accepted. docs/settings.md's
// table of environment variables is checked against this table by the tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "core/algorithm.h"
#include "plan/link_model.h"
#include "plan/straggler_profiler.h"

namespace stragg {

// An invalid setting (bad value, unknown key). Python sees it as ValueError.
class SettingsError : public Error {
 public:
  explicit SettingsError(const std::string& what) : Error(what) {}
};

// Where all_reduce runs: shared memory (one host), TCP (several hosts), shared memory to the
// ranks of the same host and TCP to the others (Mixed), or the inner Gloo backend; Auto picks
// per group at setup.
enum class TransportChoice : uint8_t { Auto = 0, Shm, Tcp, Gloo, Mixed };
const char* transport_choice_name(TransportChoice t);

// Who straggles, as configured (STRAGG_STRAGGLER): nobody, a known rank, the profiler's
// persistent straggler ("auto"), or whoever arrives last, agreed per call ("dynamic").
struct Straggler {
  enum class Kind : uint8_t { None = 0, Rank, Profiled, Dynamic };
  Kind kind = Kind::Profiled;
  int rank = -1;  // Kind::Rank only

  static Straggler none() { return {Kind::None, -1}; }
  static Straggler of_rank(int r) { return {Kind::Rank, r}; }
  static Straggler profiled() { return {Kind::Profiled, -1}; }
  static Straggler dynamic() { return {Kind::Dynamic, -1}; }
  bool is_rank() const { return kind == Kind::Rank; }
  bool operator==(const Straggler& o) const { return kind == o.kind && rank == o.rank; }
  bool operator!=(const Straggler& o) const { return !(*this == o); }
  // "none", "3", "auto", "dynamic" (what STRAGG_STRAGGLER accepts).
  std::string to_string() const;
};

enum class DebugLevel : uint8_t { Off = 0, Info, Detail };

// Host-level plans (STRAGG_HOST_LEVEL) for groups whose ranks share hosts: chosen by the cost
// model (Auto), always where the hosts allow it (On), never (Off).
enum class HostLevelPolicy : uint8_t { Auto = 0, On, Off };
const char* host_level_name(HostLevelPolicy p);

// Every field in the unit the user writes (the table's), so values round-trip exactly.
struct Settings {
  TransportChoice transport = TransportChoice::Auto;
  Algorithm algo = Algorithm::Auto;
  HostLevelPolicy host_level = HostLevelPolicy::Auto;
  Straggler straggler = Straggler::profiled();
  int64_t dynamic_window_us = -1;   // dynamic straggler's wait-or-proceed window; -1: cost model
  std::vector<Slowdown> slowdowns;  // forced degraded ranks; empty: as measured by link probes
  int optcc_segments = 0;           // OptCC's pipelined segments k; 0: chosen by the cost model
  double alpha_us = kDefaultAlphaS * 1e6;                   // cost model until link probes
  double bandwidth_gbps = kDefaultBandwidthBytesPerS / 1e9;  // measure it
  size_t shm_slot_bytes = 512 * 1024;
  size_t shm_slots = 4;
  int spin_us = -1;  // -1: auto (group_setup: 5, or 0 when the host is oversubscribed)
  int yield_us = 50;
  size_t oneshot_bytes = 16 * 1024;  // one-shot all_reduce up to this size on one host (0: never)
  size_t inline_bytes = 256 * 1024;  // calls up to this size run on the caller's thread (0: none)
  size_t streaming_bytes = 32 << 20;  // calls from this size copy with non-temporal stores (0: none)
  std::string tcp_host;  // empty: the local address that routes to the store host
  std::string socket_ifname;  // interfaces for TCP (common/interfaces.h); empty: tcp_host's rule
  uint16_t tcp_port = 0;
  size_t tcp_staging_bytes = 512 * 1024;
  size_t tcp_pipeline_bytes = 64 * 1024;  // over TCP, chunks are forwarded in such segments
  size_t tcp_unsent_bytes = 256 * 1024;   // TCP_NOTSENT_LOWAT while StragglAR runs (0: kernel's)
  bool profile = true;
  int profile_every = 16;
  int profile_window = 64;
  double profile_adopt = 0.5;
  double profile_drop = 0.3;
  int profile_patience = 2;
  double profile_min_gain_us = 0;
  double profile_noise_us = 100;
  int probe_every = 64;  // link probe every this many profiler exchanges (0: on demand only)
  double probe_budget = 0.05;  // share of the job's time the first link probe may take
  bool plan_check = true;  // time the planner's moves and undo those that slow the calls
  DebugLevel debug = DebugLevel::Off;
  std::string cuda_allreduce = "stragg";  // "stragg" (GPU executor) or "nccl" (inner NCCL)

  LinkModel link_model() const;
  // The cost model until probes measure the links, for a group whose messages cross a network
  // (`over_network`): link_model(), with kNetworkBandwidthBytesPerS where neither
  // STRAGG_ALPHA_US nor STRAGG_BANDWIDTH_GBPS differs from its default.
  LinkModel initial_link_model(bool over_network) const;
  ProfilerSettings profiler_settings() const;
};

// One row of the table.
struct SettingInfo {
  std::string key;           // "shm_slots" (Python / backend options name)
  std::string env;           // "STRAGG_SHM_SLOTS"
  std::string type;          // "int", "size", "float", "bool", "choice", ...
  std::string default_text;  // as a user would write it
  std::string accepted;      // "an integer >= 1"
  std::string meaning;       // one sentence for docs
  bool must_match = false;   // all ranks of a group must use the same value
};
const std::vector<SettingInfo>& settings_table();

// A raw value and where it came from ("STRAGG_SHM_SLOTS", "stragg.set_policy(algo=...)",
// "pg_options['algo']"), used in error messages.
struct SettingValue {
  std::string key;
  std::string raw;
  std::string source;
};

// Defaults overridden by `values` in order (a later value for the same key wins). Empty raw text
// means "default". Throws SettingsError naming the source, the value and what is accepted, or
// the unknown key.
Settings parse_settings(const std::vector<SettingValue>& values);

// The canonical text of setting `key` in `s` (round-trips through parse_settings).
std::string setting_text(const Settings& s, const std::string& key);

// (key, canonical text) of every must-match setting, in table order.
std::vector<std::pair<std::string, std::string>> must_match_values(const Settings& s);

// Sizes: a non-negative integer with an optional unit: B, KiB, MiB, GiB (powers of 2) or KB, MB,
// GB (powers of 10), case-insensitive, spaces allowed ("512KiB", "1 MiB", "4096"). Bare K/M/G
// are rejected as ambiguous. Throws SettingsError naming `what`.
size_t parse_size(const std::string& text, const std::string& what);
// Inverse for display: "512KiB", "1MiB", "1000" (the largest binary unit that divides exactly).
std::string format_size(size_t bytes);

}  // namespace stragg
