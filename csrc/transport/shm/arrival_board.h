// The arrival board of the shared-memory transport, in rank 0's segment: a ticket counter, per
// collective the ranks in arrival order, and a decision register. Every collective of the group
// takes exactly n tickets, and no rank can take a ticket for collective k+1 before all n took
// theirs for k (finishing k needs everybody's data), so ticket t belongs to collective t / n at
// position t % n. Records hold ((seq + 1) << 16 | value) so a stale record from kBoardRounds
// collectives ago is never mistaken for a current one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "transport/transport.h"

namespace stragg::shm {

// Collectives whose arrival records are kept at once (a rank is never more than one collective
// ahead of the slowest, so a few suffice).
constexpr uint64_t kBoardRounds = 8;

class SharedArrivalBoard final : public ArrivalBoard {
 public:
  // Bytes a board for `n` ranks takes (a whole number of pages).
  static size_t bytes(int n);
  // Constructs an empty board for `n` ranks at `base` (rank 0 does, in its fresh segment).
  static void initialize(uint8_t* base, int n);

  // The board at `base` as seen by `rank` of `size`; `wake_all` rings every rank's doorbell.
  SharedArrivalBoard(uint8_t* base, int rank, int size, std::function<void()> wake_all);

  int arrive(uint64_t seq) override;
  int missing_rank(uint64_t seq) override;
  int decide(uint64_t seq, int proposal) override;
  std::optional<int> decision(uint64_t seq) override;

 private:
  struct Header {
    alignas(64) std::atomic<uint64_t> tickets;
    alignas(64) std::atomic<uint64_t> decisions[kBoardRounds];
  };

  static uint64_t tag(uint64_t seq, int value) {
    return ((seq + 1) << 16) | static_cast<uint64_t>(value);
  }
  std::atomic<uint64_t>& slot(uint64_t seq, int pos) {
    return slots_[(seq % kBoardRounds) * size_ + pos];
  }

  Header* header_;
  std::atomic<uint64_t>* slots_;
  int rank_;
  int size_;
  std::function<void()> wake_all_;
};

}  // namespace stragg::shm
