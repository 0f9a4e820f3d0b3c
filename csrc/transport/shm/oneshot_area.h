// The shared-memory transport's one-shot buffers (OneshotArea, transport.h): each rank's segment
// holds a OneshotBlock and two input buffers (layout.h); a rank writes its own and reads every
// peer's in place.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "transport/shm/layout.h"
#include "transport/transport.h"

namespace stragg::shm {

class ShmOneshotArea final : public OneshotArea {
 public:
  // `bases`: every rank's mapped segment, by rank; `wake_peers` rings every peer's doorbell.
  ShmOneshotArea(const Layout& layout, std::vector<uint8_t*> bases, int rank,
                 std::function<void()> wake_peers)
      : layout_(layout), bases_(std::move(bases)), rank_(rank), wake_peers_(std::move(wake_peers)) {}

  size_t capacity() const override { return layout_.oneshot_bytes; }
  void* own_buffer(uint64_t index) override { return layout_.oneshot_buffer(bases_[rank_], index); }
  void publish(uint64_t index, const OneshotHeader& header) override;
  const OneshotHeader* published(int peer, uint64_t index) override;
  const void* peer_buffer(int peer, uint64_t index) override {
    return layout_.oneshot_buffer(bases_[peer], index);
  }

 private:
  const Layout& layout_;
  std::vector<uint8_t*> bases_;
  int rank_;
  std::function<void()> wake_peers_;
};

}  // namespace stragg::shm
