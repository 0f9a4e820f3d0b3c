#include "transport/tcp/data_connection.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/common.h"

namespace stragg::tcp {
namespace {

constexpr uint64_t kMessageMagic = 0x53545241474d5347ull;  // "STRAGMSG"
constexpr uint64_t kResumeMagic = 0x5354524147525355ull;   // "STRAGRSU"

}  // namespace

DataConnection::DataConnection(Fd fd, int rank, int peer, size_t staging_bytes,
                               size_t resend_bytes)
    : fd_(std::move(fd)),
      rank_(rank),
      peer_(peer),
      staging_bytes_(staging_bytes),
      // The peer's buffer is as large as ours (the same options): an ack every quarter of it
      // keeps a busy sender from waiting; heartbeats acknowledge the rest.
      ack_every_(std::max(resend_bytes, kMinResendBytes) / 4),
      resend_(std::max(resend_bytes, kMinResendBytes)) {}

bool DataConnection::has_unread() const {
  if (rx_end_ > rx_begin_) return true;
  if (!socket_readable()) return false;  // a lost socket's bytes come again after the re-dial
  int queued = 0;
  return ioctl(fd_.get(), FIONREAD, &queued) == 0 && queued > 0;
}

void DataConnection::set_unsent_limit(size_t bytes) {
  unsent_limit_ = bytes;
  if (fd_.valid()) tcp::set_unsent_limit(fd_.get(), bytes);
}

// ------------------------------------------------------------------------------------------------
// Losing and resuming the connection

void DataConnection::lose(int err) {
  if (lost_ || ended_) return;
  lost_ = true;
  lost_err_ = err != 0 ? err : ECONNRESET;
  fd_.reset();
  resuming_ = false;
  want_read_ = want_write_ = false;
  loss_pending_.store(true);
}

int DataConnection::take_loss() {
  if (!loss_pending_.exchange(false) || !lost_) return 0;
  return lost_err_;
}

void DataConnection::desync(const std::string& why) {
  rx_broken_ = tx_broken_ = why;
  ended_ = true;  // nothing on this stream can be trusted: the peer counts as gone
  fd_.reset();
}

void DataConnection::check_socket(int polled_fd) {
  if (polled_fd != fd_.get() || !fd_.valid() || lost_ || ended_) return;
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0) {
    lose(err);
    return;
  }
  // No pending error: a peek tells an orderly end (0), bytes still to read (> 0), or a socket
  // that failed without one (an error).
  uint8_t byte;
  const ssize_t r = ::recv(fd_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    lose(errno);
  } else if (r == 0 && !resuming_) {
    ended_ = true;
  }
}

void DataConnection::resume(Fd fd) {
  fd_ = std::move(fd);
  if (unsent_limit_ > 0) tcp::set_unsent_limit(fd_.get(), unsent_limit_);
  lost_ = false;
  lost_err_ = 0;
  loss_pending_.store(false);
  resuming_ = true;
  std::memcpy(pre_out_, &kResumeMagic, sizeof kResumeMagic);
  std::memcpy(pre_out_ + sizeof kResumeMagic, &rx_offset_, sizeof rx_offset_);
  pre_out_sent_ = 0;
  pre_in_got_ = 0;
  want_read_ = want_write_ = false;
}

bool DataConnection::carrying() const {
  return fd_.valid() && !lost_ && !ended_ && !resuming_ && tx_sent_ == resend_.end();
}

short DataConnection::pump_events() const {
  if (!fd_.valid() || lost_ || ended_) return 0;
  if (resuming_) {
    return static_cast<short>((pre_out_sent_ < sizeof pre_out_ ? POLLOUT : 0) |
                              (pre_in_got_ < sizeof pre_in_ ? POLLIN : 0));
  }
  return tx_sent_ < resend_.end() ? POLLOUT : 0;
}

bool DataConnection::pump() {
  if (!fd_.valid() || lost_ || ended_) return false;
  bool moved = false;
  if (resuming_) {
    while (pre_out_sent_ < sizeof pre_out_) {
      const Transfer t =
          send_some(fd_.get(), pre_out_ + pre_out_sent_, sizeof pre_out_ - pre_out_sent_);
      if (t.would_block) break;
      if (t.ended()) {
        lose(t.err);
        return moved;
      }
      pre_out_sent_ += t.bytes;
      moved = true;
    }
    while (pre_in_got_ < sizeof pre_in_) {  // exactly the preamble: the stream follows it
      const Transfer t = receive_some(fd_.get(), pre_in_ + pre_in_got_, sizeof pre_in_ - pre_in_got_);
      if (t.would_block) break;
      if (t.ended()) {
        if (t.err == 0) {
          ended_ = true;
        } else {
          lose(t.err);
        }
        return moved;
      }
      pre_in_got_ += t.bytes;
      moved = true;
    }
    if (pre_out_sent_ < sizeof pre_out_ || pre_in_got_ < sizeof pre_in_) return moved;
    uint64_t magic = 0, peer_has = 0;
    std::memcpy(&magic, pre_in_, sizeof magic);
    std::memcpy(&peer_has, pre_in_ + sizeof magic, sizeof peer_has);
    if (magic != kResumeMagic) {
      desync("the re-dialed connection to rank " + std::to_string(peer_) +
             " does not resume the stream (no resume preamble)");
      return moved;
    }
    acked_.store(std::max(acked_.load(), std::min(peer_has, resend_.end())));
    if (peer_has < resend_.begin() || !resend_.release(peer_has)) {
      desync("rank " + std::to_string(peer_) + " resumes the stream at byte " +
             std::to_string(peer_has) + ", outside what was kept for it [" +
             std::to_string(resend_.begin()) + ", " + std::to_string(resend_.end()) + ")");
      return moved;
    }
    resent_.fetch_add(resend_.end() - peer_has, std::memory_order_relaxed);
    tx_sent_ = peer_has;
    resuming_ = false;
  }
  while (tx_sent_ < resend_.end()) {
    const uint8_t* data[2];
    size_t len[2];
    const int n = resend_.pieces(tx_sent_, data, len);
    iovec iov[2];
    for (int i = 0; i < n; ++i) iov[i] = {const_cast<uint8_t*>(data[i]), len[i]};
    const Transfer t = send_vector(fd_.get(), iov, n);
    if (t.would_block) break;
    if (t.ended()) {
      lose(t.err);
      return moved;
    }
    tx_sent_ += t.bytes;
    moved = true;
  }
  return moved;
}

