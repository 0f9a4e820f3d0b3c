#include "kernels/staged_p2p.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/error.h"

namespace stragg::gpu {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t round64(size_t x) { return (x + 63) & ~size_t{63}; }

}  // namespace

// Layout of the shared block: Header, then size x size Channels (sender-major), then size arrival
// counters (last announced seq + 1; 0: none).
struct StagedP2P::Header {
  std::atomic<uint32_t> abort_state;  // 0: none, 1: a reason is being written, 2: reason valid
  char reason[1020];
};

struct StagedP2P::Channel {
  alignas(64) std::atomic<uint64_t> ready;     // pieces the sender has enqueued
  alignas(64) std::atomic<uint64_t> consumed;  // pieces the receiver has enqueued to copy out
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters must be lock-free");
static_assert(std::atomic<int64_t>::is_always_lock_free, "counters must be lock-free");

size_t StagedP2P::shared_bytes(int n) {
  const size_t nn = static_cast<size_t>(n);
  return round64(sizeof(Header)) + round64(sizeof(Channel) * nn * nn) +
         sizeof(std::atomic<int64_t>) * nn;
}

StagedP2P::StagedP2P(Device& dev, const std::string& layer, int rank, int size, int device,
                     size_t slot_bytes, int slots)
    : dev_(dev),
      where_("stragg: rank " + std::to_string(rank) + ": " + layer + " p2p"),
      rank_(rank),
      size_(size),
      device_(device),
      slot_bytes_(slot_bytes),
      slots_(slots) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(where_ + ": invalid rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  if (slots < 1 || slot_bytes == 0) {
    throw Error(where_ + ": need at least one staging slot of at least one byte");
  }
  const size_t n = static_cast<size_t>(size);
  peer_staging_.assign(n, nullptr);
  sent_pieces_.assign(n, 0);
  received_pieces_.assign(n, 0);
}

void StagedP2P::attach_shared(void* block) { shared_ = block; }

StagedP2P::Channel& StagedP2P::channel(int sender, int receiver) const {
  auto* base = static_cast<char*>(shared_) + round64(sizeof(Header));
  return reinterpret_cast<Channel*>(base)[static_cast<size_t>(sender) * size_ + receiver];
}

std::atomic<int64_t>& StagedP2P::arrival(int q) const {
  const size_t nn = static_cast<size_t>(size_) * size_;
  auto* base =
      static_cast<char*>(shared_) + round64(sizeof(Header)) + round64(sizeof(Channel) * nn);
  return reinterpret_cast<std::atomic<int64_t>*>(base)[q];
}

void StagedP2P::announce_arrival(const char* op_name, uint64_t seq) {
  arrived_op_ = op_name;
  arrived_seq_ = static_cast<int64_t>(seq);
  if (shared_ != nullptr) {
    arrival(rank_).store(static_cast<int64_t>(seq) + 1, std::memory_order_release);
  }
}

int64_t StagedP2P::peer_arrival(int peer) {
  if (shared_ == nullptr || peer < 0 || peer >= size_) return kArrivalUnknown;
  return arrival(peer).load(std::memory_order_acquire) - 1;
}

void StagedP2P::group_start() {
  if (auto reason = async_error()) throw Error(where() + ": aborted: " + *reason);
  if (in_group_) throw Error(where() + ": group_start inside a group");
  group_.clear();
  in_group_ = true;
}

void StagedP2P::send(const void* buf, size_t bytes, int peer, Stream stream) {
  if (!in_group_) throw Error(where() + ": send outside group_start/group_end");
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw Error(where() + ": send to invalid peer " + std::to_string(peer));
  }
  group_.push_back(Op{true, peer, static_cast<uint8_t*>(const_cast<void*>(buf)), bytes, 0, stream});
}

void StagedP2P::recv(void* buf, size_t bytes, int peer, Stream stream) {
  if (!in_group_) throw Error(where() + ": recv outside group_start/group_end");
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw Error(where() + ": recv from invalid peer " + std::to_string(peer));
  }
  group_.push_back(Op{false, peer, static_cast<uint8_t*>(buf), bytes, 0, stream});
}

