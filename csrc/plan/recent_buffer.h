// The most recent `capacity` values pushed, oldest first (no torch here). Storage is allocated
// once: a push is a store and an index update, which matters to the straggler profiler, that
// records every all_reduce call (a std::deque allocates a block every few dozen pushes).
#pragma once

#include <cstddef>
#include <iterator>
#include <vector>

namespace stragg {

template <class T>
class RecentBuffer {
 public:
  explicit RecentBuffer(size_t capacity) : slots_(capacity > 0 ? capacity : 1) {}

  // Appends `value`; when full, the oldest value goes.
  void push(const T& value) {
    slots_[next_] = value;
    next_ = next_ + 1 == slots_.size() ? 0 : next_ + 1;
    if (size_ < slots_.size()) ++size_;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // i = 0 is the oldest value held, size() - 1 the newest.
  const T& operator[](size_t i) const {
    size_t at = next_ + slots_.size() - size_ + i;
    if (at >= slots_.size()) at -= slots_.size();
    return slots_[at];
  }

  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = const T*;
    using reference = const T&;
    const_iterator(const RecentBuffer* b, size_t i) : b_(b), i_(i) {}
    reference operator*() const { return (*b_)[i_]; }
    pointer operator->() const { return &(*b_)[i_]; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }

   private:
    const RecentBuffer* b_;
    size_t i_;
  };
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, size_); }

 private:
  std::vector<T> slots_;
  size_t next_ = 0;  // where the next push goes
  size_t size_ = 0;
};

}  // namespace stragg
