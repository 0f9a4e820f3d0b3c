#include "transport/tcp/handshake.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <stdexcept>

#include "common/error.h"
#include "transport/common.h"
#include "transport/tcp/address.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg::tcp {
namespace {

constexpr uint64_t kHelloMagic = 0x5354524147475443ull;  // "STRAGGTC"
constexpr uint32_t kProtocolVersion = 2;  // 2: resumable data streams, ACK frames, re-dials
constexpr int kMaxConnectAttempts = 20;
constexpr auto kConnectRetryDelay = std::chrono::milliseconds(50);

}  // namespace

std::string format_record(const PeerRecord& r) {
  return r.host + "|" + std::to_string(r.port) + "|" + std::to_string(r.nonce);
}

PeerRecord parse_record(const std::string& value) {
  const auto f = transport::split(value, '|');
  if (f.size() != 3) throw std::invalid_argument("field count");
  PeerRecord r;
  r.host = f[0];
  const unsigned long port = std::stoul(f[1]);
  if (port == 0 || port > 65535) throw std::invalid_argument("port");
  r.port = static_cast<uint16_t>(port);
  r.nonce = std::stoull(f[2]);
  return r;
}

uint64_t random_nonce() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const uint64_t t = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return r ^ (t * 0x9e3779b97f4a7c15ull) ^ static_cast<uint64_t>(getpid());
}

// ------------------------------------------------------------------------------------------------
// Directory

std::string Directory::context() const {
  return transport::rank_prefix(rank) + "tcp transport setup";
}

std::string Directory::peer_address(int peer) const {
  return "rank " + std::to_string(peer) + " at " +
         host_port(records[peer].host, records[peer].port);
}

Hello Directory::hello_to(int peer, uint32_t channel, uint32_t flags) const {
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kProtocolVersion;
  h.channel = channel;
  h.flags = flags;
  h.from = rank;
  h.to = peer;
  h.size = size;
  h.from_nonce = nonce;
  h.to_nonce = records[peer].nonce;
  return h;
}

std::string Directory::check_hello(const Hello& h) const {
  if (h.magic != kHelloMagic) return "not a stragg connection";
  if (h.version != kProtocolVersion) return "protocol version " + std::to_string(h.version);
  if (h.size != size || h.to != rank || h.to_nonce != nonce) {
    return "meant for another group or rank";
  }
  if (h.from <= rank || h.from >= size || h.channel >= kNumChannels) {
    return "invalid rank or channel";
  }
  if ((h.flags & ~kHelloResume) != 0) return "unknown flags " + std::to_string(h.flags);
  if (h.from_nonce != records[h.from].nonce) {
    return "claims to be rank " + std::to_string(h.from) + " but does not match its record";
  }
  return "";
}

bool Directory::reply_matches(const Hello& h, int peer, uint32_t channel, uint32_t flags) const {
  return h.magic == kHelloMagic && h.version == kProtocolVersion && h.channel == channel &&
         h.flags == flags &&
         h.from == peer && h.to == rank && h.size == size && h.from_nonce == records[peer].nonce &&
         h.to_nonce == nonce;
}

// ------------------------------------------------------------------------------------------------
// Handshake

Handshake::Handshake(const Directory& dir, const TcpOptions& options, int peer, uint32_t channel,
                     bool resume)
    : dir_(&dir),
      options_(&options),
      outgoing_(true),
      resume_(resume),
      peer_(peer),
      channel_(channel) {
  out_ = dir.hello_to(peer, channel, resume ? kHelloResume : 0);
  out_ready_ = true;
  start_connect();
}

Handshake::Handshake(const Directory& dir, const TcpOptions& options, Fd fd, std::string remote)
    : dir_(&dir), options_(&options), fd_(std::move(fd)), remote_(std::move(remote)) {}

