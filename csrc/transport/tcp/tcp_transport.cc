#include "transport/tcp/tcp_transport.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "common/log.h"
#include "transport/common.h"
#include "transport/mixed/peer_stats.h"
#include "transport/tcp/control.h"
#include "transport/tcp/data_connection.h"
#include "transport/tcp/heartbeat.h"
#include "transport/tcp/mesh.h"
#include "transport/tcp/resume.h"
#include "transport/tcp/wait.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;
using transport::rank_prefix;

constexpr auto kAbortFlushBudget = std::chrono::milliseconds(1000);

const char* channel_name(uint32_t channel) {
  return channel == tcp::kDataChannel ? "data" : "control";
}

std::string seconds_text(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace

struct TcpTransport::Peer {
  Peer(tcp::Fd data_fd, int rank, int peer, const TcpOptions& o, tcp::Fd control_fd)
      : data(std::move(data_fd), rank, peer, o.staging_bytes, o.resend_bytes),
        control(std::move(control_fd)) {}
  std::mutex dmu;                  // guards `data` (taken after mu_, never before)
  tcp::DataConnection data;        // the executor's thread, and the heartbeat thread's pumps
  tcp::ControlConnection control;  // guarded by mu_
  bool dead = false;               // guarded by mu_
  bool hung_up = false;            // its FIN arrived (bytes before it may be unread); mu_
  bool gone = false;               // a refused re-dial proved its transport gone; mu_
};

// ------------------------------------------------------------------------------------------------
// Construction

TcpTransport::TcpTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                           const TcpOptions& options)
    : GroupTransport("tcp", rank, size), options_(options) {
  options_.staging_bytes = transport::round_up(
      std::max(options_.staging_bytes, tcp::kMinStagingBytes), tcp::kPieceAlign);
  options_.resend_bytes = std::max(options_.resend_bytes, tcp::kMinResendBytes);
  tcp::Mesh mesh = tcp::connect_mesh(rdv, key_prefix, rank_, size_, options_);
  listen_address_ = mesh.listen_address;
  peers_.reserve(size_);
  for (int q = 0; q < size_; ++q) {
    peers_.push_back(std::make_unique<Peer>(std::move(mesh.data[q]), rank_, q, options_,
                                            std::move(mesh.control[q])));
  }
  activity_ = std::make_unique<tcp::Activity>(rank_);
  poll_set_ = std::make_unique<tcp::PollSet>();
  beat_wake_ = std::make_unique<tcp::Activity>(rank_);
  reconnector_ = std::make_unique<tcp::Reconnector>(std::move(mesh.listener),
                                                    std::move(mesh.directory), options_);
  if (size_ > 1) heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

TcpTransport::~TcpTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  beat_wake_->note();
  if (heartbeat_.joinable()) heartbeat_.join();
  // The listener first: a peer that re-dials a connection this closing leaves broken (a reset
  // when bytes were unread) is refused, so it counts this rank gone at once.
  reconnector_.reset();
}

TcpTransport::Peer& TcpTransport::peer_for(int peer, const char* what) {
  check_peer(peer, what);
  return *peers_[peer];
}

void TcpTransport::mark_dead_locked(int peer) {
  Peer& p = *peers_[peer];
  if (p.dead) return;
  p.dead = true;
  reconnector_->forget(peer);
  activity_->note();
}

// The peer's FIN arrived: dead once the bytes it sent before are consumed (progress() reading
// EOF marks it then; dead_peers() checks again).
void TcpTransport::hung_up_locked(int peer) {
  Peer& p = *peers_[peer];
  p.hung_up = true;
  bool unread;
  {
    std::lock_guard<std::mutex> dlock(p.dmu);
    unread = p.data.has_unread();
  }
  if (!unread) mark_dead_locked(peer);
}

// The peer's process or transport is gone (a refused re-dial, a closed control connection): no
// re-dial; dead once what it sent before is read.
void TcpTransport::gone_locked(int peer) {
  Peer& p = *peers_[peer];
  p.gone = true;
  reconnector_->forget(peer);
  bool broken;
  {
    std::lock_guard<std::mutex> dlock(p.dmu);
    broken = p.data.lost() || p.data.ended();
  }
  // An intact data connection still brings what the peer sent before, then its FIN.
  if (broken) hung_up_locked(peer);
}

// A connection to `peer` failed with `err`: re-dialed (or awaited) by the heartbeat thread,
// unless the peer closed its control connection already (its transport or process is gone).
void TcpTransport::lost_locked(int peer, uint32_t channel, int err) {
  Peer& p = *peers_[peer];
  if (p.dead) return;
  if (p.control.ended() || p.hung_up || p.gone) {
    gone_locked(peer);
    return;
  }
  reconnector_->lost(peer, channel, err, Clock::now());
  beat_wake_->note();
}

