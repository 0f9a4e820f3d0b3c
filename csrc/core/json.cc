// JSON serialisation of the schedule IR (nlohmann-json).
//
// Format "stragg.schedule/1":
//   {"format": "stragg.schedule/1", "algorithm": "ring", "collective": "allreduce", "n": 4,
//    "num_chunks": 4, "segments": 1, "chunk_weights": [...], "chunk_owner": [...],
//    "phases": ["main"], "stragglers": [], "rank_slowdown": [...], "params": {...},
//    "num_rounds": 6,
//    "steps": [{"round": 0, "phase": 0, "pre_arrival": false,
//               "transfers": [[src, dst, chunk, count, "reduce"|"copy"], ...]}, ...]}
// Pattern steps (ir.h, compact form) are written expanded, so a schedule read back is explicit
// and equal to Schedule::expanded().
#include <nlohmann/json.hpp>

#include "core/ir.h"

namespace stragg {
namespace core {

using nlohmann::json;

std::string to_json(const Schedule& s, int indent) {
  json j;
  j["format"] = "stragg.schedule/1";
  j["algorithm"] = s.algorithm;
  j["collective"] = to_string(s.collective);
  j["n"] = s.n;
  j["num_chunks"] = s.num_chunks;
  j["segments"] = s.segments;
  j["chunk_weights"] = s.chunk_weights;
  j["chunk_owner"] = s.chunk_owner;
  j["phases"] = s.phases;
  j["stragglers"] = s.stragglers;
  j["rank_slowdown"] = s.rank_slowdown;
  try {
    j["params"] = json::parse(s.params_json);
  } catch (const json::exception&) {
    j["params"] = json::object();
  }
  j["num_rounds"] = s.num_rounds();
  json steps = json::array();
  std::vector<Transfer> scratch;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& st = s.steps[i];
    json t = json::array();
    for (const Transfer& x : s.transfers_of(i, scratch))
      t.push_back(json::array({x.src, x.dst, x.chunk, x.count, to_string(x.op)}));
    json js = {{"round", st.round}, {"phase", st.phase}, {"pre_arrival", st.pre_arrival}};
    if (st.reconfigure) js["reconfigure"] = true;
    js["transfers"] = std::move(t);
    steps.push_back(std::move(js));
  }
  j["steps"] = std::move(steps);
  return j.dump(indent);
}

Schedule schedule_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw ScheduleError(std::string("schedule JSON: parse error: ") + e.what());
  }
  try {
    if (j.value("format", std::string()) != "stragg.schedule/1")
      throw ScheduleError("schedule JSON: missing or unsupported \"format\" (want stragg.schedule/1)");
    Schedule s = Schedule::make(j.at("algorithm").get<std::string>(),
                                collective_from_string(j.at("collective").get<std::string>()),
                                j.at("n").get<int>(), j.at("num_chunks").get<int>());
    s.segments = j.value("segments", 1);
    s.chunk_weights = j.at("chunk_weights").get<std::vector<double>>();
    s.chunk_owner = j.at("chunk_owner").get<std::vector<int>>();
    s.phases = j.at("phases").get<std::vector<std::string>>();
    s.stragglers = j.value("stragglers", std::vector<int>{});
    s.rank_slowdown = j.at("rank_slowdown").get<std::vector<double>>();
    s.params_json = j.value("params", json::object()).dump();
    for (const json& js : j.at("steps")) {
      Step st;
      st.round = js.at("round").get<int>();
      st.phase = js.at("phase").get<int>();
      st.pre_arrival = js.value("pre_arrival", false);
      st.reconfigure = js.value("reconfigure", false);
      for (const json& jt : js.at("transfers")) {
        if (!jt.is_array() || jt.size() != 5)
          throw ScheduleError("schedule JSON: a transfer must be [src, dst, chunk, count, op]");
        Transfer t;
        t.src = jt[0].get<int>();
        t.dst = jt[1].get<int>();
        t.chunk = jt[2].get<int>();
        t.count = jt[3].get<int>();
        const std::string op = jt[4].get<std::string>();
        if (op == "reduce")
          t.op = RecvAction::kReduce;
        else if (op == "copy")
          t.op = RecvAction::kCopy;
        else if (op == "reduce_first")
          t.op = RecvAction::kReduceFirst;
        else
          throw ScheduleError("schedule JSON: unknown receive op '" + op + "'");
        st.transfers.push_back(t);
      }
      s.steps.push_back(std::move(st));
    }
    s.validate_structure();
    return s;
  } catch (const json::exception& e) {
    throw ScheduleError(std::string("schedule JSON: ") + e.what());
  }
}

}  // namespace core
}  // namespace stragg
