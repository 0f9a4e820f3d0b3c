#include "transport/shm/channel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"
#include "transport/common.h"

namespace stragg::shm {
namespace {

[[noreturn]] void out_of_sync(int rank, int peer, const std::string& detail) {
  throw Error(transport::rank_prefix(rank) + "message stream from rank " + std::to_string(peer) +
              " out of sync (" + detail + ")");
}

}  // namespace

bool send_pieces(const Layout& layout, ChannelHeader* ch, SendOp& op) {
  const size_t total = op.header.payload_bytes;
  bool moved = false;
  uint64_t head = ch->head.load(std::memory_order_relaxed);
  while (!op.done) {
    const uint64_t tail = ch->tail.load(std::memory_order_acquire);
    if (head - tail >= layout.num_slots) break;
    SlotHeader* s = layout.slot(ch, head);
    const size_t len = std::min(layout.slot_bytes, total - op.sent);
    s->message = op.header;
    s->offset = op.sent;
    s->len = len;
    if (len > 0) {
      std::memcpy(Layout::payload(s), static_cast<const uint8_t*>(op.data) + op.sent, len);
    }
    ++head;
    ch->head.store(head, std::memory_order_release);
    op.sent += len;
    op.started = true;
    moved = true;
    if (op.sent == total) op.done = true;
  }
  return moved;
}

bool receive_pieces(const Layout& layout, ChannelHeader* ch, RecvOp& op, int rank) {
  bool moved = false;
  uint64_t tail = ch->tail.load(std::memory_order_relaxed);
  while (!op.done) {
    const uint64_t head = ch->head.load(std::memory_order_acquire);
    if (tail == head) break;
    SlotHeader* s = layout.slot(ch, tail);
    if (op.received + s->len > op.limit) break;  // would overwrite bytes not sent yet
    if (!op.header_seen) {
      if (s->offset != 0) {
        out_of_sync(
            rank, op.peer,
            "piece at offset " + std::to_string(s->offset) + " where a new message should start");
      }
      op.sink->on_header(s->message);
      op.expected = s->message.payload_bytes;
      op.header_seen = true;
    } else if (s->offset != op.received) {
      out_of_sync(rank, op.peer,
                  "piece at offset " + std::to_string(s->offset) + ", expected " +
                      std::to_string(op.received));
    }
    if (s->len > 0) op.sink->on_data(s->offset, Layout::payload(s), s->len);
    op.received += s->len;
    ++tail;
    ch->tail.store(tail, std::memory_order_release);
    moved = true;
    if (op.received >= op.expected) op.done = true;
  }
  return moved;
}

}  // namespace stragg::shm
