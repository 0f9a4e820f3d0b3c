#include "transport/tcp/resume.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "common/error.h"
#include "transport/common.h"
#include "transport/tcp/address.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg::tcp {

Reconnector::Reconnector(std::unique_ptr<Listener> listener, Directory directory,
                         const TcpOptions& options)
    : listener_(std::move(listener)),
      dir_(std::move(directory)),
      options_(options),
      links_(dir_.size),
      forgotten_(dir_.size, false) {
  for (auto& per_peer : links_) per_peer.resize(kNumChannels);
}

void Reconnector::lost(int peer, uint32_t channel, int err, Clock::time_point now) {
  if (peer < 0 || peer >= dir_.size || peer == dir_.rank || forgotten_[peer]) return;
  Link& link = links_[peer][channel];
  if (link.lost) return;
  link = Link{};
  link.lost = true;
  link.lost_at = now;
  link.err = err;
  link.next_try = now;  // the first attempt at once
}

void Reconnector::forget(int peer) {
  if (peer < 0 || peer >= dir_.size) return;
  forgotten_[peer] = true;
  for (Link& link : links_[peer]) link = Link{};
}

void Reconnector::retry_later(Link& link, Clock::time_point now) {
  link.dial.reset();
  link.probe.reset();
  link.tries++;
  Clock::duration backoff = kFirstRetry * (1 << std::min(link.tries - 1, 16));
  backoff = std::min<Clock::duration>(backoff, options_.redial_backoff_max);
  link.next_try = now + backoff;
}

void Reconnector::gone(int peer, std::string why, std::vector<Event>* out) {
  Event e;
  e.kind = Event::kGone;
  e.peer = peer;
  e.why = std::move(why);
  out->push_back(std::move(e));
  forget(peer);
}

void Reconnector::connected(int peer, uint32_t channel, Fd fd, Clock::time_point now,
                            std::vector<Event>* out) {
  Link& link = links_[peer][channel];
  Event e;
  e.kind = Event::kConnected;
  e.peer = peer;
  e.channel = channel;
  e.fd = std::move(fd);
  e.noticed = link.lost;
  e.stalled = link.lost ? now - link.lost_at : Clock::duration{};
  e.err = link.err;
  out->push_back(std::move(e));
  link = Link{};
}

void Reconnector::start_probe(int peer, uint32_t channel, Clock::time_point now,
                              std::vector<Event>* out) {
  Link& link = links_[peer][channel];
  const PeerRecord& r = dir_.records[peer];
  attempts_++;
  int err = 0;
  try {
    const SocketAddress addr = resolve(r.host, r.port, SOCK_STREAM, false, dir_.context());
    link.probe = make_stream_socket(addr.family(), 0, 0, dir_.context());
    if (::connect(link.probe.get(), addr.get(), addr.len) != 0) err = errno;
  } catch (const Error&) {
    retry_later(link, now);
    return;
  }
  if (err == EINPROGRESS || err == EINTR) {
    link.deadline = now + attempt_timeout(link);
    return;
  }
  if (err == ECONNREFUSED) {
    gone(peer, dir_.peer_address(peer) + " refused a connection after its connection broke",
         out);
    return;
  }
  retry_later(link, now);  // connected at once (it listens: alive) or failed otherwise
}

void Reconnector::tick(Clock::time_point now, std::vector<Event>* out) {
  for (int peer = 0; peer < dir_.size; ++peer) {
    for (uint32_t ch = 0; ch < kNumChannels; ++ch) {
      if (forgotten_[peer]) break;
      Link& link = links_[peer][ch];
      if (!link.lost) continue;
      const bool dialer = dir_.rank > peer;
      const bool busy = dialer ? link.dial.has_value() : link.probe.valid();
      if (busy) {
        if (now >= link.deadline) retry_later(link, now);  // no answer: try again later
        continue;
      }
      if (now < link.next_try) continue;
      if (!dialer) {
        start_probe(peer, ch, now, out);
        continue;
      }
      attempts_++;
      try {
        link.dial.emplace(dir_, options_, peer, ch, /*resume=*/true);
      } catch (const Error&) {  // no socket (out of descriptors, ...): later
        retry_later(link, now);
        continue;
      }
      link.deadline = now + attempt_timeout(link);
      if (link.dial->failed()) fail_dial(peer, ch, now, out);
    }
  }
  // Incoming connections that never finish their hello.
  incoming_.erase(std::remove_if(incoming_.begin(), incoming_.end(),
                                 [&](const std::unique_ptr<Incoming>& in) {
                                   return in->hs.retired || now >= in->deadline;
                                 }),
                  incoming_.end());
}

void Reconnector::add_poll(std::vector<pollfd>& fds, Clock::time_point* wake_at) {
  entries_.clear();
  first_entry_ = fds.size();
  auto add = [&](int fd, short events, EntryKind kind, int peer, uint32_t ch) {
    fds.push_back({fd, events, 0});
    entries_.push_back({kind, peer, ch, fd});
  };
  // Full: strays hold every slot until their deadline (polling the listener would spin).
  if (listener_ && incoming_.size() < kMaxIncoming) add(listener_->fd(), POLLIN, kListen, -1, 0);
  for (int peer = 0; peer < dir_.size; ++peer) {
    for (uint32_t ch = 0; ch < kNumChannels; ++ch) {
      Link& link = links_[peer][ch];
      if (!link.lost) continue;
      if (link.dial && link.dial->has_fd()) {
        add(link.dial->fd(), link.dial->poll_events(), kDial, peer, ch);
        *wake_at = std::min(*wake_at, link.deadline);
      } else if (link.probe.valid()) {
        add(link.probe.get(), POLLOUT, kProbe, peer, ch);
        *wake_at = std::min(*wake_at, link.deadline);
      } else {
        *wake_at = std::min(*wake_at, link.next_try);
      }
    }
  }
  for (size_t i = 0; i < incoming_.size(); ++i) {
    Handshake& hs = incoming_[i]->hs;
    if (hs.has_fd() && !hs.retired) {
      add(hs.fd(), hs.poll_events(), kIncoming, static_cast<int>(i), 0);
      *wake_at = std::min(*wake_at, incoming_[i]->deadline);
    }
  }
}