// After a data operation: an ended stream marks the peer dead, a lost one is re-dialed.
void TcpTransport::after_data_locked(int peer) {
  Peer& p = *peers_[peer];
  int lost = 0;
  bool ended = false;
  {
    std::lock_guard<std::mutex> dlock(p.dmu);
    lost = p.data.take_loss();
    // EOF, or the stream lost for good: its peer is gone and nothing is left in staging.
    ended = p.data.ended() || (p.hung_up && p.data.lost() && !p.data.has_unread());
  }
  if (ended) mark_dead_locked(peer);
  if (lost != 0) lost_locked(peer, tcp::kDataChannel, lost);
}

// ------------------------------------------------------------------------------------------------
// Data plane

void TcpTransport::set_paced_sends(bool paced) {
  paced = paced && options_.unsent_bytes > 0;
  if (paced == paced_) return;
  paced_ = paced;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    // 0 restores the kernel's limit (net.ipv4.tcp_notsent_lowat).
    std::lock_guard<std::mutex> dlock(peers_[q]->dmu);
    peers_[q]->data.set_unsent_limit(paced ? options_.unsent_bytes : 0);
  }
}

template <class Op>
bool TcpTransport::progress_data(Op& op, const char* what) {
  if (op.done) return false;
  Peer& p = peer_for(op.peer, what);
  bool moved, ended;
  uint64_t ack;
  {
    std::lock_guard<std::mutex> dlock(p.dmu);
    moved = p.data.progress(op);
    ended = p.data.ended();
    ack = p.data.take_ack_due();
  }
  if (ended || ack != 0 || p.data.loss_pending()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ack != 0) {
      p.control.ack(ack);
      flush_control_locked(op.peer);
    }
    after_data_locked(op.peer);
  }
  return moved;
}

bool TcpTransport::progress(SendOp& op) { return progress_data(op, "send"); }

bool TcpTransport::progress(RecvOp& op) { return progress_data(op, "receive"); }

// Drives every resumed stream (preamble, resend); true if anything moved. Either thread.
bool TcpTransport::pump_data_locked() {
  bool moved = false;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || peers_[q]->dead) continue;
    Peer& p = *peers_[q];
    bool changed = false;
    {
      std::lock_guard<std::mutex> dlock(p.dmu);
      if (p.data.pump_events() == 0) continue;
      moved |= p.data.pump();
      changed = p.data.loss_pending() || p.data.ended();
    }
    if (changed) after_data_locked(q);
  }
  return moved;
}

// ------------------------------------------------------------------------------------------------
// Waiting

uint64_t TcpTransport::activity_token() { return activity_->token(); }

void TcpTransport::wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) {
  const auto deadline = Clock::now() + max_wait;
  // Control input alone (a heartbeat) is read and waited past; an abort or a dead peer moves
  // the token, data or socket space on a data connection returns.
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pump_data_locked()) break;  // a resumed stream moved: the ops may go on
    }
    fill_poll_set();
    if (activity_->token() != token) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !poll_set_->wait(left)) break;
    if (handle_poll_results()) break;
  }
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    std::lock_guard<std::mutex> dlock(peers_[q]->dmu);
    peers_[q]->data.clear_wants();  // the next progress() sets them
  }
}

void TcpTransport::wake() { activity_->note(); }

void TcpTransport::fill_poll_set() {
  tcp::PollSet& set = *poll_set_;
  set.clear();
  set.add(activity_->fd(), POLLIN, tcp::PollSet::kWake);
  std::lock_guard<std::mutex> lock(mu_);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    Peer& p = *peers_[q];
    if (!p.dead) {
      std::lock_guard<std::mutex> dlock(p.dmu);
      if (p.data.fd() >= 0) {  // a lost connection waits for its re-dial (the wake fd)
        short ev = p.hung_up ? 0 : POLLRDHUP;  // level-triggered: asked once
        if (p.data.want_read()) ev |= POLLIN;
        if (p.data.want_write()) ev |= POLLOUT;
        ev |= p.data.pump_events();
        set.add(p.data.fd(), ev, tcp::PollSet::kData, q);
      }
    }
    const bool out = p.control.has_output();
    if (p.control.readable() || out) {
      const short ev = (p.control.readable() ? POLLIN : 0) | (out ? POLLOUT : 0);
      set.add(p.control.fd(), ev, tcp::PollSet::kControl, q);
    }
  }
}

