// TCP transport for ranks on different hosts (no torch here).
//
// The parts, one file each (their opening comments hold the details):
//   mesh.h             setup: listen, publish the address, connect the full mesh under a deadline
//   handshake.h        the hello each connection starts with, checked against published records
//   listener.h         the listening socket (open for the transport's life: re-dials)
//   address.h          resolving and printing addresses; local_address_toward() below
//   socket.h           owned descriptors, socket options, non-blocking transfers
//   data_connection.h  per peer: framing, bounded receive staging, progress of SendOp/RecvOp,
//                      the resumable stream (offsets, retransmit buffer: resend_buffer.h)
//   control.h          per peer: control frames (abort, heartbeats with the published progress,
//                      acks of the data stream)
//   resume.h           re-dialing a connection that broke while both ranks live
//   heartbeat.h        what silence means: a stopped peer, or a link that is down
//   wait.h             the activity count and the ppoll() set of wait_for_activity()
// This class composes them: every pair of ranks shares a data and a control connection.
//
// Dead peers. A peer is dead when its data connection has ended and nothing it sent is left to
// read: EOF on recv, or POLLRDHUP (its FIN) once the bytes before the FIN were consumed. The
// data stream (not the control one) decides because its FIN arrives only after every byte the
// peer sent, so a peer that finished its sends and exited is not declared dead while a slower
// rank still has its last bytes to read. A connection that fails with an error instead (a reset:
// ECONNRESET, ECONNABORTED, EPIPE) is re-dialed and its stream resumed (resume.h): the executor
// sees a stall, no error. The peer is dead when the re-dial proves it gone: refused (a killed
// process's listener is gone with it; a killed process with unread bytes resets its
// connections, so a reset alone is no proof), or its control connection had ended. A killed
// process is seen at once (the kernel closes its sockets); dead_peers() polls all data
// connections without blocking, so it answers immediately.
//
// Stopped peers and cut links: see heartbeat.h.
//
// Threads: one heartbeat thread per transport (beats, reads control input, accepts and makes
// re-dials, drives resumed streams while the executor is idle). progress(),
// wait_for_activity() and dead_peers() are called by one thread (the executor's);
// signal_abort(), abort_reason(), publish_progress() and peer_status() may be called from any
// thread (control state is guarded by a mutex, each data connection by its peer's mutex; the
// order is always the transport's mutex first).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/rendezvous.h"
#include "transport/group_transport.h"
#include "transport/transport.h"

namespace stragg {

namespace tcp {
class Activity;
class PollSet;
class Reconnector;
struct ReconnectEvent;
}  // namespace tcp

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
  // TCP_NOTSENT_LOWAT of the data connections while sends are paced (set_paced_sends; 0: never
  // limit): a send finishes when at most this many of its bytes wait unsent. Unpaced, a send to
  // a new peer finished as soon as the kernel buffered it, the executor's window slid on, and
  // StragglAR's later rounds shared the link with the round everybody waited for. Not always on:
  // Ring and OptCC lose the kernel's buffering behind a slow link.
  size_t unsent_bytes = 256 * 1024;
  // Retransmit buffer per peer (resend_buffer.h, at least 64 KiB): what was sent to it and not
  // yet acknowledged, kept to resend after a re-dial. A send waits while it is full.
  size_t resend_bytes = 4 * 1024 * 1024;
  // Longest wait between two attempts to re-dial a broken connection (the first is at once,
  // then 50 ms, doubling up to this).
  std::chrono::milliseconds redial_backoff_max{2000};
};

