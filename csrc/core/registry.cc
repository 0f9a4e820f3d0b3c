// Name -> generator registry used by the Python API and the CLIs.
#include <nlohmann/json.hpp>

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

const std::map<std::string, Entry>& registry() {
  static const std::map<std::string, Entry> r = {
      {"ring", {{"straggler"}, [](int n, const json& p) { return tagged(ring_allreduce(n), p); }}},
      {"ring_reduce_scatter",
       {{"straggler"}, [](int n, const json& p) { return tagged(ring_reduce_scatter(n), p); }}},
      {"ring_allgather",
       {{"straggler"}, [](int n, const json& p) { return tagged(ring_allgather(n), p); }}},
      {"rhd", {{"straggler"}, [](int n, const json& p) { return tagged(rhd_allreduce(n), p); }}},
      {"rhd_reduce_scatter",
       {{"straggler"}, [](int n, const json& p) { return tagged(rhd_reduce_scatter(n), p); }}},
      {"rhd_allgather",
       {{"straggler"}, [](int n, const json& p) { return tagged(rhd_allgather(n), p); }}},
      {"direct", {{"straggler"}, [](int n, const json& p) { return tagged(direct_allreduce(n), p); }}},
      {"direct_reduce_scatter",
       {{"straggler"}, [](int n, const json& p) { return tagged(direct_reduce_scatter(n), p); }}},
      {"direct_allgather",
       {{"straggler"}, [](int n, const json& p) { return tagged(direct_allgather(n), p); }}},
      {"stragglar",
       {{"straggler"}, [](int n, const json& p) { return stragglar(n, straggler_param(p)); }}},
      {"bcast", {{"straggler"}, [](int n, const json& p) { return bcast(n, straggler_param(p)); }}},
      {"optcc",
       {{"straggler", "stragglers", "slowdown", "slowdowns", "segments", "bubble_fill", "order"},
        [](int n, const json& p) {
          OptccOptions o;
          if (p.contains("stragglers")) o.stragglers = p.at("stragglers").get<std::vector<int>>();
          if (p.contains("straggler")) {
            if (p.contains("stragglers"))
              throw ScheduleError("optcc: give either straggler or stragglers, not both");
            o.stragglers = {p.at("straggler").get<int>()};
          }
          if (p.contains("slowdowns")) o.slowdowns = p.at("slowdowns").get<std::vector<double>>();
          if (p.contains("slowdown")) {
            if (p.contains("slowdowns"))
              throw ScheduleError("optcc: give either slowdown or slowdowns, not both");
            o.slowdowns = {p.at("slowdown").get<double>()};
          }
          o.segments = p.value("segments", o.segments);
          o.bubble_fill = p.value("bubble_fill", o.bubble_fill);
          o.order = p.value("order", o.order);
          return optcc(n, o);
        }}},
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

}  // namespace

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
