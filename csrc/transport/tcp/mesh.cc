#include "transport/tcp/mesh.h"

#include <algorithm>
#include <exception>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "common/rendezvous.h"
#include "transport/common.h"
#include "transport/tcp/address.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/listener.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg::tcp {
namespace {

class MeshSetup {
 public:
  MeshSetup(int rank, int size, const TcpOptions& options) : options_(options) {
    dir_.rank = rank;
    dir_.size = size;
    mesh_.data.resize(size);
    mesh_.control.resize(size);
    established_.assign(size, std::vector<bool>(kNumChannels, false));
  }

  Mesh run(Rendezvous& rdv, const std::string& key_prefix) {
    listen();
    exchange(rdv, key_prefix);
    deadline_ = Clock::now() + options_.setup_timeout;
    start_outgoing();
    while (!done()) {
      if (Clock::now() >= deadline_) timeout_error();
      poll_once();
    }
    // The strays still pending are closed; the listener stays open for re-dials (the transport
    // drops strays that connect later).
    pending_.clear();
    mesh_.listener = std::make_unique<Listener>(std::move(*listener_));
    listener_.reset();
    mesh_.directory = dir_;
    return std::move(mesh_);
  }

 private:
  void listen();
  void exchange(Rendezvous& rdv, const std::string& key_prefix);
  void start_outgoing();
  int missing_incoming() const;
  bool done() const;
  void poll_once();
  void accept_all();
  void on_events(Handshake& h, short revents);
  bool judge(Handshake& h);
  std::string duplicate(const Hello& h) const;
  void install(Handshake& h);
  [[noreturn]] void timeout_error() const;

  const TcpOptions& options_;
  Directory dir_;
  std::optional<Listener> listener_;
  std::vector<Handshake> pending_;
  std::vector<std::vector<bool>> established_;  // [peer][channel]
  std::string last_rejection_;
  Clock::time_point deadline_;
  Mesh mesh_;
};

void MeshSetup::listen() {
  listener_.emplace(options_, dir_.context());
  mesh_.listen_address = host_port(options_.advertise_host, listener_->port());
  dir_.nonce = random_nonce();
}

void MeshSetup::exchange(Rendezvous& rdv, const std::string& key_prefix) {
  const PeerRecord mine{options_.advertise_host, listener_->port(), dir_.nonce};
  const auto values =
      exchange_all(rdv, key_prefix + "/tcp", dir_.rank, dir_.size, format_record(mine),
                   options_.setup_timeout, "tcp transport setup");
  dir_.records.resize(dir_.size);
  for (int p = 0; p < dir_.size; ++p) {
    try {
      dir_.records[p] = parse_record(values[p]);
    } catch (const std::exception&) {
      throw Error(dir_.context() + ": bad address record from rank " + std::to_string(p) + ": '" +
                  values[p] + "' (do all ranks run the same stragg version?)");
    }
  }
}

void MeshSetup::start_outgoing() {
  for (int p = 0; p < dir_.rank; ++p) {
    for (uint32_t ch = 0; ch < kNumChannels; ++ch) pending_.emplace_back(dir_, options_, p, ch);
  }
}

int MeshSetup::missing_incoming() const {
  int n = 0;
  for (int p = dir_.rank + 1; p < dir_.size; ++p) {
    for (uint32_t ch = 0; ch < kNumChannels; ++ch) n += established_[p][ch] ? 0 : 1;
  }
  return n;
}

// Done when every outgoing handshake finished and every higher rank connected; stray incoming
// connections still pending do not hold setup up (they are closed).
bool MeshSetup::done() const {
  for (const Handshake& h : pending_) {
    if (h.outgoing()) return false;
  }
  return missing_incoming() == 0;
}

// One round of ppoll over the listener and all pending connections.
void MeshSetup::poll_once() {
  std::vector<pollfd> fds;
  std::vector<int> index;  // pending_ index per entry; -1: the listener (first, see below)
  const auto now = Clock::now();
  auto wake_at = deadline_;
  if (missing_incoming() > 0) {
    fds.push_back({listener_->fd(), POLLIN, 0});
    index.push_back(-1);
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    Handshake& h = pending_[i];
    h.reconnect_if_due(now);
    if (!h.has_fd()) {  // outgoing, waiting to retry after a refusal
      wake_at = std::min(wake_at, h.retry_at());
      continue;
    }
    fds.push_back({h.fd(), h.poll_events(), 0});
    index.push_back(static_cast<int>(i));
  }
  if (poll_for(fds, std::chrono::duration_cast<std::chrono::microseconds>(wake_at - now)) <= 0) {
    return;
  }
  for (size_t k = 0; k < fds.size(); ++k) {
    if (fds[k].revents == 0) continue;
    if (index[k] < 0) {
      accept_all();  // appends to pending_ before any reference into it is taken
    } else {
      on_events(pending_[index[k]], fds[k].revents);
    }
  }
  // A prepared reply is sent on the next round (POLLOUT); drop installed or rejected entries.
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const Handshake& h) { return h.retired; }),
                 pending_.end());
}

