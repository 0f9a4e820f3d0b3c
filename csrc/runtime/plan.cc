#include "runtime/plan.h"

namespace stragg {

std::string plan_tag_name(uint8_t tag) {
  if (tag == kLinkProbeTag) return "link probe";
  if (tag < kAlgorithmNames.size()) return kAlgorithmNames[tag];
  return "plan " + std::to_string(tag);
}

}  // namespace stragg
