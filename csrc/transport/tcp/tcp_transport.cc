#include "transport/tcp/tcp_transport.h"

#include <algorithm>

#include "common/error.h"
#include "transport/common.h"
#include "transport/mixed/peer_stats.h"
#include "transport/tcp/control.h"
#include "transport/tcp/data_connection.h"
#include "transport/tcp/heartbeat.h"
#include "transport/tcp/mesh.h"
#include "transport/tcp/wait.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;
using transport::rank_prefix;

constexpr auto kAbortFlushBudget = std::chrono::milliseconds(1000);

}  // namespace

struct TcpTransport::Peer {
  tcp::DataConnection data;        // only the thread that calls progress() / wait_for_activity()
  tcp::ControlConnection control;  // guarded by mu_
  bool dead = false;               // guarded by mu_
  bool hung_up = false;            // its FIN arrived (bytes before it may be unread); mu_
};

// ------------------------------------------------------------------------------------------------
// Construction

TcpTransport::TcpTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                           const TcpOptions& options)
    : GroupTransport("tcp", rank, size), options_(options) {
  options_.staging_bytes = transport::round_up(
      std::max(options_.staging_bytes, tcp::kMinStagingBytes), tcp::kPieceAlign);
  tcp::Mesh mesh = tcp::connect_mesh(rdv, key_prefix, rank_, size_, options_);
  listen_address_ = mesh.listen_address;
  peers_.reserve(size_);
  for (int q = 0; q < size_; ++q) {
    peers_.push_back(
        Peer{tcp::DataConnection(std::move(mesh.data[q]), rank_, q, options_.staging_bytes),
             tcp::ControlConnection(std::move(mesh.control[q]))});
  }
  activity_ = std::make_unique<tcp::Activity>(rank_);
  poll_set_ = std::make_unique<tcp::PollSet>();
  if (size_ > 1) heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

TcpTransport::~TcpTransport() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  beat_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

TcpTransport::Peer& TcpTransport::peer_for(int peer, const char* what) {
  check_peer(peer, what);
  return peers_[peer];
}

void TcpTransport::mark_dead_locked(int peer) {
  Peer& p = peers_[peer];
  if (p.dead) return;
  p.dead = true;
  activity_->note();
}

void TcpTransport::mark_dead(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  mark_dead_locked(peer);
}

// The peer's FIN arrived: dead once the bytes it sent before are consumed (progress() reading
// EOF marks it then; dead_peers() checks again).
void TcpTransport::hung_up_locked(int peer) {
  Peer& p = peers_[peer];
  p.hung_up = true;
  if (!p.data.has_unread()) mark_dead_locked(peer);
}

// ------------------------------------------------------------------------------------------------
// Data plane

void TcpTransport::set_paced_sends(bool paced) {
  paced = paced && options_.unsent_bytes > 0;
  if (paced == paced_) return;
  paced_ = paced;
  for (int q = 0; q < size_; ++q) {
    // 0 restores the kernel's limit (net.ipv4.tcp_notsent_lowat).
    if (q != rank_) tcp::set_unsent_limit(peers_[q].data.fd(), paced ? options_.unsent_bytes : 0);
  }
}

bool TcpTransport::progress(SendOp& op) {
  if (op.done) return false;
  return after_data_progress(op.peer, peer_for(op.peer, "send").data.progress(op));
}

bool TcpTransport::progress(RecvOp& op) {
  if (op.done) return false;
  return after_data_progress(op.peer, peer_for(op.peer, "receive").data.progress(op));
}

// A data connection found ended by progress() means a dead peer.
bool TcpTransport::after_data_progress(int peer, bool moved) {
  if (peers_[peer].data.ended()) mark_dead(peer);
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
    fill_poll_set();
    if (activity_->token() != token) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !poll_set_->wait(left)) break;
    if (handle_poll_results()) break;
  }
  for (Peer& p : peers_) p.data.clear_wants();  // the next progress() sets them
}

void TcpTransport::wake() { activity_->note(); }

