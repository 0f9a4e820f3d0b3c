// One peer's data connection in the TCP transport: framing, staging, and progress of the
// SendOps and RecvOps on it.
//
// The data connection from A to B is one FIFO byte stream of messages:
//   8-byte magic | MessageHeader (64 bytes, copied verbatim) | payload_bytes of payload.
// The sender writes straight from the caller's buffer (sendmsg with the frame head and the
// payload as two iovecs) and copies what the socket took into its retransmit buffer (below). The receiver reads into a bounded staging
// buffer (staging_bytes, allocated on the first receive from that peer): on_header() runs as
// soon as the head is complete, then on_data() gets consecutive pieces straight from the staging
// buffer. Pieces start 64-byte aligned and, except for the last one of a message, are multiples
// of 64 bytes, so they never split an element. Bytes read past the end of a message (the start
// of the next one) stay in staging for the next RecvOp. RecvOp::limit holds bytes back in staging
// (then in the socket) until the executor raises it. Memory per peer is therefore
// staging_bytes plus resend_bytes plus the kernel socket buffers, whatever the message size. A message rejected by
// on_header() (or abandoned half-way) leaves the stream unusable; later operations on it throw
// instead of misreading it.
//
// Resume. The bytes to a peer form one stream with a running offset. Every byte the socket
// takes is also copied into a bounded retransmit buffer (resend_buffer.h) and kept until the peer
// acknowledges it (ACK frames on the control connection, acknowledged every ack_bytes() it
// reads from its socket, and with every heartbeat); a send waits while the buffer is full. When
// the socket fails with an error (a reset, ECONNABORTED from `ss -K`, EPIPE) the connection is
// *lost*, not ended: staging and both offsets survive, the transport re-dials (resume.h) and
// hands over the new socket (resume()). Both ends then send a 16-byte preamble {magic, bytes
// received so far}; each resends its buffer from the offset the other received and the stream
// goes on: no byte lost, none applied twice. pump() drives the preamble and the resend; it is
// called with every progress() and by the transport while the executor is idle. An orderly EOF
// (the peer closed its socket: process exit or transport shutdown) ends the connection, as a
// lost connection that cannot be re-dialed does: that is what makes the transport declare the
// peer dead (see tcp_transport.h).
//
// Threads: one thread at a time (the transport holds the peer's data mutex around every call),
// except ack(), waiting_for_ack(), received_offset(), resent_bytes() and loss_pending(), which
// are atomic.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "transport/tcp/resend_buffer.h"
#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace stragg::tcp {

// Data stream: every message starts with this frame head (magic + MessageHeader).
constexpr size_t kFrameHeadBytes = sizeof(uint64_t) + sizeof(MessageHeader);
// Payload pieces start aligned and are multiples of this (except a message's last piece), so
// they never split an element of any dtype. Staging sizes are multiples of it, too.
constexpr size_t kPieceAlign = 64;
constexpr size_t kMinStagingBytes = 4096;
constexpr size_t kMinResendBytes = 64 * 1024;

class DataConnection {
 public:
  // `staging_bytes`: a multiple of kPieceAlign, at least kMinStagingBytes. `resend_bytes`: the
  // retransmit buffer (at least kMinResendBytes). `rank` and `peer` name the two ends in error
  // messages.
  DataConnection(Fd fd, int rank, int peer, size_t staging_bytes, size_t resend_bytes);

  // The socket; -1 while the connection is lost.
  int fd() const { return fd_.get(); }

  // Advance the op as far as possible without blocking; true if anything moved. Throws
  // stragg::Error when the stream is unusable (and whatever the sink throws).
  bool progress(SendOp& op);
  bool progress(RecvOp& op);

