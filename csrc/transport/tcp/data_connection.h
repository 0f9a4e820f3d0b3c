// One peer's data connection in the TCP transport: framing, staging, and progress of the
// SendOps and RecvOps on it.
//
// The data connection from A to B is one FIFO byte stream of messages:
//   8-byte magic | MessageHeader (64 bytes, copied verbatim) | payload_bytes of payload.
// The sender writes straight from the caller's buffer (sendmsg with the frame head and the
// payload as two iovecs), so it needs no staging. The receiver reads into a bounded staging
// buffer (staging_bytes, allocated on the first receive from that peer): on_header() runs as
// soon as the head is complete, then on_data() gets consecutive pieces straight from the staging
// buffer. Pieces start 64-byte aligned and, except for the last one of a message, are multiples
// of 64 bytes, so they never split an element. Bytes read past the end of a message (the start
// of the next one) stay in staging for the next RecvOp. RecvOp::limit holds bytes back in staging
// (then in the socket) until the executor raises it. Memory per peer is therefore
// staging_bytes plus the kernel socket buffers, whatever the message size. A message rejected by
// on_header() (or abandoned half-way) leaves the stream unusable; later operations on it throw
// instead of misreading it.
//
// The end of this connection (EOF or an error on recv, EPIPE/ECONNRESET on send) is what makes
// the transport declare the peer dead (see tcp_transport.h). Used by one thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace stragg::tcp {

// Data stream: every message starts with this frame head (magic + MessageHeader).
constexpr size_t kFrameHeadBytes = sizeof(uint64_t) + sizeof(MessageHeader);
// Payload pieces start aligned and are multiples of this (except a message's last piece), so
// they never split an element of any dtype. Staging sizes are multiples of it, too.
constexpr size_t kPieceAlign = 64;
constexpr size_t kMinStagingBytes = 4096;

class DataConnection {
 public:
  // `staging_bytes`: a multiple of kPieceAlign, at least kMinStagingBytes. `rank` and `peer`
  // name the two ends in error messages.
  DataConnection(Fd fd, int rank, int peer, size_t staging_bytes);

  int fd() const { return fd_.get(); }

  // Advance the op as far as possible without blocking; true if anything moved. Throws
  // stragg::Error when the stream is unusable (and whatever the sink throws).
  bool progress(SendOp& op);
  bool progress(RecvOp& op);

  // The connection ended (EOF or an error): the peer is gone.
  bool ended() const { return ended_; }
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
  bool ended_ = false;
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
};

}  // namespace stragg::tcp