void TcpTransport::fill_poll_set() {
  tcp::PollSet& set = *poll_set_;
  set.clear();
  set.add(activity_->fd(), POLLIN, tcp::PollSet::kWake);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      Peer& p = peers_[q];
      if (!p.dead) {
        short ev = p.hung_up ? 0 : POLLRDHUP;  // level-triggered: asked once
        if (p.data.want_read()) ev |= POLLIN;
        if (p.data.want_write()) ev |= POLLOUT;
        set.add(p.data.fd(), ev, tcp::PollSet::kData, q);
      }
      const bool out = p.control.has_output();
      if (p.control.readable() || out) {
        const short ev = (p.control.readable() ? POLLIN : 0) | (out ? POLLOUT : 0);
        set.add(p.control.fd(), ev, tcp::PollSet::kControl, q);
      }
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
      case tcp::PollSet::kData:
        relevant = true;
        if (rev & (POLLHUP | POLLERR)) {
          mark_dead_locked(q);
        } else if (rev & POLLRDHUP) {
          hung_up_locked(q);
        }
        break;
      case tcp::PollSet::kControl:
        if (rev & (POLLIN | POLLHUP | POLLERR)) read_control_locked(q);
        if (rev & POLLOUT) peers_[q].control.flush();
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
  const bool intact = peers_[peer].control.read(
      [&](std::string reason) { set_abort_reason_locked(std::move(reason)); });
  if (!intact) {
    set_abort_reason_locked(rank_prefix(rank_) + "corrupt control stream from rank " +
                            std::to_string(peer));
  }
}

// Reads every control connection that has input, without blocking.
void TcpTransport::drain_control_locked() {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || !peers_[q].control.readable()) continue;
    fds.push_back({peers_[q].control.fd(), POLLIN, 0});
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
      if (q == rank_ || peers_[q].control.flush()) continue;
      fds.push_back({peers_[q].control.fd(), POLLOUT, 0});
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
      if (q != rank_) peers_[q].control.queue(tcp::kAbort, why.data(), why.size());
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
    if (q == rank_ || peers_[q].dead) continue;
    if (peers_[q].hung_up) {
      hung_up_locked(q);  // dead once its last bytes were read
      continue;
    }
    fds.push_back({peers_[q].data.fd(), POLLRDHUP, 0});
    who.push_back(q);
  }
  if (fds.empty() || tcp::poll_for(fds, std::chrono::microseconds(0)) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents & (POLLHUP | POLLERR)) {
      mark_dead_locked(who[i]);
    } else if (fds[i].revents & POLLRDHUP) {
      hung_up_locked(who[i]);
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
    if (q != rank_ && (peers_[q].dead || (hung_up_too && peers_[q].hung_up))) found.push_back(q);
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
    views[q] = tcp::PeerView{peers_[q].control.last_heard(), peers_[q].dead, {}};
  }
  tcp::Beat beat;
  beat.progress = own_progress_;
  beat.cannot_hear = tcp::silent_peers(views, rank_, now);
  const std::string payload = tcp::encode_beat(beat);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    peers_[q].control.beat(payload);
    peers_[q].control.flush();
  }
}

void TcpTransport::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    drain_control_locked();
    send_beats_locked();
    beat_cv_.wait_for(lock, tcp::kBeatEvery, [&] { return stopping_; });
  }
}

TransportStats TcpTransport::stats() const {
  TransportStats s;
  s["tcp_staging_bytes"] = static_cast<int64_t>(options_.staging_bytes);
  add_peer_transport_stats(rank_, size_, [](int) { return false; }, s);
  return s;
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
    const tcp::Beat& b = peers_[q].control.peer_beat();
    views[q] = tcp::PeerView{peers_[q].control.last_heard(), peers_[q].dead, b.cannot_hear};
  }
  s.progress = peers_[peer].control.peer_beat().progress;
  s.cannot_hear = peers_[peer].control.peer_beat().cannot_hear;
  s.liveness = tcp::judge_peer(views, rank_, peer, now, &s.evidence);
  return s;
}

}  // namespace stragg
