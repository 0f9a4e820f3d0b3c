#include "transport/tcp/resend_buffer.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace stragg::tcp {

void ResendBuffer::append(const void* data, size_t len) {
  if (len == 0) return;
  if (!ring_) {
    ring_.reset(static_cast<uint8_t*>(std::malloc(capacity_)));
    if (!ring_) throw std::bad_alloc();
  }
  len = std::min(len, room());
  const auto* src = static_cast<const uint8_t*>(data);
  const size_t at = static_cast<size_t>(end_ % capacity_);
  const size_t first = std::min(len, capacity_ - at);
  std::memcpy(ring_.get() + at, src, first);
  if (first < len) std::memcpy(ring_.get(), src + first, len - first);
  end_ += len;
}

bool ResendBuffer::release(uint64_t offset) {
  if (offset > end_) return false;
  if (offset > begin_) begin_ = offset;
  return true;
}

int ResendBuffer::pieces(uint64_t offset, const uint8_t** data, size_t* len) const {
  if (offset < begin_ || offset >= end_) return 0;
  const size_t n = static_cast<size_t>(end_ - offset);
  const size_t at = static_cast<size_t>(offset % capacity_);
  const size_t first = std::min(n, capacity_ - at);
  data[0] = ring_.get() + at;
  len[0] = first;
  if (first == n) return 1;
  data[1] = ring_.get();
  len[1] = n - first;
  return 2;
}

}  // namespace stragg::tcp