  // The connection ended (EOF): the peer closed it, nothing more can arrive.
  bool ended() const { return ended_; }
  // The socket failed with an error (reset, aborted): the stream waits for resume().
  bool lost() const { return lost_; }
  // A loss not yet taken by the transport (atomic hint) / take it: its errno, or 0 if none.
  bool loss_pending() const { return loss_pending_.load(); }
  int take_loss();
  // `polled_fd` showed POLLERR/POLLHUP: looks at the socket (its pending error, or what a
  // peek reads) and marks the connection lost or ended accordingly. Stale fds are ignored.
  void check_socket(int polled_fd);
  // A new connection carries the stream on (the old socket is closed): starts the preamble.
  void resume(Fd fd);
  // Drives the preamble and the resend of unacknowledged bytes; true if anything moved.
  bool pump();
  // POLLIN / POLLOUT the pump waits for (0: nothing to pump).
  short pump_events() const;
  // The stream is carried again (no preamble or resend pending): new sends may go.
  bool carrying() const;

  // The peer received our stream up to `offset` (thread-safe; frees the retransmit buffer).
  void ack(uint64_t offset);
  // A send waits for room in the retransmit buffer, i.e. for an ack (thread-safe).
  bool waiting_for_ack() const { return waiting_ack_.load(); }
  // Bytes of the peer's stream received so far (thread-safe).
  uint64_t received_offset() const { return rx_published_.load(std::memory_order_relaxed); }
  // The offset to acknowledge now, once per ack_bytes() received; 0 if none is due.
  uint64_t take_ack_due();
  size_t ack_bytes() const { return ack_every_; }
  // Bytes resent after re-dials (thread-safe).
  uint64_t resent_bytes() const { return resent_.load(std::memory_order_relaxed); }
  // TCP_NOTSENT_LOWAT of this and every later socket (0: the kernel's).
  void set_unsent_limit(size_t bytes);

  // Received bytes not handed to a sink yet: in staging or in the socket's receive queue.
  bool has_unread() const;
  // Whether the last progress() left a receive (send) on this connection unfinished, so a wait
  // must poll for readable (writable); wait_for_activity() clears them.
  bool want_read() const { return want_read_; }
  bool want_write() const { return want_write_; }
  void clear_wants() { want_read_ = want_write_ = false; }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };

  void start_send(const SendOp& op);
  bool make_room();
  void lose(int err);
  void desync(const std::string& why);
  bool socket_readable() const { return fd_.valid() && !lost_ && !ended_ && !resuming_; }
  bool fill_staging();
  void take_head(RecvOp& op);
  void deliver(RecvOp& op, size_t n);
  void finish_receive(RecvOp& op);
  [[noreturn]] void fail_receive(const std::string& why);
  [[noreturn]] void fail_send(const std::string& why);

  Fd fd_;
  int rank_;
  int peer_;
  size_t staging_bytes_;
  size_t ack_every_;
  bool ended_ = false;
  bool lost_ = false;
  int lost_err_ = 0;
  std::atomic<bool> loss_pending_{false};
  bool want_read_ = false;
  bool want_write_ = false;

  std::unique_ptr<uint8_t, FreeDeleter> rx_;  // staging, staging_bytes_, 64-byte aligned
  size_t rx_begin_ = 0;                       // unconsumed bytes are rx_[rx_begin_, rx_end_)
  size_t rx_end_ = 0;
  bool rx_in_message_ = false;  // a head was consumed, the payload is not complete yet
  bool tx_in_message_ = false;  // a head was started, the payload is not completely sent yet
  std::string rx_broken_;       // non-empty: the incoming stream is unusable, and why
  std::string tx_broken_;
  uint8_t tx_head_[kFrameHeadBytes] = {};
  size_t tx_head_sent_ = 0;

  // Resume state (see above).
  ResendBuffer resend_;             // [acked, written) of our stream
  uint64_t tx_sent_ = 0;            // offset of the next byte for the current socket
  std::atomic<uint64_t> acked_{0};  // what the peer acknowledged (written by any thread)
  std::atomic<bool> waiting_ack_{false};
  uint64_t rx_offset_ = 0;  // bytes of the peer's stream read from sockets
  std::atomic<uint64_t> rx_published_{0};
  uint64_t rx_acked_ = 0;  // the last offset take_ack_due() handed out
  std::atomic<uint64_t> resent_{0};
  size_t unsent_limit_ = 0;
  bool resuming_ = false;
  uint8_t pre_out_[16] = {};
  size_t pre_out_sent_ = 0;
  uint8_t pre_in_[16] = {};
  size_t pre_in_got_ = 0;
};

}  // namespace stragg::tcp
