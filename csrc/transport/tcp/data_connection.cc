#include "transport/tcp/data_connection.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "transport/common.h"

namespace stragg::tcp {
namespace {

constexpr uint64_t kMessageMagic = 0x53545241474d5347ull;  // "STRAGMSG"

}  // namespace

DataConnection::DataConnection(Fd fd, int rank, int peer, size_t staging_bytes)
    : fd_(std::move(fd)), rank_(rank), peer_(peer), staging_bytes_(staging_bytes) {}

bool DataConnection::has_unread() const {
  if (rx_end_ > rx_begin_) return true;
  int queued = 0;
  return ioctl(fd_.get(), FIONREAD, &queued) == 0 && queued > 0;
}

void DataConnection::fail_receive(const std::string& why) {
  rx_broken_ = why;
  throw Error(transport::rank_prefix(rank_) + why);
}

void DataConnection::fail_send(const std::string& why) {
  tx_broken_ = why;
  throw Error(transport::rank_prefix(rank_) + why);
}

// ------------------------------------------------------------------------------------------------
// Sending

void DataConnection::start_send(const SendOp& op) {
  if (tx_in_message_) {
    fail_send("the connection to rank " + std::to_string(peer_) +
              " is unusable: a message to it was abandoned half-way");
  }
  std::memcpy(tx_head_, &kMessageMagic, sizeof kMessageMagic);
  std::memcpy(tx_head_ + sizeof kMessageMagic, &op.header, sizeof(MessageHeader));
  tx_head_sent_ = 0;
  tx_in_message_ = true;
}

bool DataConnection::progress(SendOp& op) {
  if (!tx_broken_.empty()) throw Error(transport::rank_prefix(rank_) + tx_broken_);
  if (!op.started) {
    start_send(op);
    op.started = true;
  }
  const size_t total = op.header.payload_bytes;
  auto* data = const_cast<uint8_t*>(static_cast<const uint8_t*>(op.data));
  bool moved = false;
  while (!op.done) {
    iovec iov[2];
    int n = 0;
    size_t want = 0;
    if (tx_head_sent_ < kFrameHeadBytes) {
      iov[n++] = {tx_head_ + tx_head_sent_, kFrameHeadBytes - tx_head_sent_};
    }
    if (op.sent < total) iov[n++] = {data + op.sent, total - op.sent};
    for (int i = 0; i < n; ++i) want += iov[i].iov_len;
    const Transfer t = send_vector(fd_.get(), iov, n);
    if (!t.moved()) {
      if (t.ended()) ended_ = true;  // EPIPE, ECONNRESET
      break;
    }
    moved = true;
    const size_t head = std::min(t.bytes, kFrameHeadBytes - tx_head_sent_);
    tx_head_sent_ += head;
    op.sent += t.bytes - head;
    if (tx_head_sent_ == kFrameHeadBytes && op.sent == total) {
      op.done = true;
      tx_in_message_ = false;
    } else if (t.bytes < want) {
      break;  // the socket buffer is full
    }
  }
  want_write_ = !op.done;
  return moved;
}

// ------------------------------------------------------------------------------------------------
// Receiving

bool DataConnection::progress(RecvOp& op) {
  if (!rx_broken_.empty()) throw Error(transport::rank_prefix(rank_) + rx_broken_);
  if (!op.header_seen && rx_in_message_) {
    fail_receive("the connection from rank " + std::to_string(peer_) +
                 " is unusable: a message from it was abandoned half-way");
  }
  bool moved = false;
  while (!op.done) {
    const size_t avail = rx_end_ - rx_begin_;
    if (!op.header_seen && avail >= kFrameHeadBytes) {
      take_head(op);
      moved = true;
      continue;
    }
    bool held = false;  // bytes are here that the limit holds back
    if (op.header_seen) {
      const size_t want = op.expected - op.received;
      const size_t allowed = op.limit > op.received ? op.limit - op.received : 0;
      size_t n = std::min({avail, want, allowed});
      if (n < want) n -= n % kPieceAlign;  // whole units, except for the message's last piece
      if (n > 0) {
        deliver(op, n);
        moved = true;
        continue;
      }
      held = allowed < want && avail >= std::min(want, allowed + kPieceAlign);
    }
    if (held && rx_end_ - rx_begin_ >= staging_bytes_ - kPieceAlign) {
      // Staging is full of bytes the limit holds back: only this rank's own send can release
      // them, so wait for socket space (want_write), not for more input.
      want_read_ = false;
      return moved;
    }
    if (!fill_staging()) break;
  }
  want_read_ = !op.done;
  return moved;
}

// Reads whatever the connection has into staging. False if nothing came (no data yet, or the
// connection ended).
bool DataConnection::fill_staging() {
  if (!rx_) {
    rx_.reset(static_cast<uint8_t*>(std::aligned_alloc(kPieceAlign, staging_bytes_)));
    if (!rx_) throw Error(transport::rank_prefix(rank_) + "cannot allocate tcp staging memory");
  }
  // What is left (a partial head, a partial 64-byte unit, or bytes RecvOp::limit holds back)
  // moves to the (aligned) front.
  const size_t left = rx_end_ - rx_begin_;
  if (rx_begin_ > 0) std::memmove(rx_.get(), rx_.get() + rx_begin_, left);
  rx_begin_ = 0;
  rx_end_ = left;
  if (rx_end_ == staging_bytes_) return false;  // full (a recv of 0 bytes would read as EOF)
  const Transfer t = receive_some(fd_.get(), rx_.get() + rx_end_, staging_bytes_ - rx_end_);
  if (t.ended()) ended_ = true;  // EOF, ECONNRESET
  rx_end_ += t.bytes;
  return t.moved();
}

void DataConnection::take_head(RecvOp& op) {
  const uint8_t* head = rx_.get() + rx_begin_;
  uint64_t magic = 0;
  std::memcpy(&magic, head, sizeof magic);
  if (magic != kMessageMagic) {
    fail_receive("message stream from rank " + std::to_string(peer_) +
                 " out of sync (no message head where one should start)");
  }
  MessageHeader header;
  std::memcpy(&header, head + sizeof magic, sizeof header);
  rx_begin_ += kFrameHeadBytes;
  rx_in_message_ = true;
  try {
    op.sink->on_header(header);
  } catch (...) {
    rx_broken_ = "the connection from rank " + std::to_string(peer_) +
                 " is unusable after a rejected message";
    throw;
  }
  op.header_seen = true;
  op.expected = header.payload_bytes;
  op.received = 0;
  if (op.expected == 0) {
    finish_receive(op);
    return;
  }
  // Pieces are handed out from aligned addresses: realign the buffered payload once.
  if (rx_begin_ % kPieceAlign != 0) {
    const size_t left = rx_end_ - rx_begin_;
    std::memmove(rx_.get(), rx_.get() + rx_begin_, left);
    rx_begin_ = 0;
    rx_end_ = left;
  }
}

void DataConnection::deliver(RecvOp& op, size_t n) {
  try {
    op.sink->on_data(op.received, rx_.get() + rx_begin_, n);
  } catch (...) {
    rx_broken_ =
        "the connection from rank " + std::to_string(peer_) + " is unusable after a failed receive";
    throw;
  }
  rx_begin_ += n;
  op.received += n;
  if (op.received == op.expected) finish_receive(op);
}

void DataConnection::finish_receive(RecvOp& op) {
  op.done = true;
  rx_in_message_ = false;
  if (rx_begin_ == rx_end_) rx_begin_ = rx_end_ = 0;
}

}  // namespace stragg::tcp
