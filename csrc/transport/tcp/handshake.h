// Identities and the handshake of TCP setup.
//
// Every pair of ranks shares two TCP connections, made once at setup: a DATA connection that
// carries the messages (data_connection.h) and a CONTROL connection that carries small frames
// (control.h). Each rank listens (listener.h), publishes the record "advertise_host|port|nonce"
// through the rendezvous, then the higher rank of each pair connects to the lower one, once per
// channel (mesh.h). The connector sends a hello {magic, version, channel, from, to, size,
// from_nonce, to_nonce}; the acceptor checks it against the published records (so a stale
// process or a stray connection cannot pose as a rank) and answers with its own hello, which the
// connector checks in turn. The nonce is random per process and setup, so a record can only be
// matched by the process that published it. Binary fields travel in native byte order (ranks
// must share endianness, as the verbatim MessageHeader already requires).
//
// Re-dials (resume.h): after setup the listening socket stays open, and a connection that breaks
// while both ranks live (a reset) is dialed again by the rank that dialed it at setup, with the
// same hello carrying kHelloResume in `flags` (the acceptor checks the same identity, nonces
// included, so only the process that set up the group can take its connection back; a
// restarted process has a new nonce). A resume handshake does not retry refusals itself: a
// refused re-dial means the peer's listener is gone, i.e. its process or transport is.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/tcp/socket.h"

namespace stragg {
struct TcpOptions;
}

namespace stragg::tcp {

using Clock = std::chrono::steady_clock;

enum Channel : uint32_t { kDataChannel = 0, kControlChannel = 1, kNumChannels = 2 };
constexpr uint32_t kHelloResume = 1;  // Hello::flags: a re-dial of a connection set up before

struct Hello {
  uint64_t magic;
  uint32_t version;
  uint32_t channel;
  int32_t from;
  int32_t to;
  int32_t size;
  uint32_t flags;  // kHelloResume on a re-dial
  uint64_t from_nonce;
  uint64_t to_nonce;
};
static_assert(sizeof(Hello) == 48, "hello is sent as raw bytes");

// What a rank published: where it listens and the nonce of its process.
struct PeerRecord {
  std::string host;
  uint16_t port = 0;
  uint64_t nonce = 0;
};

std::string format_record(const PeerRecord& record);
// Throws std::invalid_argument if `value` is not a record.
PeerRecord parse_record(const std::string& value);

uint64_t random_nonce();

// This rank's identity and every rank's record: what the hellos are made of and checked against.
struct Directory {
  int rank = 0;
  int size = 0;
  uint64_t nonce = 0;               // this rank's
  std::vector<PeerRecord> records;  // by rank, this rank's included

  // "stragg: rank R: tcp transport setup", the start of every setup error.
  std::string context() const;
  // "rank P at host:port".
  std::string peer_address(int peer) const;
  Hello hello_to(int peer, uint32_t channel, uint32_t flags = 0) const;
  // Why a hello received from a connecting rank is not acceptable ("" if it is). Whether that
  // rank already connected on the channel is the mesh's to check.
  std::string check_hello(const Hello& h) const;
  // True if `h` is `peer`'s correct answer on `channel` (with the same `flags`).
  bool reply_matches(const Hello& h, int peer, uint32_t channel, uint32_t flags = 0) const;
};

// One connection being made. Outgoing: connect (a refusal is retried for a short while: the
// peer listens before publishing its address, so a refusal means it is gone or the address is
// wrong), send the hello, read and check the reply. Incoming: accepted; read the hello, which the
// mesh judges, then send the reply. Refers to `dir` and `options`, which must outlive it.
class Handshake {
 public:
  // Outgoing connection to `peer` on `channel`; starts connecting. Throws stragg::Error.
  // `resume`: a re-dial (kHelloResume); then a failure to connect is not retried nor thrown
  // but leaves failed() (and the socket closed), a bad reply throws as usual, and refused() /
  // wrong_identity() say whether the failure proves the peer gone.
  Handshake(const Directory& dir, const TcpOptions& options, int peer, uint32_t channel,
            bool resume = false);
  // Incoming connection, just accepted from `remote`.
  Handshake(const Directory& dir, const TcpOptions& options, Fd fd, std::string remote);

  bool outgoing() const { return outgoing_; }
  int peer() const { return peer_; }  // incoming: -1 until its hello was accepted
  uint32_t channel() const { return channel_; }
  const std::string& remote() const { return remote_; }
  int fd() const { return fd_.get(); }
  bool has_fd() const { return fd_.valid(); }
  bool connecting() const { return connecting_; }
  bool resume() const { return resume_; }
  bool failed() const { return failed_; }
  // Resume mode, after a throw: the connection was refused (nobody listens at the peer's
  // address), or the peer answered with another identity (another process listens there).
  bool refused() const { return refused_; }
  bool wrong_identity() const { return wrong_identity_; }

  // Outgoing and closed after a refusal: reconnects once `now` reached retry_at().
  void reconnect_if_due(Clock::time_point now);
  Clock::time_point retry_at() const { return retry_at_; }
  short poll_events() const;

  // The socket is writable (or failed): finishes connecting, sends the hello. Outgoing: throws
  // stragg::Error when the connection cannot be made. Incoming: a failed send closes the socket.
  void on_writable();
  // Reads the peer's hello. Outgoing: checks the reply; throws stragg::Error on a wrong identity
  // or a closed connection. Incoming: false if the connection closed before the hello came.
  bool on_readable();

  // Incoming: the hello is complete and waits for the mesh's verdict.
  bool awaiting_verdict() const;
  const Hello& received() const { return in_; }
  // Incoming: takes the peer and channel from the (checked) hello and prepares the reply.
  void accept_hello();

  // Both hellos went through: the connection is ready for use.
  bool complete() const;
  Fd take_fd() { return std::move(fd_); }
  // Installed or dropped by the mesh: to be removed from its list.
  bool retired = false;

 private:
  void start_connect();
  void connect_failed(int err);

  const Directory* dir_;
  const TcpOptions* options_;
  Fd fd_;
  bool outgoing_ = false;
  bool resume_ = false;
  bool refused_ = false;
  bool wrong_identity_ = false;
  bool failed_ = false;
  int peer_ = -1;
  uint32_t channel_ = 0;
  std::string remote_;
  bool connecting_ = false;  // outgoing: connect() still in progress
  int attempts_ = 0;
  Clock::time_point retry_at_{};  // outgoing: closed after a refusal, reconnect at this time
  Hello out_{};
  size_t out_sent_ = 0;
  bool out_ready_ = false;  // `out_` is prepared and may be sent
  Hello in_{};
  size_t in_got_ = 0;
};

}  // namespace stragg::tcp
