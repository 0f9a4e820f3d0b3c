// Name -> generator registry used by the Python API and the CLIs.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "core/generators.h"

namespace stragg {
namespace core {

namespace {

using nlohmann::json;

struct Entry {
  std::set<std::string> params;
  std::function<Schedule(int, const json&)> make;
};

int straggler_param(const json& p) { return p.value("straggler", -1); }

Schedule tagged(Schedule s, const json& p) {
  // Straggler-agnostic algorithms accept "straggler" for a uniform interface and record it.
  const int st = straggler_param(p);
  if (st >= 0) {
    if (st >= s.n) throw ScheduleError("straggler rank " + std::to_string(st) + " out of range");
    s.stragglers = {st};
  }
  return s;
}

// Typed parameters of an all_reduce generator from its JSON form ("straggler" or "stragglers",
// "slowdown" or "slowdowns", "segments", "bubble_fill", "order").
BuildParams params_from_json(const json& p) {
  BuildParams b;
  if (p.contains("stragglers")) b.stragglers = p.at("stragglers").get<std::vector<int>>();
  if (p.contains("straggler")) {
    if (p.contains("stragglers"))
      throw ScheduleError("optcc: give either straggler or stragglers, not both");
    const int st = p.at("straggler").get<int>();
    if (st >= 0) b.stragglers = {st};
  }
  if (p.contains("slowdowns")) b.slowdowns = p.at("slowdowns").get<std::vector<double>>();
  if (p.contains("slowdown")) {
    if (p.contains("slowdowns"))
      throw ScheduleError("optcc: give either slowdown or slowdowns, not both");
    b.slowdowns = {p.at("slowdown").get<double>()};
  }
  b.segments = p.value("segments", b.segments);
  b.bubble_fill = p.value("bubble_fill", b.bubble_fill);
  b.order = p.value("order", b.order);
  return b;
}

Entry all_reduce_entry(Algorithm a, std::set<std::string> params) {
  return {std::move(params),
          [a](int n, const json& p) { return build(a, n, params_from_json(p)); }};
}

// "host_level": {"cross": "ring", "ranks_per_host": K} (consecutive ranks share a host; default 1)
// or
// {"hosts": [host index of every rank]}; "straggler": the late rank; "stragglers"/"slowdowns":
// slow RANKS (OptCC across hosts runs for their hosts, at the largest factor of each host).
Schedule host_level_from_json(int n, const json& p) {
  std::vector<int> host_of;
  if (p.contains("hosts")) {
    if (p.contains("ranks_per_host"))
      throw ScheduleError("host_level: give either hosts or ranks_per_host, not both");
    host_of = p.at("hosts").get<std::vector<int>>();
    if (static_cast<int>(host_of.size()) != n)
      throw ScheduleError("host_level: hosts has " + std::to_string(host_of.size()) +
                          " entries, expected n=" + std::to_string(n));
  } else {
    const int k = p.value("ranks_per_host", 1);
    if (k < 1 || n % k != 0)
      throw ScheduleError("host_level: ranks_per_host must divide n=" + std::to_string(n) +
                          ", got " + std::to_string(k));
    for (int r = 0; r < n; ++r) host_of.push_back(r / k);
  }
  HostLevelOptions o;
  const std::string cross = p.value("cross", std::string("ring"));
  const auto algo = algorithm_from_name(cross);
  if (!algo || *algo == Algorithm::Auto)
    throw ScheduleError("host_level: unknown cross-host algorithm '" + cross + "'");
  o.cross = *algo;
  json inner = p;
  for (const char* k : {"cross", "hosts", "ranks_per_host", "straggler"}) inner.erase(k);
  const BuildParams by_rank = params_from_json(inner);
  o.cross_params = by_rank;
  o.cross_params.stragglers.clear();
  o.cross_params.slowdowns.clear();
  std::map<int, double> slow_hosts;
  for (size_t i = 0; i < by_rank.stragglers.size(); ++i) {
    const int r = by_rank.stragglers[i];
    if (r < 0 || r >= n) throw ScheduleError("host_level: slow rank out of range");
    const double f = by_rank.slowdowns.empty()        ? 2.0
                     : by_rank.slowdowns.size() == 1 ? by_rank.slowdowns[0]
                                                      : by_rank.slowdowns.at(i);
    double& slot = slow_hosts[host_of[r]];
    slot = std::max(slot, f);
  }
  for (const auto& [h, f] : slow_hosts) {
    o.cross_params.stragglers.push_back(h);
    o.cross_params.slowdowns.push_back(f);
  }
  o.late_rank = straggler_param(p);
  return host_level(host_of, o);
}

const std::map<std::string, Entry>& registry() {
  static const std::set<std::string> kStraggler = {"straggler"};
  static const std::map<std::string, Entry> r = {
      {"ring", all_reduce_entry(Algorithm::Ring, kStraggler)},
      {"ring_reduce_scatter",
       {kStraggler, [](int n, const json& p) { return tagged(ring_reduce_scatter(n), p); }}},
      {"ring_allgather",
       {kStraggler, [](int n, const json& p) { return tagged(ring_allgather(n), p); }}},
      {"rhd", all_reduce_entry(Algorithm::Rhd, kStraggler)},
      {"rhd_reduce_scatter",
       {kStraggler, [](int n, const json& p) { return tagged(rhd_reduce_scatter(n), p); }}},
      {"rhd_allgather",
       {kStraggler, [](int n, const json& p) { return tagged(rhd_allgather(n), p); }}},
      {"direct", all_reduce_entry(Algorithm::Direct, kStraggler)},
      {"rd", all_reduce_entry(Algorithm::Rd, kStraggler)},
      {"direct_reduce_scatter",
       {kStraggler, [](int n, const json& p) { return tagged(direct_reduce_scatter(n), p); }}},
      {"direct_allgather",
       {kStraggler, [](int n, const json& p) { return tagged(direct_allgather(n), p); }}},
      {"stragglar", all_reduce_entry(Algorithm::Stragglar, kStraggler)},
      {"bcast", all_reduce_entry(Algorithm::Bcast, kStraggler)},
      {"stragglar_direct",
       all_reduce_entry(Algorithm::StragglarDirect, {"straggler", "segments"})},
      {"optcc", all_reduce_entry(Algorithm::Optcc, {"straggler", "stragglers", "slowdown",
                                                    "slowdowns", "segments", "bubble_fill",
                                                    "order"})},
      {"host_level",
       {{"cross", "hosts", "ranks_per_host", "straggler", "stragglers", "slowdown", "slowdowns",
         "segments", "bubble_fill", "order"},
        host_level_from_json}},
      {"short_circuit",
       {{"nbytes", "alpha", "beta", "hop_delay", "reconfig_delay", "tau_rs", "tau_ag"},
        [](int n, const json& p) {
          return short_circuit(n, p.value("nbytes", 1024.0), p.value("alpha", 0.0),
                               p.value("beta", 1.0 / 100e9), p.value("hop_delay", 100e-9),
                               p.value("reconfig_delay", 1e-6), p.value("tau_rs", -2),
                               p.value("tau_ag", -2));
        }}},
  };
  return r;
}

Schedule tag_straggler(Schedule s, const BuildParams& p) {
  if (p.stragglers.size() > 1) {
    throw ScheduleError(std::string(s.algorithm) + ": takes at most one straggler");
  }
  if (!p.stragglers.empty()) {
    const int st = p.stragglers[0];
    if (st < 0 || st >= s.n) {
      throw ScheduleError("straggler rank " + std::to_string(st) + " out of range");
    }
    s.stragglers = {st};
  }
  return s;
}

int single_straggler(Algorithm a, const BuildParams& p) {
  if (p.stragglers.size() > 1) {
    throw ScheduleError(std::string(algorithm_name(a)) + ": takes one straggler, got " +
                        std::to_string(p.stragglers.size()));
  }
  return p.stragglers.empty() ? -1 : p.stragglers[0];
}

}  // namespace

Schedule build(Algorithm algo, int n, const BuildParams& p) {
  switch (algo) {
    case Algorithm::Ring:
      return tag_straggler(ring_allreduce(n), p);
    case Algorithm::Rhd:
      return tag_straggler(rhd_allreduce(n), p);
    case Algorithm::Direct:
      return tag_straggler(direct_allreduce(n), p);
    case Algorithm::Rd:
      return tag_straggler(rd_allreduce(n), p);
    case Algorithm::Stragglar:
      return stragglar(n, single_straggler(algo, p));
    case Algorithm::Bcast:
      return bcast(n, single_straggler(algo, p));
    case Algorithm::StragglarDirect:
      return stragglar_direct(n, single_straggler(algo, p), p.segments);
    case Algorithm::Optcc: {
      OptccOptions o;
      o.stragglers = p.stragglers;
      o.slowdowns = p.slowdowns;
      o.segments = p.segments;
      o.bubble_fill = p.bubble_fill;
      o.order = p.order;
      return optcc(n, o);
    }
    case Algorithm::Auto:
      break;
  }
  throw ScheduleError(std::string("build: '") + algorithm_name(algo) +
                      "' is not a schedule (the planner resolves it per call)");
}

std::vector<std::string> algorithm_names() {
  std::vector<std::string> names;
  for (const auto& kv : registry()) names.push_back(kv.first);
  return names;
}

Schedule build(const std::string& algo, int n, const std::string& params_json) {
  const auto& r = registry();
  auto it = r.find(algo);
  if (it == r.end()) {
    std::string known;
    for (const auto& kv : r) known += (known.empty() ? "" : ", ") + kv.first;
    throw ScheduleError("unknown algorithm '" + algo + "' (known: " + known + ")");
  }
  json p;
  try {
    p = params_json.empty() ? json::object() : json::parse(params_json);
  } catch (const json::exception& e) {
    throw ScheduleError("build(" + algo + "): parameters are not valid JSON: " + e.what());
  }
  if (!p.is_object()) throw ScheduleError("build(" + algo + "): parameters must be a JSON object");
  for (const auto& kv : p.items())
    if (!it->second.params.count(kv.key())) {
      std::string known;
      for (const auto& k : it->second.params) known += (known.empty() ? "" : ", ") + k;
      throw ScheduleError("build(" + algo + "): unknown parameter '" + kv.key() +
                          "' (accepted: " + known + ")");
    }
  try {
    Schedule s = it->second.make(n, p);
    if (s.params_json == "{}") s.params_json = p.dump();
    return s;
  } catch (const json::exception& e) {
    throw ScheduleError("build(" + algo + "): bad parameter: " + e.what());
  }
}

}  // namespace core
}  // namespace stragg