bool StagedP2P::progress(Op& op) {
  const size_t slots = static_cast<size_t>(slots_);
  const size_t q = static_cast<size_t>(op.peer);
  const size_t me = static_cast<size_t>(rank_);
  const size_t len = std::min(slot_bytes_, op.bytes - op.done);
  const std::string peer = std::to_string(q);
  if (op.is_send) {
    Channel& ch = channel(rank_, op.peer);
    const uint64_t k = sent_pieces_[q];
    const size_t slot = k % slots;
    if (k >= slots) {
      if (ch.consumed.load(std::memory_order_acquire) < k - slots + 1) return false;
      dev_.wait_event(op.stream, consumed_peer_[q * slots + slot]);  // slot free at the peer
    }
    uint8_t* dst = peer_staging_[q] + (me * slots + slot) * slot_bytes_;
    dev_.copy_async(dst, op.buf + op.done, len, op.stream);
    dev_.record(ready_mine_[q * slots + slot], op.stream);
    ch.ready.store(k + 1, std::memory_order_release);
    sent_pieces_[q] = k + 1;
  } else {
    Channel& ch = channel(op.peer, rank_);
    const uint64_t k = received_pieces_[q];
    const size_t slot = k % slots;
    if (ch.ready.load(std::memory_order_acquire) < k + 1) return false;
    dev_.wait_event(op.stream, ready_peer_[q * slots + slot]);  // the peer's data is there
    const uint8_t* src = staging_ + (q * slots + slot) * slot_bytes_;
    dev_.copy_async(op.buf + op.done, src, len, op.stream);
    dev_.record(consumed_mine_[q * slots + slot], op.stream);
    ch.consumed.store(k + 1, std::memory_order_release);
    received_pieces_[q] = k + 1;
  }
  op.done += len;
  return true;
}

// Nothing moved: throws if the group was aborted, a peer it waits for is gone, or the deadline
// passed (naming the peers it still waits for).
void StagedP2P::check_waiting(const Clock::time_point& deadline,
                              std::chrono::milliseconds timeout) {
  if (auto reason = async_error()) throw Error(where() + ": aborted: " + *reason);
  const auto now = Clock::now();
  if (now - last_health_check_ >= std::chrono::milliseconds(100)) {
    last_health_check_ = now;
    for (const Op& op : group_) {
      if (op.done != op.bytes && peer_gone(op.peer)) {
        throw TimeoutError(where() + ": rank " + std::to_string(op.peer) +
                           " has died (process gone)");
      }
    }
  }
  if (now >= deadline) {
    std::ostringstream m;
    m << where() << ": timed out after " << timeout.count() / 1000.0 << " s waiting for rank";
    for (const Op& op : group_) {
      if (op.done != op.bytes) m << " " << op.peer << (op.is_send ? " (send)" : " (recv)");
    }
    if (arrived_seq_ >= 0) {
      m << missing_ranks(arrived_op_.c_str(), static_cast<uint64_t>(arrived_seq_));
    }
    throw TimeoutError(m.str());
  }
}

void StagedP2P::group_end(std::chrono::milliseconds timeout) {
  if (!in_group_) throw Error(where() + ": group_end without group_start");
  in_group_ = false;
  const auto deadline = Clock::now() + timeout;
  last_health_check_ = Clock::now();
  int idle_rounds = 0;
  try {
    DeviceGuard guard(dev_, device_);
    while (true) {
      bool moved = false;
      bool all_done = true;
      for (size_t i = 0; i < group_.size(); ++i) {
        Op& op = group_[i];
        if (op.done == op.bytes) continue;
        all_done = false;
        // FIFO per (direction, peer): only the first unfinished op of the pair progresses.
        bool earlier = false;
        for (size_t j = 0; j < i && !earlier; ++j) {
          const Op& o = group_[j];
          earlier = o.is_send == op.is_send && o.peer == op.peer && o.done != o.bytes;
        }
        if (!earlier) moved |= progress(op);
      }
      if (all_done) break;
      if (moved) {
        idle_rounds = 0;
        continue;
      }
      check_waiting(deadline, timeout);
      // Peers answer within microseconds when they are in their own group_end: spin, then yield,
      // then sleep briefly.
      ++idle_rounds;
      if (idle_rounds > 2000) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if (idle_rounds > 200) {
        std::this_thread::yield();
      }
    }
  } catch (const Error& e) {
    abort(e.what());
    throw;
  }
  group_.clear();
}

std::optional<std::string> StagedP2P::async_error() {
  if (shared_ == nullptr) return std::string(name()) + " p2p is not set up";
  auto* h = static_cast<Header*>(shared_);
  if (h->abort_state.load(std::memory_order_acquire) == 0) return std::nullopt;
  // A writer publishes the reason right after taking the flag.
  for (int i = 0; i < 100000 && h->abort_state.load(std::memory_order_acquire) != 2; ++i) {
    std::this_thread::yield();
  }
  if (h->abort_state.load(std::memory_order_acquire) != 2) return std::string("aborted");
  return std::string(h->reason, strnlen(h->reason, sizeof h->reason));
}

void StagedP2P::abort(const std::string& reason) {
  if (shared_ == nullptr) return;
  auto* h = static_cast<Header*>(shared_);
  uint32_t expected = 0;
  if (!h->abort_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  const size_t len = std::min(reason.size(), sizeof h->reason - 1);
  std::memcpy(h->reason, reason.data(), len);
  h->reason[len] = '\0';
  h->abort_state.store(2, std::memory_order_release);
}

}  // namespace stragg::gpu
