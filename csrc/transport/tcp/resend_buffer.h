// The retransmit buffer of one outgoing byte stream of the TCP transport (no sockets here).
//
// The bytes a rank sends to a peer form one stream with a running offset, whatever carries them.
// Every byte written to the peer's socket is also copied here and kept until the peer
// acknowledges it as received (an ACK frame on the control connection, control.h): a byte the
// kernel accepted can still be lost with the connection (reset, ss -K, a middlebox), and after
// a re-dial the peer says from which offset it needs the stream again (resume.h). The buffer
// is a ring of fixed capacity: a send waits when it is full, until acknowledgements free it.
// Offsets are absolute (uint64, never wrap in practice), so the range [begin(), end()) can be
// resent on whichever connection carries the stream next (one connection per peer today; the
// same ranges would move to another NIC's connection).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace stragg::tcp {

class ResendBuffer {
 public:
  // `capacity` bytes, allocated on the first append.
  explicit ResendBuffer(size_t capacity) : capacity_(capacity) {}

  size_t capacity() const { return capacity_; }
  // The stream offsets kept: [begin(), end()). end() counts every byte ever appended.
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  size_t size() const { return static_cast<size_t>(end_ - begin_); }
  size_t room() const { return capacity_ - size(); }

  // Copies `len` bytes (at most room()) to the end. Throws std::bad_alloc if the ring cannot
  // be allocated.
  void append(const void* data, size_t len);
  // Forgets the bytes before `offset` (the peer has them); offsets at or before begin() are a
  // no-op. Returns false if `offset` lies past end() (nothing changes then).
  bool release(uint64_t offset);
  // The kept bytes from `offset` (begin() <= offset <= end()) as at most two contiguous
  // pieces; returns how many (0 when offset == end()).
  int pieces(uint64_t offset, const uint8_t** data, size_t* len) const;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };

  size_t capacity_;
  std::unique_ptr<uint8_t, FreeDeleter> ring_;
  uint64_t begin_ = 0;
  uint64_t end_ = 0;
};

}  // namespace stragg::tcp
