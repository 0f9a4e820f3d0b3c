#include "transport/shm/arrival_board.h"

#include <new>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/common.h"
#include "transport/shm/layout.h"

namespace stragg::shm {

size_t SharedArrivalBoard::bytes(int n) {
  return transport::round_up(
      sizeof(Header) + kBoardRounds * static_cast<size_t>(n) * sizeof(uint64_t), kPage);
}

void SharedArrivalBoard::initialize(uint8_t* base, int n) {
  auto* header = new (base) Header();
  header->tickets.store(0);
  for (auto& d : header->decisions) d.store(0);
  for (size_t i = 0; i < kBoardRounds * static_cast<size_t>(n); ++i) {
    new (base + sizeof(Header) + i * sizeof(uint64_t)) std::atomic<uint64_t>(0);
  }
}

SharedArrivalBoard::SharedArrivalBoard(uint8_t* base, int rank, int size,
                                       std::function<void()> wake_all)
    : header_(reinterpret_cast<Header*>(base)),
      slots_(reinterpret_cast<std::atomic<uint64_t>*>(base + sizeof(Header))),
      rank_(rank),
      size_(size),
      wake_all_(std::move(wake_all)) {}

int SharedArrivalBoard::arrive(uint64_t seq) {
  const uint64_t ticket = header_->tickets.fetch_add(1, std::memory_order_acq_rel);
  const uint64_t k = ticket / size_;
  const int pos = static_cast<int>(ticket % size_);
  if (k != seq) {
    throw Error(transport::rank_prefix(rank_) +
                "straggler agreement out of sync: arrival ticket for collective #" +
                std::to_string(k) + " while starting #" + std::to_string(seq));
  }
  slot(seq, pos).store(tag(seq, rank_ + 1), std::memory_order_release);
  wake_all_();
  return pos;
}

int SharedArrivalBoard::missing_rank(uint64_t seq) {
  std::vector<bool> seen(size_, false);
  for (int pos = 0; pos < size_ - 1; ++pos) {
    const uint64_t v = slot(seq, pos).load(std::memory_order_acquire);
    if ((v >> 16) != seq + 1) return -1;
    seen[(v & 0xffff) - 1] = true;
  }
  for (int r = 0; r < size_; ++r) {
    if (!seen[r]) return r;
  }
  return -1;
}

int SharedArrivalBoard::decide(uint64_t seq, int proposal) {
  std::atomic<uint64_t>& d = header_->decisions[seq % kBoardRounds];
  const uint64_t want = tag(seq, proposal + 1);
  uint64_t old = d.load(std::memory_order_acquire);
  while (true) {
    if ((old >> 16) == seq + 1) return static_cast<int>(old & 0xffff) - 1;
    if (d.compare_exchange_weak(old, want, std::memory_order_acq_rel)) break;
  }
  wake_all_();
  return proposal;
}

std::optional<int> SharedArrivalBoard::decision(uint64_t seq) {
  const uint64_t v = header_->decisions[seq % kBoardRounds].load(std::memory_order_acquire);
  if ((v >> 16) != seq + 1) return std::nullopt;
  return static_cast<int>(v & 0xffff) - 1;
}

}  // namespace stragg::shm
