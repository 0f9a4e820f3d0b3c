// A family of plans (no torch here): an algorithm, flat or host-level. The plan check measures
// one correction of the cost model per family (plan/plan_check.h, Planner::set_corrections).
#pragma once

#include <string>

#include "core/algorithm.h"

namespace stragg {

struct PlanFamily {
  Algorithm algorithm = Algorithm::Ring;
  bool by_host = false;  // the host-level composition (core/host_level.cc)
  bool operator<(const PlanFamily& o) const {
    return algorithm != o.algorithm ? algorithm < o.algorithm : by_host < o.by_host;
  }
  bool operator==(const PlanFamily& o) const {
    return algorithm == o.algorithm && by_host == o.by_host;
  }
  // "ring", "host:stragglar_direct"
  std::string describe() const {
    return std::string(by_host ? "host:" : "") + algorithm_name(algorithm);
  }
};

}  // namespace stragg
