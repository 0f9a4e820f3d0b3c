// TCP transport for ranks on different hosts (no torch here).
//
// Connections. Every pair of ranks shares two TCP connections, made once at setup: a DATA
// connection that carries the messages and a CONTROL connection that carries small frames (abort,
// arrival tickets). Each rank listens (bind_host or advertise_host; port 0 = ephemeral),
// publishes "advertise_host|port|nonce" through the rendezvous (exchange_all, which names ranks
// that never join), then the higher rank of each pair connects to the lower one, twice. The
// connector sends a hello {magic, version, channel, from, to, size, from_nonce, to_nonce}; the
// acceptor checks it against the published records (so a stale process or a stray connection
// cannot pose as a rank) and answers with its own hello, which the connector checks in turn.
// The listening socket is closed once the mesh is up. Sockets are non-blocking, TCP_NODELAY,
// close-on-exec; sends use MSG_NOSIGNAL, so SIGPIPE never fires. Binary fields travel in native
// byte order (ranks must share endianness, as the verbatim MessageHeader already requires).
//
// Data framing. The data connection from A to B is one FIFO byte stream of messages:
//   8-byte magic | MessageHeader (64 bytes, copied verbatim) | payload_bytes of payload.
// The sender writes straight from the caller's buffer (sendmsg with the frame head and the
// payload as two iovecs), so it needs no staging. The receiver reads into a bounded staging
// buffer per peer (TcpOptions::staging_bytes, allocated on the first receive from that peer):
// on_header() runs as soon as the head is complete, then on_data() gets consecutive pieces
// straight from the staging buffer. Pieces start 64-byte aligned and, except for the last one of
// a message, are multiples of 64 bytes, so they never split an element. Bytes read past the end
// of a message (the start of the next one) stay in staging for the next RecvOp. Memory per peer
// is therefore staging_bytes plus the kernel socket buffers, whatever the message size. A
// message rejected by on_header() (or abandoned half-way) leaves the stream unusable; later
// operations on it throw instead of misreading it.
//
// Control path. A control frame is {uint32 type, uint32 length, payload}: ABORT carries the
// reason, ARRIVAL the int64 sequence number. Control connections are read whenever this rank
// waits or asks about the group's state (abort_reason, dead_peers, peer_arrival, signal_abort),
// independently of the receives posted on the data connections, so an abort reaches a rank that
// is blocked on some other peer and has no receive posted for the aborting one. Outgoing control
// bytes are bounded: an unsent arrival ticket is replaced by the newer one, the abort frame is
// queued once, and signal_abort() waits (at most ~1 s) for its frames to leave.
//
// Wake-ups. activity_token() is an event count bumped when the transport itself learns something
// (abort received or signalled, a peer found dead). wait_for_activity(token) returns at once if
// the count moved; otherwise it blocks in ppoll() on:
//   - an eventfd, written when another thread signals an abort or finds news;
//   - every open control connection: POLLIN (and POLLOUT while control bytes are queued);
//   - every live data connection: POLLRDHUP always (peer closed), POLLIN if the last progress()
//     left a receive from that peer unfinished, POLLOUT if it left a send to it unfinished.
// poll() is level-triggered, so bytes or socket space that appeared after progress() gave up are
// seen by the wait: no wake-up is lost between polling the ops and waiting.
//
// Dead peers. A peer is dead when its data connection has ended: EOF or an error on recv,
// EPIPE/ECONNRESET on send, or POLLRDHUP/POLLHUP/POLLERR. The data stream (not the control one)
// decides because its FIN arrives only after every byte the peer sent, so a peer that finished
// and closed over a slow link is not declared dead while its last bytes are still arriving. A
// killed process is seen at once (the kernel closes its sockets); dead_peers() polls all data
// connections without blocking, so it answers immediately.
//
// Threads: no background threads. progress() and wait_for_activity() are called by one thread
// (the executor's); signal_abort(), abort_reason(), dead_peers(), announce_arrival() and
// peer_arrival() may be called from any thread (control state is guarded by a mutex).
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/rendezvous.h"
#include "transport/transport.h"

