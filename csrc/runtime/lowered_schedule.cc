#include "runtime/lowered_schedule.h"

namespace stragg {

std::string schedule_tag_name(uint8_t tag) {
  if (tag == kLinkProbeTag) return "link probe";
  if (tag < kAlgorithmNames.size()) return kAlgorithmNames[tag];
  const uint8_t flat = tag & static_cast<uint8_t>(~kHostLevelTagBit);
  if ((tag & kHostLevelTagBit) && flat < kAlgorithmNames.size()) {
    return std::string("host:") + kAlgorithmNames[flat];
  }
  return "plan " + std::to_string(tag);
}

}  // namespace stragg
