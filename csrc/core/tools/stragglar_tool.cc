// Offline driver for stragglar_search.py: runs one StragglAR construction, or expands designs in
// the stored form, and checks every result with the schedule verifier (core/verifier.h).
//
//   stragglar_tool construct NAME N [RESTARTS SEED]
//       NAME: library (what stragglar(N) builds now), matching, circulant_greedy, two_chain,
//       appendix_e. Prints one JSON object: n, construction, rounds (post-arrival), ok, error,
//       and the schedule in the stored form (beta "", tail_from 0, tail: every round).
//   stragglar_tool check < FILE
//       FILE: one design per line, "N CONSTRUCTION MAX_AGE BETA TAIL_FROM TAIL" ("-" for an empty
//       BETA or TAIL). Prints one JSON object per line: n, construction, rounds, ok, error.
// Built with -DSTRAGG_CORE_TOOLS=ON (needs LEMON for appendix_e).
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>

#include "core/generators.h"
#include "core/stragglar_internal.h"
#include "core/verifier.h"
#include "stragglar_appendix_e.h"

namespace {

using namespace stragg::core;
using json = nlohmann::json;

constexpr char kAgeChars[] = ".123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

// The pre-arrival ring reduce-scatter among ranks 0 .. n-2, as stragglar(n) starts.
Schedule base(int n) {
  Schedule s = Schedule::make("stragglar", Collective::kAllReduce, n, n - 1);
  s.stragglers = {n - 1};
  s.phases = {"pre_arrival_reduce_scatter", "stragglar"};
  std::vector<int> ranks(n - 1);
  std::iota(ranks.begin(), ranks.end(), 0);
  detail::append_ring_reduce_scatter(s, ranks, ranks, 1, 0, /*pre_arrival=*/true);
  return s;
}

// Post-arrival receives of a full schedule in the stored form. The straggler's partner of round r
// becomes rank r (and its chunk chunk r), so adaptive-partner schedules encode too.
std::string encode(const Schedule& full) {
  const int n = full.n, m = n - 1, sigma = n - 1;
  Schedule s = full.expanded();
  int first = -1;
  for (const Step& st : s.steps)
    if (!st.pre_arrival && (first < 0 || st.round < first)) first = st.round;
  const int rounds = s.num_post_arrival_rounds();
  std::vector<int> to_new(n, -1);
  for (const Step& st : s.steps)
    for (const Transfer& t : st.transfers)
      if (!st.pre_arrival && is_reduce(t.op) && t.dst == sigma)
        to_new[t.src] = st.round - first;
  std::string tail(static_cast<size_t>(rounds) * m, '.');
  for (const Step& st : s.steps) {
    if (st.pre_arrival) continue;
    const int r = st.round - first;
    for (const Transfer& t : st.transfers) {
      if (t.op != RecvAction::kCopy || t.dst == sigma) continue;
      const int age = r - to_new[t.chunk];
      if (to_new[t.dst] < 0 || age < 1 || age > 61)
        throw ScheduleError("stragglar_tool: cannot encode round " + std::to_string(r));
      tail[static_cast<size_t>(r) * m + to_new[t.dst]] = kAgeChars[age];
    }
  }
  return tail;
}

json result(const Schedule& full, const std::string& construction) {
  VerifyResult v = verify(full);
  return {{"n", full.n},       {"construction", construction},
          {"rounds", full.num_post_arrival_rounds()},
          {"ok", v.ok},        {"error", v.error}};
}

Schedule construct(const std::string& name, int n, int restarts, uint64_t seed) {
  using namespace stragglar_impl;
  if (name == "library") return stragglar(n, -1);
  Schedule s = base(n);
  CirculantDesign d;
  if (name == "matching") {
    append_general_best(s, 1);
  } else if (name == "circulant_greedy") {
    if (!load_design(n, d)) throw ScheduleError("no stored circulant design for this n");
    s = circulant_schedule(s, 1, d);
  } else if (name == "two_chain") {
    if (!construct_design(n, d)) throw ScheduleError("no two-chain design for this n");
    PropagationState ps(n);
    append_circulant(s, 1, d, ps);
  } else if (name == "appendix_e") {
    append_steps(s, tools::appendix_e(n, restarts, seed));
  } else {
    throw ScheduleError("unknown construction " + name);
  }
  return s;
}

int check(std::istream& in) {
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    int n = 0, max_age = 0, tail_from = 0;
    std::string name, beta, tail;
    if (!(ls >> n >> name >> max_age >> beta >> tail_from >> tail)) continue;
    json out;
    try {
      Schedule s = base(n);
      stragglar_impl::expand_design(s, 1, beta == "-" ? "" : beta, max_age, tail_from,
                                    tail == "-" ? "" : tail);
      out = result(s, name);
    } catch (const std::exception& e) {
      out = {{"n", n}, {"construction", name}, {"ok", false}, {"error", e.what()}};
    }
    std::cout << out.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "check") return check(std::cin);
  if (cmd != "construct" || argc < 4) {
    std::cerr << "usage: stragglar_tool construct NAME N [RESTARTS SEED] | check < FILE\n";
    return 2;
  }
  const std::string name = argv[2];
  const int n = std::stoi(argv[3]);
  const int restarts = argc > 4 ? std::stoi(argv[4]) : 8;
  const uint64_t seed = argc > 5 ? std::stoull(argv[5]) : 1;
  json out;
  try {
    Schedule s = construct(name, n, restarts, seed);
    out = result(s, name);
    out["beta"] = "";
    out["max_age"] = 0;
    out["tail_from"] = 0;
    out["tail"] = encode(s);
  } catch (const std::exception& e) {
    out = {{"n", n}, {"construction", name}, {"ok", false}, {"error", e.what()}};
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
