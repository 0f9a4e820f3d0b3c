#include "transport/shm/layout.h"

#include <algorithm>
#include <new>

#include "transport/common.h"
#include "transport/shm/arrival_board.h"

namespace stragg::shm {

void write_progress(ProgressBlock& b, const Progress& p) {
  uint64_t words[kAwaitWords] = {};
  for (int q : p.awaiting) {
    if (q >= 0 && q < kMaxReportedRanks) words[q / 64] |= uint64_t{1} << (q % 64);
  }
  const uint32_t v = b.version.load(std::memory_order_relaxed);
  b.version.store(v + 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  b.step.store(p.step, std::memory_order_relaxed);
  b.seq.store(p.seq, std::memory_order_relaxed);
  b.call.store(p.call, std::memory_order_relaxed);
  for (int i = 0; i < kAwaitWords; ++i) b.awaiting[i].store(words[i], std::memory_order_relaxed);
  b.version.store(v + 2, std::memory_order_release);
}

Progress read_progress(const ProgressBlock& b, int size) {
  Progress p;
  uint64_t words[kAwaitWords] = {};
  // A writer that stopped mid-write (SIGSTOP) leaves `version` odd: after a few tries the last
  // copy is taken as it is (the fields are each atomic, only their combination may be torn).
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint32_t v1 = b.version.load(std::memory_order_acquire);
    p.step = b.step.load(std::memory_order_relaxed);
    p.seq = b.seq.load(std::memory_order_relaxed);
    p.call = b.call.load(std::memory_order_relaxed);
    for (int i = 0; i < kAwaitWords; ++i) words[i] = b.awaiting[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((v1 & 1u) == 0 && b.version.load(std::memory_order_relaxed) == v1) break;
  }
  for (int q = 0; q < std::min(size, kMaxReportedRanks); ++q) {
    if (words[q / 64] >> (q % 64) & 1u) p.awaiting.push_back(q);
  }
  return p;
}

Layout::Layout(size_t slot_bytes_, size_t num_slots_, int size, size_t oneshot_bytes_)
    : slot_bytes(slot_bytes_),
      num_slots(num_slots_),
      slot_stride(kSlotHeaderBytes + slot_bytes_),
      channel_stride(transport::round_up(kChannelHeaderBytes + num_slots_ * slot_stride, kPage)),
      board_offset(kControlBytes),
      oneshot_offset(transport::round_up(kControlBytes + SharedArrivalBoard::bytes(size), kPage)),
      oneshot_bytes(oneshot_bytes_),
      control_bytes(oneshot_offset + (oneshot_bytes_ > 0 ? kPage + 2 * oneshot_bytes_ : 0)),
      segment_bytes(control_bytes + static_cast<size_t>(size) * channel_stride) {
  static_assert(sizeof(OneshotBlock) <= kPage, "one-shot block too large");
}

void Layout::initialize(uint8_t* base, uint64_t nonce, int pid, int rank, int size) const {
  auto* cb = new (base) ControlBlock();
  cb->magic = kMagic;
  cb->nonce = nonce;
  cb->pid = pid;
  cb->rank = rank;
  cb->size = size;
  cb->doorbell.store(0);
  cb->sleeping.store(0);
  cb->progress.version.store(0);
  cb->progress.step.store(Progress::kStarting);
  cb->progress.seq.store(-1);
  cb->progress.call.store(-1);
  for (auto& w : cb->progress.awaiting) w.store(0);
  cb->abort_by.store(0);
  cb->own_abort_ready.store(0);
  SharedArrivalBoard::initialize(base + board_offset, size);
  if (oneshot_bytes > 0) {
    auto* ob = new (base + oneshot_offset) OneshotBlock();
    ob->published.store(0);
  }
  for (int p = 0; p < size; ++p) {
    auto* ch = new (base + channel_offset(p)) ChannelHeader();
    ch->head.store(0);
    ch->tail.store(0);
  }
}

}  // namespace stragg::shm