bool TcpTransport::handle_poll_results() {
  const tcp::PollSet& set = *poll_set_;
  std::lock_guard<std::mutex> lock(mu_);
  bool relevant = false;
  for (size_t i = 0; i < set.size(); ++i) {
    const short rev = set.revents(i);
    if (rev == 0) continue;
    const int q = set.peer(i);
    switch (set.kind(i)) {
      case tcp::PollSet::kWake:
        activity_->drain();
        relevant = true;
        break;
      case tcp::PollSet::kData: {
        relevant = true;
        Peer& p = *peers_[q];
        bool fin = false;
        {
          std::lock_guard<std::mutex> dlock(p.dmu);
          if (p.data.fd() != set.fd(i)) break;  // replaced meanwhile
          if (rev & (POLLHUP | POLLERR)) {
            p.data.check_socket(set.fd(i));  // a reset (lost) or an orderly end (ended)
          } else if (rev & POLLRDHUP) {
            fin = true;
          }
          if (p.data.pump_events() & rev) p.data.pump();
        }
        if (fin) hung_up_locked(q);
        after_data_locked(q);
        break;
      }
      case tcp::PollSet::kControl:
        if (rev & (POLLIN | POLLHUP | POLLERR)) read_control_locked(q);
        if (rev & POLLOUT) flush_control_locked(q);
        break;
    }
  }
  return relevant;
}

// ------------------------------------------------------------------------------------------------
// Control plane

void TcpTransport::set_abort_reason_locked(std::string reason) {
  if (abort_reason_) return;  // the first reason wins
  abort_reason_ = std::move(reason);
  activity_->note();
}

void TcpTransport::read_control_locked(int peer) {
  Peer& p = *peers_[peer];
  const bool intact = p.control.read(
      [&](std::string reason) { set_abort_reason_locked(std::move(reason)); },
      [&](uint64_t offset) {
        p.data.ack(offset);
        if (p.data.waiting_for_ack()) activity_->note();  // a send waits for room
      });
  if (!intact) {
    set_abort_reason_locked(rank_prefix(rank_) + "corrupt control stream from rank " +
                            std::to_string(peer));
  }
  if (const int err = p.control.take_loss()) lost_locked(peer, tcp::kControlChannel, err);
}

void TcpTransport::flush_control_locked(int peer) {
  Peer& p = *peers_[peer];
  p.control.flush();
  if (const int err = p.control.take_loss()) lost_locked(peer, tcp::kControlChannel, err);
}

// Reads every control connection that has input, without blocking.
void TcpTransport::drain_control_locked() {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || !peers_[q]->control.readable()) continue;
    fds.push_back({peers_[q]->control.fd(), POLLIN, 0});
    who.push_back(q);
  }
  if (fds.empty() || tcp::poll_for(fds, std::chrono::microseconds(0)) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents != 0) read_control_locked(who[i]);
  }
}

// Flushes every peer's control bytes, waiting for socket space up to `budget` in total.
void TcpTransport::flush_control_blocking_locked(std::chrono::milliseconds budget) {
  const auto deadline = Clock::now() + budget;
  while (true) {
    std::vector<pollfd> fds;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      flush_control_locked(q);
      if (peers_[q]->control.has_output()) fds.push_back({peers_[q]->control.fd(), POLLOUT, 0});
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    if (fds.empty() || left.count() <= 0) return;
    tcp::poll_for(fds, left);
  }
}

void TcpTransport::signal_abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  drain_control_locked();  // an abort that already arrived is the first reason
  if (!abort_reason_) abort_reason_ = reason.substr(0, tcp::kMaxAbortBytes);
  if (!abort_sent_) {
    abort_sent_ = true;
    const std::string& why = *abort_reason_;
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) peers_[q]->control.queue(tcp::kAbort, why.data(), why.size());
    }
  }
  flush_control_blocking_locked(kAbortFlushBudget);
  activity_->note();
}

std::optional<std::string> TcpTransport::abort_reason() {
  std::lock_guard<std::mutex> lock(mu_);
  drain_control_locked();
  return abort_reason_;
}

void TcpTransport::poll_data_hangups_locked() {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || peers_[q]->dead) continue;
    if (peers_[q]->hung_up) {
      hung_up_locked(q);  // dead once its last bytes were read
      continue;
    }
    std::lock_guard<std::mutex> dlock(peers_[q]->dmu);
    if (peers_[q]->data.fd() < 0) continue;  // lost: being re-dialed
    fds.push_back({peers_[q]->data.fd(), POLLRDHUP, 0});
    who.push_back(q);
  }
  if (fds.empty() || tcp::poll_for(fds, std::chrono::microseconds(0)) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    const int q = who[i];
    if (fds[i].revents & (POLLHUP | POLLERR)) {
      {
        std::lock_guard<std::mutex> dlock(peers_[q]->dmu);
        peers_[q]->data.check_socket(fds[i].fd);
      }
      after_data_locked(q);
    } else if (fds[i].revents & POLLRDHUP) {
      hung_up_locked(q);
    }
  }
}

