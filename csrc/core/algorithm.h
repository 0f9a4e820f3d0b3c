// The all_reduce algorithms stragg can run, as a type (no torch, no CUDA; header only).
//
// The names are the user's (STRAGG_ALGO, stragg.set_policy, the schedule CLIs); the numeric
// values travel in message headers, so ranks that run different algorithms notice it. Adding an
// algorithm: a value here (append, never renumber), its name in kAlgorithmNames, a generator in
// core/generators.h, its case in core::build(Algorithm, ...) (registry.cc) -- see
// docs/architecture.md.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stragg {

enum class Algorithm : uint8_t {
  Auto = 0,  // chosen per call by the planner
  Ring = 1,
  Rhd = 2,
  Direct = 3,
  Bcast = 4,
  Stragglar = 5,
  Optcc = 6,
  Rd = 7,  // recursive doubling (small messages)
  StragglarDirect = 8,  // StragglAR's pre-arrival, pipelined direct post-arrival (networks)
};

inline constexpr std::array<const char*, 9> kAlgorithmNames = {
    "auto", "ring", "rhd", "direct", "bcast", "stragglar", "optcc", "rd", "stragglar_direct"};

inline const char* algorithm_name(Algorithm a) {
  const auto i = static_cast<size_t>(a);
  return i < kAlgorithmNames.size() ? kAlgorithmNames[i] : "unknown";
}

// The algorithm called `name` (exact, lower case), if any.
inline std::optional<Algorithm> algorithm_from_name(const std::string& name) {
  for (size_t i = 0; i < kAlgorithmNames.size(); ++i) {
    if (name == kAlgorithmNames[i]) return static_cast<Algorithm>(i);
  }
  return std::nullopt;
}

// Algorithms built around one or more straggling ranks (they need to know which).
inline bool algorithm_needs_straggler(Algorithm a) {
  return a == Algorithm::Stragglar || a == Algorithm::Bcast || a == Algorithm::Optcc ||
         a == Algorithm::StragglarDirect;
}

// Algorithms built around exactly one late rank (their schedule is keyed by it).
inline bool algorithm_has_one_straggler(Algorithm a) {
  return a == Algorithm::Stragglar || a == Algorithm::Bcast || a == Algorithm::StragglarDirect;
}

// "auto, ring, rhd, ..." for error messages.
inline std::string algorithm_list() {
  std::string out;
  for (const char* n : kAlgorithmNames) out += std::string(out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace stragg