namespace stragg {

struct TcpOptions {
  // Address the peers connect to (IPv4/IPv6 literal or a resolvable name). See
  // local_address_toward() for picking the address of the interface that reaches the store.
  std::string advertise_host = "127.0.0.1";
  // Address to listen on; empty means advertise_host. "0.0.0.0" / "::" listen on all interfaces.
  std::string bind_host;
  uint16_t port = 0;  // 0: ephemeral port (several ranks per address); otherwise this exact port
  // Limit for the address exchange (ranks that never join), and again for connecting the mesh.
  std::chrono::milliseconds setup_timeout{std::chrono::minutes(5)};
  size_t staging_bytes = 512 * 1024;  // receive staging per peer (at least 4 KiB, 64-byte multiple)
  int socket_send_buffer = 0;         // SO_SNDBUF bytes; 0 keeps the kernel's autotuning
  int socket_recv_buffer = 0;         // SO_RCVBUF bytes; 0 keeps the kernel's autotuning
};

class TcpTransport final : public Transport {
 public:
  // Collective over all `size` ranks: listens, publishes the address through `rdv` under
  // `key_prefix`, connects the full mesh and checks every peer's identity. Throws stragg::Error
  // (or TimeoutError) naming this rank and the peer that failed or never joined.
  TcpTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
               const TcpOptions& options);
  ~TcpTransport() override;

  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  const char* name() const override { return "tcp"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  bool progress(SendOp& op) override;
  bool progress(RecvOp& op) override;
  uint64_t activity_token() override;
  void wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) override;

  void signal_abort(const std::string& reason) override;
  std::optional<std::string> abort_reason() override;
  std::vector<int> dead_peers() override;
  void announce_arrival(uint64_t coll_seq) override;
  int64_t peer_arrival(int peer) override;

  const TcpOptions& options() const { return options_; }
  // The "host:port" this rank listened on during setup.
  const std::string& listen_address() const { return listen_address_; }

 private:
  struct Peer;
  struct Setup;

  Peer& peer_for(int peer, const char* what);
  bool fill_staging(int peer);
  void take_head(RecvOp& op, Peer& p);
  void deliver(RecvOp& op, Peer& p, size_t n);
  void finish_receive(RecvOp& op, Peer& p);
  void mark_dead_locked(int peer);
  void mark_dead(int peer);
  void drain_control_locked();
  void read_control_locked(int peer);
  void handle_control_frame_locked(int peer, uint32_t type, const uint8_t* payload, size_t len);
  void queue_control_locked(int peer, uint32_t type, const void* payload, size_t len);
  bool flush_control_locked(int peer);
  void flush_control_blocking_locked(std::chrono::milliseconds budget);
  void poll_data_hangups_locked();
  void wake();
  void note_event();

  int rank_;
  int size_;
  TcpOptions options_;
  std::string listen_address_;
  std::vector<Peer> peers_;  // indexed by rank; our own entry stays unused
  int wake_fd_ = -1;         // eventfd: wakes wait_for_activity() for news found elsewhere
  std::atomic<uint64_t> events_{0};

  // Control-plane state shared with other threads.
  std::mutex mu_;
  std::optional<std::string> abort_reason_;
  bool abort_sent_ = false;
  int64_t own_arrival_ = -1;

  // Scratch for wait_for_activity(): what to poll and which peer / connection each entry is.
  std::vector<pollfd> poll_fds_;
  std::vector<int> poll_peers_;     // -1: the wake fd
  std::vector<char> poll_is_data_;  // data (1) or control (0) connection
};

// The local address this host uses to reach `host` (an IP literal or name): a UDP socket is
// "connected" to it, which picks the route and source address without sending a packet. Meant
// for TcpOptions::advertise_host (e.g. toward the TCPStore host). Throws stragg::Error.
std::string local_address_toward(const std::string& host);

}  // namespace stragg
