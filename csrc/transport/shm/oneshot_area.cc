#include "transport/shm/oneshot_area.h"

namespace stragg::shm {

void ShmOneshotArea::publish(uint64_t index, const OneshotHeader& header) {
  OneshotBlock* own = layout_.oneshot(bases_[rank_]);
  own->header[index % 2] = header;
  own->published.store(index + 1, std::memory_order_release);
  wake_peers_();
}

const OneshotHeader* ShmOneshotArea::published(int peer, uint64_t index) {
  OneshotBlock* block = layout_.oneshot(bases_[peer]);
  // A peer is at most one call ahead (it needs this rank's input to finish #index + 1), and its
  // header for #index + 1 is in the other slot.
  if (block->published.load(std::memory_order_acquire) < index + 1) return nullptr;
  return &block->header[index % 2];
}

}  // namespace stragg::shm