void Reconnector::on_dial(int peer, uint32_t channel, short revents, Clock::time_point now,
                          std::vector<Event>* out) {
  Link& link = links_[peer][channel];
  Handshake& hs = *link.dial;
  try {
    if (revents & (POLLOUT | POLLERR | POLLHUP)) hs.on_writable();
    if (hs.has_fd() && !hs.connecting() && (revents & (POLLIN | POLLERR | POLLHUP))) {
      hs.on_readable();
    }
  } catch (const Error&) {
    fail_dial(peer, channel, now, out);  // closed during the hellos, or a wrong identity
    return;
  }
  if (hs.failed()) {
    fail_dial(peer, channel, now, out);
    return;
  }
  if (hs.has_fd() && hs.complete()) connected(peer, channel, hs.take_fd(), now, out);
}

void Reconnector::fail_dial(int peer, uint32_t channel, Clock::time_point now,
                            std::vector<Event>* out) {
  Link& link = links_[peer][channel];
  if (link.dial->refused()) {
    gone(peer, dir_.peer_address(peer) + " refused the re-dial of its broken connection", out);
  } else if (link.dial->wrong_identity()) {
    gone(peer, dir_.peer_address(peer) + " answered the re-dial with another identity", out);
  } else {
    retry_later(link, now);  // a timeout, an unreachable network, a rejected hello
  }
}

Clock::duration Reconnector::attempt_timeout(const Link& link) const {
  return kAttemptTimeout * (1 + std::min(link.tries, 3));
}

void Reconnector::on_probe(int peer, uint32_t channel, Clock::time_point now,
                           std::vector<Event>* out) {
  Link& link = links_[peer][channel];
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(link.probe.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err == ECONNREFUSED) {
    gone(peer, dir_.peer_address(peer) + " refused a connection after its connection broke",
         out);
    return;
  }
  retry_later(link, now);  // connected (it listens: alive) or failed otherwise: wait, probe again
}

void Reconnector::on_incoming(Incoming& in, short revents, Clock::time_point now,
                              std::vector<Event>* out) {
  Handshake& hs = in.hs;
  if (revents & (POLLOUT | POLLERR | POLLHUP)) hs.on_writable();
  if (hs.has_fd() && (revents & (POLLIN | POLLERR | POLLHUP))) {
    if (!hs.on_readable()) {
      hs.retired = true;  // closed before its hello
      return;
    }
    if (hs.awaiting_verdict()) {
      const Hello& h = hs.received();
      const bool ok = dir_.check_hello(h).empty() && (h.flags & kHelloResume) &&
                      !forgotten_[h.from];
      if (!ok) {
        hs.retired = true;  // a stray, or a rank this one counts as dead
        return;
      }
      hs.accept_hello();
      hs.on_writable();  // the reply, at once if the socket takes it
    }
  }
  if (!hs.has_fd()) {
    hs.retired = true;
    return;
  }
  if (hs.complete()) {
    hs.retired = true;
    connected(hs.peer(), hs.channel(), hs.take_fd(), now, out);
  }
}

void Reconnector::handle(const std::vector<pollfd>& fds, Clock::time_point now,
                         std::vector<Event>* out) {
  for (size_t k = 0; k < entries_.size(); ++k) {
    const short rev = fds[first_entry_ + k].revents;
    if (rev == 0) continue;
    const Entry& e = entries_[k];
    switch (e.kind) {
      case kListen:
        while (incoming_.size() < kMaxIncoming) {
          std::optional<Listener::Accepted> accepted;
          try {
            accepted = listener_->accept(dir_.context());
          } catch (const Error&) {  // out of descriptors, ...: the next poll tries again
            break;
          }
          if (!accepted) break;
          incoming_.push_back(std::make_unique<Incoming>(Incoming{
              Handshake(dir_, options_, std::move(accepted->fd), std::move(accepted->remote)),
              now + kIncomingTimeout}));
        }
        break;
      case kDial: {
        Link& link = links_[e.peer][e.channel];
        if (link.lost && link.dial && link.dial->has_fd() && link.dial->fd() == e.fd) {
          on_dial(e.peer, e.channel, rev, now, out);
        }
        break;
      }
      case kProbe: {
        Link& link = links_[e.peer][e.channel];
        if (link.lost && link.probe.valid() && link.probe.get() == e.fd) {
          on_probe(e.peer, e.channel, now, out);
        }
        break;
      }
      case kIncoming:
        if (static_cast<size_t>(e.peer) < incoming_.size()) {
          Incoming& in = *incoming_[e.peer];
          if (in.hs.has_fd() && in.hs.fd() == e.fd && !in.hs.retired) {
            on_incoming(in, rev, now, out);
          }
        }
        break;
    }
  }
  entries_.clear();
}

}  // namespace stragg::tcp