void DataConnection::ack(uint64_t offset) {
  uint64_t cur = acked_.load();
  while (offset > cur && !acked_.compare_exchange_weak(cur, offset)) {
  }
}

uint64_t DataConnection::take_ack_due() {
  if (rx_offset_ - rx_acked_ < ack_every_) return 0;
  rx_acked_ = rx_offset_;
  return rx_offset_;
}

// Frees what the peer acknowledged; true if the retransmit buffer has room. Otherwise flags the
// wait for an ack (the transport wakes the waiter when one comes): flag, then look again, so an
// ack landing in between is not missed.
bool DataConnection::make_room() {
  auto release = [&] {
    if (!resend_.release(acked_.load())) {
      fail_send("rank " + std::to_string(peer_) + " acknowledged bytes it was never sent");
    }
  };
  release();
  if (resend_.room() > 0) return true;
  waiting_ack_.store(true);
  release();
  if (resend_.room() == 0) return false;
  waiting_ack_.store(false);
  return true;
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
  bool moved = pump();
  if (!op.started) {
    start_send(op);
    op.started = true;
  }
  want_write_ = false;
  if (!carrying()) return moved;  // lost, resuming or resending: pump_events() says what waits
  const size_t total = op.header.payload_bytes;
  auto* data = const_cast<uint8_t*>(static_cast<const uint8_t*>(op.data));
  while (!op.done) {
    if (!make_room()) break;  // waits for an ack, not for socket space
    size_t room = resend_.room();
    iovec iov[2];
    int n = 0;
    size_t want = 0;
    if (tx_head_sent_ < kFrameHeadBytes) {
      const size_t len = std::min(kFrameHeadBytes - tx_head_sent_, room);
      iov[n++] = {tx_head_ + tx_head_sent_, len};
      room -= len;
    }
    if (op.sent < total && room > 0) iov[n++] = {data + op.sent, std::min(total - op.sent, room)};
    for (int i = 0; i < n; ++i) want += iov[i].iov_len;
    const Transfer t = send_vector(fd_.get(), iov, n);
    if (!t.moved()) {
      if (t.ended()) {
        lose(t.err);  // EPIPE, ECONNRESET, ECONNABORTED: re-dialed, then resent
      } else {
        want_write_ = true;
      }
      break;
    }
    // Kept until the peer acknowledges it: the kernel's copy dies with the connection.
    size_t left = t.bytes;
    for (int i = 0; i < n && left > 0; ++i) {
      const size_t k = std::min(left, iov[i].iov_len);
      resend_.append(iov[i].iov_base, k);
      left -= k;
    }
    tx_sent_ += t.bytes;
    moved = true;
    const size_t head = std::min(t.bytes, kFrameHeadBytes - tx_head_sent_);
    tx_head_sent_ += head;
    op.sent += t.bytes - head;
    if (tx_head_sent_ == kFrameHeadBytes && op.sent == total) {
      op.done = true;
      tx_in_message_ = false;
    } else if (t.bytes < want) {
      want_write_ = true;  // the socket buffer is full
      break;
    }
  }
  return moved;
}

// ------------------------------------------------------------------------------------------------
// Receiving

bool DataConnection::progress(RecvOp& op) {
  if (!rx_broken_.empty()) throw Error(transport::rank_prefix(rank_) + rx_broken_);
  const bool pumped = pump();
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
      return moved || pumped;
    }
    if (!fill_staging()) break;
  }
  want_read_ = !op.done && socket_readable();
  return moved || pumped;
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
  if (!socket_readable()) return false;  // lost, or the resume preamble comes first
  const Transfer t = receive_some(fd_.get(), rx_.get() + rx_end_, staging_bytes_ - rx_end_);
  if (t.ended()) {
    if (t.err == 0) {
      ended_ = true;  // EOF: the peer closed the connection
    } else {
      lose(t.err);  // ECONNRESET, ECONNABORTED: re-dialed, the peer resends
    }
  }
  rx_end_ += t.bytes;
  rx_offset_ += t.bytes;
  rx_published_.store(rx_offset_, std::memory_order_relaxed);
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