void Handshake::start_connect() {
  const PeerRecord& r = dir_->records[peer_];
  const std::string context = dir_->context();
  const SocketAddress addr = resolve(r.host, r.port, SOCK_STREAM, false, context);
  fd_ = make_stream_socket(addr.family(), options_->socket_send_buffer,
                           options_->socket_recv_buffer, context);
  attempts_++;
  connecting_ = true;
  out_sent_ = 0;
  in_got_ = 0;
  if (::connect(fd_.get(), addr.get(), addr.len) == 0) return;  // checked on POLLOUT
  if (errno == EINPROGRESS || errno == EINTR) return;
  connect_failed(errno);
}

void Handshake::connect_failed(int err) {
  fd_.reset();
  connecting_ = false;
  refused_ = err == ECONNREFUSED;
  if (resume_) {  // the caller decides (resume.h): never retried here, never thrown
    failed_ = true;
    return;
  }
  const bool retry = !resume_ &&
                     (err == ECONNREFUSED || err == ETIMEDOUT || err == EAGAIN) &&
                     attempts_ < kMaxConnectAttempts;
  if (retry) {
    retry_at_ = Clock::now() + kConnectRetryDelay;
    return;
  }
  throw Error(dir_->context() + ": cannot connect to " + dir_->peer_address(peer_) + ": " +
              transport::errno_text(err));
}

void Handshake::reconnect_if_due(Clock::time_point now) {
  if (outgoing_ && !fd_.valid() && now >= retry_at_) start_connect();
}

short Handshake::poll_events() const {
  short events = 0;
  if (connecting_ || (out_ready_ && out_sent_ < sizeof(Hello))) events |= POLLOUT;
  if (!connecting_ && in_got_ < sizeof(Hello)) events |= POLLIN;
  return events;
}

void Handshake::on_writable() {
  if (connecting_) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      connect_failed(err);
      return;
    }
    connecting_ = false;
  }
  const auto* src = reinterpret_cast<const uint8_t*>(&out_);
  while (out_ready_ && out_sent_ < sizeof(Hello)) {
    const Transfer t = send_some(fd_.get(), src + out_sent_, sizeof(Hello) - out_sent_);
    if (t.moved()) {
      out_sent_ += t.bytes;
    } else if (t.would_block) {
      return;
    } else if (outgoing_) {
      connect_failed(t.err);
      return;
    } else {
      fd_.reset();  // the mesh drops it
      return;
    }
  }
}

bool Handshake::on_readable() {
  auto* dst = reinterpret_cast<uint8_t*>(&in_);
  while (in_got_ < sizeof(Hello)) {
    const Transfer t = receive_some(fd_.get(), dst + in_got_, sizeof(Hello) - in_got_);
    if (t.moved()) {
      in_got_ += t.bytes;
      continue;
    }
    if (t.would_block) return true;
    if (!outgoing_) return false;
    const std::string why = t.err == 0 ? "connection closed" : transport::errno_text(t.err);
    throw Error(dir_->context() + ": " + dir_->peer_address(peer_) +
                " closed the connection during the handshake (" + why +
                "); did it reject this rank's identity?");
  }
  if (outgoing_ && !dir_->reply_matches(in_, peer_, channel_, out_.flags)) {
    wrong_identity_ = true;
    throw Error(dir_->context() + ": " + dir_->peer_address(peer_) +
                " answered the handshake with a wrong identity (a different process or group "
                "listens there)");
  }
  return true;
}

bool Handshake::awaiting_verdict() const {
  return !outgoing_ && in_got_ == sizeof(Hello) && !out_ready_;
}

void Handshake::accept_hello() {
  peer_ = in_.from;
  channel_ = in_.channel;
  resume_ = (in_.flags & kHelloResume) != 0;
  out_ = dir_->hello_to(peer_, channel_, in_.flags & kHelloResume);
  out_ready_ = true;
}

bool Handshake::complete() const {
  return fd_.valid() && !connecting_ && out_ready_ && out_sent_ == sizeof(Hello) &&
         in_got_ == sizeof(Hello);
}

}  // namespace stragg::tcp
