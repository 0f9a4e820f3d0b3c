#include "runtime/lowered_schedule.h"

namespace stragg {

std::string schedule_tag_name(uint8_t tag) {
  if (tag == kLinkProbeTag) return "link probe";
  if (tag < kAlgorithmNames.size()) return kAlgorithmNames[tag];
  return "plan " + std::to_string(tag);
}

}  // namespace stragg
