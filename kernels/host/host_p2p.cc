#include "kernels/host/host_p2p.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/error.h"

namespace stragg::gpu::host {

HostP2PGroup::HostP2PGroup(int size, size_t slot_bytes, int slots)
    : size_(size), slot_bytes_(slot_bytes), slots_(slots), members_(size > 0 ? size : 0) {
  if (size < 1) throw Error("stragg: host p2p group: invalid size " + std::to_string(size));
  const size_t bytes = (StagedP2P::shared_bytes(size) + 63) & ~size_t{63};
  shared_ = std::aligned_alloc(64, bytes);
  if (shared_ == nullptr) throw Error("stragg: host p2p group: out of memory");
  std::memset(shared_, 0, bytes);
  const size_t n = static_cast<size_t>(size);
  for (size_t r = 0; r < n; ++r) {
    staging_.emplace_back(new uint8_t[n * static_cast<size_t>(slots) * slot_bytes]);
  }
}

HostP2PGroup::~HostP2PGroup() { std::free(shared_); }

HostP2P::HostP2P(HostP2PGroup& group, int rank, HostDevice& device,
                 std::chrono::milliseconds timeout)
    : StagedP2P(device, "host", rank, group.size(), device.current_device(), group.slot_bytes_,
                group.slots_),
      group_(group) {
  const size_t n = static_cast<size_t>(size_);
  const size_t slots = static_cast<size_t>(slots_);
  staging_ = group.staging_[rank].get();
  ready_mine_.assign(n * slots, nullptr);
  consumed_mine_.assign(n * slots, nullptr);
  for (size_t i = 0; i < n * slots; ++i) {
    if (i / slots == static_cast<size_t>(rank)) continue;  // no channel with myself
    ready_mine_[i] = device.create_event();
    consumed_mine_[i] = device.create_event();
  }
  std::unique_lock<std::mutex> lock(group.mu_);
  HostP2PGroup::Member& me = group.members_[rank];
  if (me.joined) throw Error(where() + ": rank " + std::to_string(rank) + " joined twice");
  me.staging = staging_;
  me.ready = ready_mine_;
  me.consumed = consumed_mine_;
  me.joined = true;
  group.cv_.notify_all();
  const auto all_joined = [&] {
    for (const auto& m : group.members_)
      if (!m.joined) return false;
    return true;
  };
  if (!group.cv_.wait_for(lock, timeout, all_joined)) {
    std::ostringstream m;
    m << where() << ": setup timed out after " << timeout.count() / 1000.0 << " s waiting for rank";
    for (int q = 0; q < size_; ++q)
      if (!group.members_[q].joined) m << " " << q;
    me.gone.store(true);
    throw TimeoutError(m.str());
  }
  ready_peer_.assign(n * slots, nullptr);
  consumed_peer_.assign(n * slots, nullptr);
  for (size_t q = 0; q < n; ++q) {
    if (q == static_cast<size_t>(rank)) continue;
    const HostP2PGroup::Member& peer = group.members_[q];
    peer_staging_[q] = peer.staging;
    for (size_t s = 0; s < slots; ++s) {
      ready_peer_[q * slots + s] = peer.ready[static_cast<size_t>(rank) * slots + s];
      consumed_peer_[q * slots + s] = peer.consumed[static_cast<size_t>(rank) * slots + s];
    }
  }
  attach_shared(group.shared_);
}

HostP2P::~HostP2P() { group_.members_[rank_].gone.store(true); }

bool HostP2P::peer_gone(int q) { return group_.members_[q].gone.load(); }

}  // namespace stragg::gpu::host