std::vector<int> TcpTransport::dead_peers() { return peers_found(/*hung_up_too=*/false); }

std::vector<int> TcpTransport::gone_peers() { return peers_found(/*hung_up_too=*/true); }

std::vector<int> TcpTransport::peers_found(bool hung_up_too) {
  std::lock_guard<std::mutex> lock(mu_);
  drain_control_locked();
  poll_data_hangups_locked();
  std::vector<int> found;
  for (int q = 0; q < size_; ++q) {
    if (q != rank_ && (peers_[q]->dead || (hung_up_too && peers_[q]->hung_up))) {
      found.push_back(q);
    }
  }
  return found;
}

void TcpTransport::publish_progress(const Progress& progress) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool arrived = progress.seq != own_progress_.seq;
  own_progress_ = progress;
  if (arrived) send_beats_locked();  // a new collective: peers learn it at once
}

void TcpTransport::send_beats_locked() {
  const auto now = Clock::now();
  std::vector<tcp::PeerView> views(size_);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    views[q] = tcp::PeerView{peers_[q]->control.last_heard(), peers_[q]->dead, {}};
  }
  tcp::Beat beat;
  beat.progress = own_progress_;
  beat.cannot_hear = tcp::silent_peers(views, rank_, now);
  const std::string payload = tcp::encode_beat(beat);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    Peer& p = *peers_[q];
    p.control.beat(payload);
    p.control.ack(p.data.received_offset());  // acknowledges what trickled in since the last
    flush_control_locked(q);
  }
}

// ------------------------------------------------------------------------------------------------
// The heartbeat thread: beats, control input, re-dials, resumed streams while the executor idles

void TcpTransport::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto next_beat = Clock::now();
  std::vector<pollfd> fds;
  std::vector<int> data_peers;  // fds[1 .. 1 + data_peers.size()): data connections
  std::vector<tcp::ReconnectEvent> events;
  beat_quiet_fd_.assign(size_, -1);
  while (!stopping_) {
    auto now = Clock::now();
    drain_control_locked();
    if (now >= next_beat || beat_now_) {
      beat_now_ = false;
      send_beats_locked();
      next_beat = now + tcp::kBeatEvery;
    }
    if (pump_data_locked()) activity_->note();
    events.clear();
    reconnector_->tick(now, &events);
    apply_reconnects_locked(events);

    fds.clear();
    data_peers.clear();
    fds.push_back({beat_wake_->fd(), POLLIN, 0});
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || peers_[q]->dead) continue;
      Peer& p = *peers_[q];
      std::lock_guard<std::mutex> dlock(p.dmu);
      if (p.data.fd() < 0 || p.data.fd() == beat_quiet_fd_[q]) continue;
      // Errors (POLLERR, always reported) show a reset while the executor idles.
      fds.push_back({p.data.fd(), p.data.pump_events(), 0});
      data_peers.push_back(q);
    }
    const size_t control_first = fds.size();
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const tcp::ControlConnection& c = peers_[q]->control;
      if (c.readable() || c.has_output()) {
        fds.push_back({c.fd(),
                       static_cast<short>((c.readable() ? POLLIN : 0) | (c.has_output() ? POLLOUT : 0)),
                       0});
      } else {
        fds.push_back({-1, 0, 0});  // keeps the index (ppoll ignores negative fds)
      }
    }
    auto wake_at = next_beat;
    reconnector_->add_poll(fds, &wake_at);

    lock.unlock();
    tcp::poll_for(fds, std::chrono::duration_cast<std::chrono::microseconds>(wake_at - now));
    lock.lock();
    if (stopping_) break;
    now = Clock::now();
    if (fds[0].revents) beat_wake_->drain();
    for (size_t k = 0; k < data_peers.size(); ++k) {
      const pollfd& f = fds[1 + k];
      if (f.revents == 0) continue;
      const int q = data_peers[k];
      if (peers_[q]->dead) continue;
      {
        std::lock_guard<std::mutex> dlock(peers_[q]->dmu);
        tcp::DataConnection& d = peers_[q]->data;
        if (d.fd() != f.fd) continue;
        if (f.revents & (POLLERR | POLLHUP)) d.check_socket(f.fd);
        if (d.pump_events() & f.revents) d.pump();
        // A hang-up that is neither a reset nor an end (bytes still unread) is the executor's
        // to see; polling it again would spin.
        if ((f.revents & POLLHUP) && d.fd() == f.fd) beat_quiet_fd_[q] = f.fd;
      }
      after_data_locked(q);
    }
    size_t k = control_first;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const pollfd& f = fds[k++];
      if (f.fd < 0 || f.revents == 0 || peers_[q]->control.fd() != f.fd) continue;
      if (f.revents & (POLLIN | POLLHUP | POLLERR)) read_control_locked(q);
      if (f.revents & POLLOUT) flush_control_locked(q);
    }
    events.clear();
    reconnector_->handle(fds, now, &events);
    apply_reconnects_locked(events);
    redial_attempts_ = reconnector_->attempts();
  }
}