class TcpTransport final : public GroupTransport {
 public:
  // Collective over all `size` ranks: listens, publishes the address through `rdv` under
  // `key_prefix`, connects the full mesh and checks every peer's identity. Throws stragg::Error
  // (or TimeoutError) naming this rank and the peer that failed or never joined.
  TcpTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
               const TcpOptions& options);
  // Stops the heartbeat thread; closing the sockets is the goodbye: peers see EOF.
  ~TcpTransport() override;

  const char* name() const override { return "tcp"; }
  bool over_network() const override { return true; }
  // A send copies its bytes into the socket before op.sent counts them, so a receive may land
  // whatever a send of the same step has counted (RecvOp::limit).
  bool supports_recv_limit() const override { return true; }
  // TCP_NOTSENT_LOWAT = options().unsent_bytes on every data connection, or the kernel's.
  void set_paced_sends(bool paced) override;

  // On op.peer's data connection; finding it ended marks the peer dead.
  bool progress(SendOp& op) override;
  bool progress(RecvOp& op) override;
  uint64_t activity_token() override;
  // ppoll() on the wake eventfd and the connections (see wait.h).
  void wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) override;

  // Queues an ABORT frame to every peer and waits (at most ~1 s) for the frames to leave.
  void signal_abort(const std::string& reason) override;
  // This and the two below read whatever arrived on the control connections first.
  std::optional<std::string> abort_reason() override;
  std::vector<int> dead_peers() override;
  // Dead or hung up (its FIN arrived, bytes before it may be unread).
  std::vector<int> gone_peers() override;
  // Beats carry it; a new collective (seq) is sent at once.
  void publish_progress(const Progress& progress) override;
  PeerStatus peer_status(int peer) override;
  // "tcp_staging_bytes", "tcp_resend_buffer_bytes", "tcp_reconnects" (connections re-dialed
  // after a reset, data and control counted apart), "tcp_resent_bytes" (data resent after
  // them), "tcp_redial_attempts" (dials and probes tried), and every peer via TCP
  // (peer_stats.h).
  TransportStats stats() const override;

  // For tests: breaks the connections to `peer` (data and/or control) the way a reset does:
  // the peer gets a RST, this side's next use fails with ECONNRESET (connect(AF_UNSPEC)).
  void reset_connections(int peer, bool data = true, bool control = true);

  // For transports composed of this one (transport/mixed), from any thread: bump the activity
  // count, so that a wait_for_activity() in another thread returns.
  void wake();

  const TcpOptions& options() const { return options_; }
  // The "host:port" this rank listened on during setup.
  const std::string& listen_address() const { return listen_address_; }

 private:
  struct Peer;  // a peer's data and control connection and whether it died

  Peer& peer_for(int peer, const char* what);
  template <class Op>
  bool progress_data(Op& op, const char* what);
  void after_data_locked(int peer);
  void mark_dead_locked(int peer);
  void hung_up_locked(int peer);
  void lost_locked(int peer, uint32_t channel, int err);
  void gone_locked(int peer);
  void heartbeat_loop();
  void apply_reconnects_locked(std::vector<tcp::ReconnectEvent>& events);
  bool pump_data_locked();
  void send_beats_locked();
  void set_abort_reason_locked(std::string reason);
  void read_control_locked(int peer);
  void flush_control_locked(int peer);
  void drain_control_locked();
  void flush_control_blocking_locked(std::chrono::milliseconds budget);
  void poll_data_hangups_locked();
  // Dead peers, and with `hung_up_too` those whose FIN arrived (dead_peers / gone_peers).
  std::vector<int> peers_found(bool hung_up_too);
  void fill_poll_set();
  bool handle_poll_results();  // true if a data connection or the wake fd had news

  TcpOptions options_;
  bool paced_ = false;
  std::string listen_address_;
  std::vector<std::unique_ptr<Peer>> peers_;  // indexed by rank; our own entry stays unused
  std::unique_ptr<tcp::Activity> activity_;
  std::unique_ptr<tcp::PollSet> poll_set_;  // scratch of wait_for_activity()
  std::unique_ptr<tcp::Activity> beat_wake_;  // wakes the heartbeat thread's poll
  std::unique_ptr<tcp::Reconnector> reconnector_;  // guarded by mu_
  std::vector<int> beat_quiet_fd_;  // heartbeat thread: a data fd whose hang-up it leaves alone
  std::atomic<int64_t> reconnects_{0};
  std::atomic<int64_t> redial_attempts_{0};

  // Control-plane state shared with other threads (with every Peer's control connection).
  std::mutex mu_;
  std::optional<std::string> abort_reason_;
  bool abort_sent_ = false;
  Progress own_progress_;
  bool stopping_ = false;
  bool beat_now_ = false;  // a re-dialed control connection wants a beat at once
  std::thread heartbeat_;  // started last, stopped first
};

// The local address this host uses to reach `host` (an IP literal or name): a UDP socket is
// "connected" to it, which picks the route and source address without sending a packet. Meant
// for TcpOptions::advertise_host (e.g. toward the TCPStore host). Throws stragg::Error.
std::string local_address_toward(const std::string& host);

}  // namespace stragg
