// ArrivalBoard on the c10d store, for the dynamic straggler where the transport has no shared
// board (TCP across hosts). Every operation is one atomic store request, so no rank coordinates:
//  * arrive: one add() of (1 << 32) + rank + 1 to the collective's key: the high half counts the
//    arrivals (the returned count is the arrival position), the low half sums rank + 1, so once
//    n - 1 ranks arrived the missing rank is n(n+1)/2 - sum - 1.
//  * decide: compareSet on the decision key (first writer wins), like the shm board's register.
// A collective's keys are deleted by the first rank to arrive at the second agreement after it
// (all ranks have read them by then: nobody runs a collective before every rank agreed on the
// previous one).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <optional>
#include <string>

#include "transport/transport.h"

namespace stragg {

class StoreArrivalBoard final : public ArrivalBoard {
 public:
  StoreArrivalBoard(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
      : store_(std::move(store)), rank_(rank), size_(size) {}

  int arrive(uint64_t seq) override {
    const int64_t v = store_->add(count_key(seq), (int64_t{1} << 32) + rank_ + 1);
    const int position = static_cast<int>(v >> 32) - 1;
    if (position == 0 && seen_ >= 2) {
      store_->deleteKey(count_key(previous_[0]));
      store_->deleteKey(decision_key(previous_[0]));
    }
    previous_[0] = previous_[1];
    previous_[1] = seq;
    ++seen_;
    return position;
  }

  int missing_rank(uint64_t seq) override {
    const int64_t v = store_->add(count_key(seq), 0);
    const int64_t count = v >> 32;
    if (count != size_ - 1) return -1;
    const int64_t sum = v & 0xffffffffLL;
    return static_cast<int>(int64_t{size_} * (size_ + 1) / 2 - sum - 1);
  }

  int decide(uint64_t seq, int proposal) override {
    const std::string mine = std::to_string(proposal);
    const std::vector<uint8_t> won = store_->compareSet(
        decision_key(seq), {}, std::vector<uint8_t>(mine.begin(), mine.end()));
    return std::stoi(std::string(won.begin(), won.end()));
  }

  std::optional<int> decision(uint64_t seq) override {
    const std::string key = decision_key(seq);
    if (!store_->check({key})) return std::nullopt;
    const std::vector<uint8_t> v = store_->get(key);
    return std::stoi(std::string(v.begin(), v.end()));
  }

  // Store updates wake nobody: waiters poll at this interval.
  std::chrono::microseconds poll_interval() const override {
    return std::chrono::microseconds(200);
  }

 private:
  static std::string count_key(uint64_t seq) { return "c" + std::to_string(seq); }
  static std::string decision_key(uint64_t seq) { return "d" + std::to_string(seq); }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  uint64_t previous_[2] = {0, 0};  // the last two agreements' sequence numbers
  uint64_t seen_ = 0;
};

}  // namespace stragg