void TcpTransport::apply_reconnects_locked(std::vector<tcp::ReconnectEvent>& events) {
  for (auto& e : events) {
    Peer& p = *peers_[e.peer];
    if (e.kind == tcp::ReconnectEvent::kGone) {
      // Not logged: the executor reports a dead peer that matters, and peers exiting at the
      // end of a job are no news (this thread may outlive main() there, and the log sink).
      gone_locked(e.peer);
      continue;
    }
    if (p.dead) continue;
    reconnects_++;
    if (e.channel == tcp::kDataChannel) {
      {
        std::lock_guard<std::mutex> dlock(p.dmu);
        p.data.resume(std::move(e.fd));
        p.data.pump();
      }
      after_data_locked(e.peer);
    } else {
      p.control = tcp::ControlConnection(std::move(e.fd));
      if (abort_sent_ && abort_reason_) {
        p.control.queue(tcp::kAbort, abort_reason_->data(), abort_reason_->size());
      }
      beat_now_ = true;  // the peer hears from this rank at once, acks included
    }
    const std::string what = std::string("the ") + channel_name(e.channel) +
                             " connection with rank " + std::to_string(e.peer);
    log_warning(rank_prefix(rank_) + "tcp: " + what +
                (e.noticed ? " broke (" + transport::errno_text(e.err) + ") and was re-dialed after " +
                                 seconds_text(e.stalled)
                           : " was re-dialed by rank " + std::to_string(e.peer) +
                                 " after it broke") +
                "; the stream resumes where it stopped");
    activity_->note();
  }
  events.clear();
}

TransportStats TcpTransport::stats() const {
  TransportStats s;
  s["tcp_staging_bytes"] = static_cast<int64_t>(options_.staging_bytes);
  s["tcp_resend_buffer_bytes"] = static_cast<int64_t>(options_.resend_bytes);
  s["tcp_reconnects"] = reconnects_.load();
  int64_t resent = 0;
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) resent += static_cast<int64_t>(peers_[q]->data.resent_bytes());
  }
  s["tcp_resent_bytes"] = resent;
  s["tcp_redial_attempts"] = redial_attempts_.load();
  add_peer_transport_stats(rank_, size_, [](int) { return false; }, s);
  return s;
}

void TcpTransport::reset_connections(int peer, bool data, bool control) {
  check_peer(peer, "reset");
  auto reset = [](int fd) {
    if (fd < 0) return;
    sockaddr unspec{};
    unspec.sa_family = AF_UNSPEC;
    ::connect(fd, &unspec, sizeof unspec);  // tcp_disconnect: RST to the peer, ECONNRESET here
  };
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = *peers_[peer];
  if (control) reset(p.control.fd());
  if (data) {
    std::lock_guard<std::mutex> dlock(p.dmu);
    reset(p.data.fd());
  }
  activity_->note();
  beat_wake_->note();
}

PeerStatus TcpTransport::peer_status(int peer) {
  PeerStatus s;
  if (peer < 0 || peer >= size_) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (peer == rank_) {
    s.progress = own_progress_;
    return s;
  }
  drain_control_locked();
  const auto now = Clock::now();
  std::vector<tcp::PeerView> views(size_);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const tcp::Beat& b = peers_[q]->control.peer_beat();
    views[q] = tcp::PeerView{peers_[q]->control.last_heard(), peers_[q]->dead, b.cannot_hear};
  }
  s.progress = peers_[peer]->control.peer_beat().progress;
  s.cannot_hear = peers_[peer]->control.peer_beat().cannot_hear;
  s.liveness = tcp::judge_peer(views, rank_, peer, now, &s.evidence);
  return s;
}

}  // namespace stragg