void MeshSetup::accept_all() {
  while (auto accepted = listener_->accept(dir_.context())) {
    pending_.emplace_back(dir_, options_, std::move(accepted->fd), std::move(accepted->remote));
  }
}

void MeshSetup::on_events(Handshake& h, short revents) {
  bool keep = true;
  if (revents & (POLLOUT | POLLERR | POLLHUP)) h.on_writable();
  if (h.has_fd() && !h.connecting() && (revents & (POLLIN | POLLERR | POLLHUP))) {
    if (h.on_readable()) {
      keep = judge(h);
    } else {
      last_rejection_ = "connection from " + h.remote() + " closed during the handshake";
      keep = false;
    }
  }
  if (!h.outgoing() && (!keep || !h.has_fd())) h.retired = true;  // dropped
  if (h.has_fd() && h.complete()) install(h);  // on_writable sent the reply prepared earlier
}

// Incoming connections: accepts a complete hello or drops the connection. False if dropped.
bool MeshSetup::judge(Handshake& h) {
  if (h.outgoing() || !h.awaiting_verdict()) return true;
  std::string bad = dir_.check_hello(h.received());
  if (bad.empty() && (h.received().flags & kHelloResume)) bad = "a re-dial before setup finished";
  if (bad.empty()) bad = duplicate(h.received());
  if (!bad.empty()) {
    last_rejection_ = "rejected a connection from " + h.remote() + ": " + bad;
    return false;
  }
  h.accept_hello();
  return true;
}

std::string MeshSetup::duplicate(const Hello& hello) const {
  if (established_[hello.from][hello.channel]) return "duplicate connection";
  for (const Handshake& h : pending_) {
    if (!h.outgoing() && h.peer() == hello.from && h.channel() == hello.channel) {
      return "duplicate connection";
    }
  }
  return "";
}

void MeshSetup::install(Handshake& h) {
  (h.channel() == kDataChannel ? mesh_.data : mesh_.control)[h.peer()] = h.take_fd();
  established_[h.peer()][h.channel()] = true;
  h.retired = true;
}

void MeshSetup::timeout_error() const {
  std::vector<int> silent, unanswered;
  for (int p = dir_.rank + 1; p < dir_.size; ++p) {
    if (!established_[p][kDataChannel] || !established_[p][kControlChannel]) silent.push_back(p);
  }
  for (const Handshake& h : pending_) {
    if (h.outgoing() && (unanswered.empty() || unanswered.back() != h.peer())) {
      unanswered.push_back(h.peer());
    }
  }
  std::ostringstream m;
  m << dir_.context() << " timed out after "
    << std::chrono::duration_cast<std::chrono::milliseconds>(options_.setup_timeout).count() /
           1000.0
    << " s";
  if (!silent.empty()) m << ": " << transport::join_ranks(silent) << " did not connect";
  for (int p : unanswered) m << "; no handshake with " << dir_.peer_address(p);
  if (!last_rejection_.empty()) m << " (last problem: " << last_rejection_ << ")";
  throw TimeoutError(m.str());
}

}  // namespace

Mesh connect_mesh(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                  const TcpOptions& options) {
  return MeshSetup(rank, size, options).run(rdv, key_prefix);
}

}  // namespace stragg::tcp
