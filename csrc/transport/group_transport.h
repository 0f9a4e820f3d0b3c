// The part every Transport of a fixed group shares: its rank and size, checked once at
// construction, the check of a peer's rank, and no copies (a transport owns connections or
// mappings).
#pragma once

#include <string>

#include "common/error.h"
#include "transport/transport.h"

namespace stragg {

class GroupTransport : public Transport {
 public:
  GroupTransport(const GroupTransport&) = delete;
  GroupTransport& operator=(const GroupTransport&) = delete;

  int rank() const final { return rank_; }
  int size() const final { return size_; }

 protected:
  // Throws stragg::Error unless 0 <= rank < size ("stragg: <kind> transport: invalid rank ...").
  GroupTransport(const char* kind, int rank, int size) : rank_(rank), size_(size) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw Error(std::string("stragg: ") + kind + " transport: invalid rank " +
                  std::to_string(rank) + " of " + std::to_string(size));
    }
  }

  // Throws stragg::Error naming this rank unless `peer` is another rank of the group.
  void check_peer(int peer, const char* what) const {
    if (peer == rank_ || peer < 0 || peer >= size_) {
      throw Error("stragg: rank " + std::to_string(rank_) + ": invalid " + what + " peer " +
                  std::to_string(peer));
    }
  }

  const int rank_;
  const int size_;
};

}  // namespace stragg
