// Re-dialing the TCP transport's connections that break while both ranks live.
//
// A connection that fails with an error (ECONNRESET, ECONNABORTED from `ss -K`, EPIPE: a reset
// on either side, a middlebox, a conntrack flush) is *lost*; the stream it carried is not (see
// data_connection.h). The rank that dialed it at setup (the higher one) dials again, with the
// resume hello (handshake.h); the other accepts on the listener it kept open since setup. The
// hellos check the identity as at setup, nonces included, so only the process that set up the
// group gets its connection back.
//
// Dead or reset? A killed process with unread bytes resets its connections too (RST, not FIN),
// so a reset alone proves nothing; its listener is gone with it, though:
//   * the dialing side: a refused re-dial (ECONNREFUSED), or another process answering at the
//     peer's address, means the peer is gone;
//   * the accepting side waits for the peer's re-dial and meanwhile probes the peer's listener
//     (a bare connect, closed at once): refused means gone.
// Any other failure (a timeout, an unreachable network: a cable out as well) is retried with a
// backoff that doubles from kFirstRetry up to TcpOptions::redial_backoff_max, so a flap costs a
// few attempts, not a storm; the collective's timeout and the heartbeats (heartbeat.h) still
// decide what a peer that stays unreachable means.
//
// Not thread-safe: the transport guards it with its mutex; its heartbeat thread polls it.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "transport/tcp/handshake.h"
#include "transport/tcp/listener.h"
#include "transport/tcp/socket.h"

namespace stragg {
struct TcpOptions;
}

namespace stragg::tcp {

constexpr auto kFirstRetry = std::chrono::milliseconds(50);
// An attempt (connect + hellos, or a probe) is abandoned after this long (more after failures).
constexpr auto kAttemptTimeout = std::chrono::milliseconds(1000);
// An incoming connection that does not complete its hello within this is dropped.
constexpr auto kIncomingTimeout = std::chrono::seconds(10);
constexpr size_t kMaxIncoming = 64;  // pending incoming connections kept at most

// What the Reconnector reports.
struct ReconnectEvent {
  enum Kind { kConnected, kGone } kind = kConnected;
  int peer = -1;
  uint32_t channel = 0;
  Fd fd;                      // kConnected: the new connection
  bool noticed = false;       // kConnected: this rank had seen the loss (else the peer had)
  Clock::duration stalled{};  // kConnected: since this rank saw the loss
  int err = 0;                // kConnected: the loss's errno (0 if not noticed)
  std::string why;            // kGone: what shows the peer is gone
};

class Reconnector {
 public:
  Reconnector(std::unique_ptr<Listener> listener, Directory directory, const TcpOptions& options);

  const Directory& directory() const { return dir_; }

  // The connection to `peer` on `channel` broke with `err`: re-dial it, or wait for the peer's
  // re-dial (probing its listener). A loss already being handled is not restarted.
  void lost(int peer, uint32_t channel, int err, Clock::time_point now);
  bool waiting(int peer, uint32_t channel) const { return links_[peer][channel].lost; }
  // The peer is dead: nothing to re-dial, its re-dials are refused.
  void forget(int peer);

  using Event = ReconnectEvent;

  // Starts due attempts, abandons late ones; events go to `out`.
  void tick(Clock::time_point now, std::vector<Event>* out);
  // Appends what to poll (the listener, attempts, probes, incoming handshakes) and lowers
  // *wake_at to the next timer. Entries are remembered for handle().
  void add_poll(std::vector<pollfd>& fds, Clock::time_point* wake_at);
  // After the poll: `fds` as add_poll left it (results filled in).
  void handle(const std::vector<pollfd>& fds, Clock::time_point now, std::vector<Event>* out);

  // Dial and probe attempts started so far.
  int64_t attempts() const { return attempts_; }

 private:
  struct Link {
    bool lost = false;
    Clock::time_point lost_at{};
    int err = 0;
    int tries = 0;  // failed attempts since the loss
    Clock::time_point next_try{};
    std::optional<Handshake> dial;  // dialing side: the attempt in flight
    Fd probe;                       // accepting side: the probe in flight
    Clock::time_point deadline{};   // of the attempt or probe in flight
  };
  struct Incoming {
    Handshake hs;
    Clock::time_point deadline;
  };
  enum EntryKind : uint8_t { kListen, kDial, kProbe, kIncoming };
  struct Entry {
    EntryKind kind;
    int peer;  // kDial/kProbe: the peer; kIncoming: index into incoming_
    uint32_t channel;
    int fd;
  };

  void retry_later(Link& link, Clock::time_point now);
  Clock::duration attempt_timeout(const Link& link) const;
  void fail_dial(int peer, uint32_t channel, Clock::time_point now, std::vector<Event>* out);
  void start_probe(int peer, uint32_t channel, Clock::time_point now, std::vector<Event>* out);
  void on_dial(int peer, uint32_t channel, short revents, Clock::time_point now,
               std::vector<Event>* out);
  void on_probe(int peer, uint32_t channel, Clock::time_point now, std::vector<Event>* out);
  void on_incoming(Incoming& in, short revents, Clock::time_point now, std::vector<Event>* out);
  void connected(int peer, uint32_t channel, Fd fd, Clock::time_point now,
                 std::vector<Event>* out);
  void gone(int peer, std::string why, std::vector<Event>* out);

  std::unique_ptr<Listener> listener_;
  Directory dir_;
  const TcpOptions& options_;
  std::vector<std::vector<Link>> links_;  // [peer][channel]
  std::vector<bool> forgotten_;
  std::vector<std::unique_ptr<Incoming>> incoming_;
  std::vector<Entry> entries_;  // what add_poll appended, in order
  size_t first_entry_ = 0;      // index in the pollfd vector of entries_[0]
  int64_t attempts_ = 0;
};

}  // namespace stragg::tcp
