#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>

#include "runtime/error.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kHelloMagic = 0x5354524147475443ull;    // "STRAGGTC"
constexpr uint64_t kMessageMagic = 0x53545241474d5347ull;  // "STRAGMSG"
constexpr uint32_t kProtocolVersion = 1;

// Data stream: every message starts with this frame head (magic + MessageHeader).
constexpr size_t kFrameHeadBytes = sizeof(uint64_t) + sizeof(MessageHeader);
// Payload pieces start aligned and are multiples of this (except a message's last piece), so
// they never split an element of any dtype.
constexpr size_t kPieceAlign = 64;
constexpr size_t kMinStagingBytes = 4096;

// Control stream: frames of {type, payload length} + payload.
enum ControlType : uint32_t { kArrival = 1, kAbort = 2 };
struct ControlHead {
  uint32_t type;
  uint32_t len;
};
constexpr size_t kMaxControlPayload = 4096;
constexpr size_t kMaxAbortBytes = 4000;
constexpr auto kAbortFlushBudget = std::chrono::milliseconds(1000);

// Setup handshake, sent by the connecting (higher) rank and answered by the accepting one.
enum Channel : uint32_t { kDataChannel = 0, kControlChannel = 1, kNumChannels = 2 };
struct Hello {
  uint64_t magic;
  uint32_t version;
  uint32_t channel;
  int32_t from;
  int32_t to;
  int32_t size;
  uint32_t pad;
  uint64_t from_nonce;
  uint64_t to_nonce;
};
static_assert(sizeof(Hello) == 48, "hello is sent as raw bytes");
// Refused connections are retried for a short while (the peer listens before publishing its
// address, so a refusal means it is gone or the address is wrong).
constexpr int kMaxConnectAttempts = 20;
constexpr auto kConnectRetryDelay = std::chrono::milliseconds(50);

std::string errno_text(int err) { return std::string(std::strerror(err)); }

std::string rank_prefix(int rank) { return "stragg: rank " + std::to_string(rank) + ": "; }

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream m;
  if (ranks.size() == 1) {
    m << "rank " << ranks[0];
    return m.str();
  }
  m << "ranks [";
  for (size_t i = 0; i < ranks.size(); ++i) m << (i ? ", " : "") << ranks[i];
  m << "]";
  return m.str();
}

std::string host_port(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

timespec to_timespec(std::chrono::microseconds d) {
  if (d.count() < 0) d = std::chrono::microseconds(0);
  timespec ts;
  ts.tv_sec = static_cast<time_t>(d.count() / 1000000);
  ts.tv_nsec = static_cast<long>((d.count() % 1000000) * 1000);
  return ts;
}

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// Resolves host (literal or name) and port; the first result wins.
SocketAddress resolve(const std::string& host, uint16_t port, int socktype, bool passive,
                      const std::string& context) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const int err = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (err != 0 || res == nullptr) {
    throw Error(context + ": cannot resolve '" + host + "': " + gai_strerror(err));
  }
  SocketAddress out;
  std::memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

std::string numeric_host(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, buf, sizeof buf);
  }
  return buf;
}

uint16_t port_of(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
  return 0;
}

// Non-blocking, close-on-exec TCP socket with the configured buffer sizes (set before
// connect/listen so the window scale covers them) and TCP_NODELAY.
Fd make_tcp_socket(int family, const TcpOptions& o, const std::string& context) {
  Fd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Error(context + ": socket() failed: " + errno_text(errno));
  if (o.socket_send_buffer > 0) {
    setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &o.socket_send_buffer, sizeof(int));
  }
  if (o.socket_recv_buffer > 0) {
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &o.socket_recv_buffer, sizeof(int));
  }
  const int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

uint64_t random_nonce() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const uint64_t t = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return r ^ (t * 0x9e3779b97f4a7c15ull) ^ static_cast<uint64_t>(getpid());
}

// Aligned staging memory.
struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// Per-peer state

struct TcpTransport::Peer {
  Fd data;
  Fd control;

  // Data plane: touched only by the thread that calls progress() / wait_for_activity().
  std::unique_ptr<uint8_t, FreeDeleter> rx;  // staging, options_.staging_bytes, 64-byte aligned
  size_t rx_begin = 0;                       // unconsumed bytes are rx[rx_begin, rx_end)
  size_t rx_end = 0;
  bool rx_in_message = false;  // a head was consumed, the payload is not complete yet
  bool tx_in_message = false;  // a head was started, the payload is not completely sent yet
  std::string rx_broken;       // non-empty: the incoming stream is unusable, and why
  std::string tx_broken;
  uint8_t tx_head[kFrameHeadBytes] = {};
  size_t tx_head_sent = 0;
  bool want_read = false;   // the last progress() left a receive from this peer unfinished
  bool want_write = false;  // ... a send to this peer unfinished

  // Control plane: guarded by TcpTransport::mu_.
  std::vector<uint8_t> ctrl_in;  // bytes of incomplete control frames
  std::string ctrl_out;          // queued control bytes; ctrl_out[0, ctrl_out_sent) are gone
  size_t ctrl_out_sent = 0;
  bool arrival_pending = false;  // own_arrival_ still has to be sent (coalesced)
  bool ctrl_readable = true;     // control connection not at EOF / failed
  bool ctrl_writable = true;
  int64_t arrival = -1;
  bool dead = false;
};

// ------------------------------------------------------------------------------------------------
// Setup: listen, publish, connect the mesh (higher rank connects to lower), handshake.

struct TcpTransport::Setup {
  struct Record {
    std::string host;
    uint16_t port = 0;
    uint64_t nonce = 0;
  };

  // One connection being made. Outgoing: connect, send hello, read reply. Incoming: accept, read
  // hello, send reply.
  struct Conn {
    Fd fd;
    bool outgoing = false;
    int peer = -1;  // incoming: known once the hello arrived
    uint32_t channel = 0;
    bool connecting = false;  // outgoing: connect() still in progress
    int attempts = 0;
    Clock::time_point retry_at{};  // outgoing: closed after a refusal, reconnect at this time
    Hello out{};
    size_t out_sent = 0;
    bool out_ready = false;  // `out` is prepared and may be sent
    Hello in{};
    size_t in_got = 0;
    std::string remote;  // incoming: remote address, for messages
  };

  TcpTransport& t;
  std::vector<Record> records;
  uint64_t nonce = 0;
  Fd listener;
  uint16_t port = 0;  // the port `listener` got
  std::vector<Conn> conns;
  std::vector<std::vector<bool>> established;  // [peer][channel]
  std::string last_rejection;
  Clock::time_point deadline;

  explicit Setup(TcpTransport& transport) : t(transport) {}

  std::string context() const { return rank_prefix(t.rank_) + "tcp transport setup"; }

  void listen() {
    const TcpOptions& o = t.options_;
    const std::string& host = o.bind_host.empty() ? o.advertise_host : o.bind_host;
    const SocketAddress addr = resolve(host, o.port, SOCK_STREAM, true, context());
    listener = make_tcp_socket(addr.family(), o, context());
    const int one = 1;
    setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listener.get(), addr.get(), addr.len) != 0 ||
        ::listen(listener.get(), SOMAXCONN) != 0) {
      throw Error(context() + ": cannot listen on " + host_port(host, o.port) + ": " +
                  errno_text(errno) + " (is the advertise/bind address one of this host's?)");
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    port = port_of(bound);
    t.listen_address_ = host_port(o.advertise_host, port);
    nonce = random_nonce();
  }

  void exchange(Rendezvous& rdv, const std::string& key_prefix) {
    const std::string mine =
        t.options_.advertise_host + "|" + std::to_string(port) + "|" + std::to_string(nonce);
    auto values = exchange_all(rdv, key_prefix + "/tcp", t.rank_, t.size_, mine,
                               t.options_.setup_timeout, "tcp transport setup");
    records.resize(t.size_);
    for (int p = 0; p < t.size_; ++p) {
      auto f = split(values[p], '|');
      try {
        if (f.size() != 3) throw std::invalid_argument("field count");
        records[p].host = f[0];
        const unsigned long peer_port = std::stoul(f[1]);
        if (peer_port == 0 || peer_port > 65535) throw std::invalid_argument("port");
        records[p].port = static_cast<uint16_t>(peer_port);
        records[p].nonce = std::stoull(f[2]);
      } catch (const std::exception&) {
        throw Error(context() + ": bad address record from rank " + std::to_string(p) + ": '" +
                    values[p] + "' (do all ranks run the same stragg version?)");
      }
    }
  }

  Hello hello_to(int peer, uint32_t channel) const {
    Hello h{};
    h.magic = kHelloMagic;
    h.version = kProtocolVersion;
    h.channel = channel;
    h.from = t.rank_;
    h.to = peer;
    h.size = t.size_;
    h.from_nonce = nonce;
    h.to_nonce = records[peer].nonce;
    return h;
  }

  std::string peer_address(int peer) const {
    return "rank " + std::to_string(peer) + " at " +
           host_port(records[peer].host, records[peer].port);
  }

  // Starts (or restarts) the outgoing connection `c` to its peer.
  void start_connect(Conn& c) {
    const Record& r = records[c.peer];
    const SocketAddress addr = resolve(r.host, r.port, SOCK_STREAM, false, context());
    c.fd = make_tcp_socket(addr.family(), t.options_, context());
    c.attempts++;
    c.connecting = true;
    c.out_sent = 0;
    c.in_got = 0;
    if (::connect(c.fd.get(), addr.get(), addr.len) == 0) return;  // checked on POLLOUT
    if (errno == EINPROGRESS || errno == EINTR) return;
    connect_failed(c, errno);
  }

  void connect_failed(Conn& c, int err) {
    c.fd.reset();
    c.connecting = false;
    const bool retry = (err == ECONNREFUSED || err == ETIMEDOUT || err == EAGAIN) &&
                       c.attempts < kMaxConnectAttempts;
    if (retry) {
      c.retry_at = Clock::now() + kConnectRetryDelay;
      return;
    }
    throw Error(context() + ": cannot connect to " + peer_address(c.peer) + ": " + errno_text(err));
  }

  void start() {
    established.assign(t.size_, std::vector<bool>(kNumChannels, false));
    for (int p = 0; p < t.rank_; ++p) {
      for (uint32_t ch = 0; ch < kNumChannels; ++ch) {
        Conn c;
        c.outgoing = true;
        c.peer = p;
        c.channel = ch;
        c.out = hello_to(p, ch);
        c.out_ready = true;
        conns.push_back(std::move(c));
        start_connect(conns.back());
      }
    }
  }

  int missing_incoming() const {
    int n = 0;
    for (int p = t.rank_ + 1; p < t.size_; ++p) {
      for (uint32_t ch = 0; ch < kNumChannels; ++ch) n += established[p][ch] ? 0 : 1;
    }
    return n;
  }

  // Done when every outgoing handshake finished and every higher rank connected; stray incoming
  // connections still pending do not hold setup up (they are closed).
  bool done() const {
    for (const Conn& c : conns) {
      if (c.outgoing) return false;
    }
    return missing_incoming() == 0;
  }

  // Why an incoming hello is not acceptable ("" if it is).
  std::string check_hello(const Hello& h) const {
    if (h.magic != kHelloMagic) return "not a stragg connection";
    if (h.version != kProtocolVersion) return "protocol version " + std::to_string(h.version);
    if (h.size != t.size_ || h.to != t.rank_ || h.to_nonce != nonce) {
      return "meant for another group or rank";
    }
    if (h.from <= t.rank_ || h.from >= t.size_ || h.channel >= kNumChannels) {
      return "invalid rank or channel";
    }
    if (h.from_nonce != records[h.from].nonce) {
      return "claims to be rank " + std::to_string(h.from) + " but does not match its record";
    }
    if (established[h.from][h.channel]) return "duplicate connection";
    for (const Conn& c : conns) {
      if (!c.outgoing && c.peer == h.from && c.channel == h.channel) return "duplicate connection";
    }
    return "";
  }

  void check_reply(const Conn& c) const {
    const Hello& h = c.in;
    const bool ok = h.magic == kHelloMagic && h.version == kProtocolVersion &&
                    h.channel == c.channel && h.from == c.peer && h.to == t.rank_ &&
                    h.size == t.size_ && h.from_nonce == records[c.peer].nonce &&
                    h.to_nonce == nonce;
    if (!ok) {
      throw Error(context() + ": " + peer_address(c.peer) +
                  " answered the handshake with a wrong identity (a different process or group "
                  "listens there)");
    }
  }

  void accept_all() {
    while (true) {
      sockaddr_storage from{};
      socklen_t len = sizeof from;
      Fd fd(::accept4(listener.get(), reinterpret_cast<sockaddr*>(&from), &len,
                      SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        throw Error(context() + ": accept() failed: " + errno_text(errno));
      }
      const int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Conn c;
      c.fd = std::move(fd);
      c.remote = host_port(numeric_host(from), port_of(from));
      conns.push_back(std::move(c));
    }
  }

  // Returns false if the connection has to be dropped (incoming with a bad hello).
  bool on_readable(Conn& c) {
    auto* dst = reinterpret_cast<uint8_t*>(&c.in);
    while (c.in_got < sizeof(Hello)) {
      const ssize_t r = ::recv(c.fd.get(), dst + c.in_got, sizeof(Hello) - c.in_got, MSG_DONTWAIT);
      if (r > 0) {
        c.in_got += static_cast<size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      const std::string why = r == 0 ? "connection closed" : errno_text(errno);
      if (c.outgoing) {
        throw Error(context() + ": " + peer_address(c.peer) +
                    " closed the connection during the handshake (" + why +
                    "); did it reject this rank's identity?");
      }
      last_rejection = "connection from " + c.remote + " closed during the handshake";
      return false;
    }
    if (c.outgoing) {
      check_reply(c);
      return true;
    }
    const std::string bad = check_hello(c.in);
    if (!bad.empty()) {
      last_rejection = "rejected a connection from " + c.remote + ": " + bad;
      return false;
    }
    c.peer = c.in.from;
    c.channel = c.in.channel;
    c.out = hello_to(c.peer, c.channel);
    c.out_ready = true;
    return true;
  }

  void on_writable(Conn& c) {
    if (c.connecting) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        connect_failed(c, err);
        return;
      }
      c.connecting = false;
    }
    const auto* src = reinterpret_cast<const uint8_t*>(&c.out);
    while (c.out_ready && c.out_sent < sizeof(Hello)) {
      const ssize_t r = ::send(c.fd.get(), src + c.out_sent, sizeof(Hello) - c.out_sent,
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        c.out_sent += static_cast<size_t>(r);
      } else if (r < 0 && errno == EINTR) {
        continue;
      } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        if (c.outgoing) {
          connect_failed(c, r < 0 ? errno : ECONNRESET);
        } else {
          c.fd.reset();  // dropped below
        }
        return;
      }
    }
  }

  bool complete(const Conn& c) const {
    return c.fd.valid() && !c.connecting && c.out_ready && c.out_sent == sizeof(Hello) &&
           c.in_got == sizeof(Hello);
  }

  void install(Conn& c) {
    Peer& p = t.peers_[c.peer];
    (c.channel == kDataChannel ? p.data : p.control) = std::move(c.fd);
    established[c.peer][c.channel] = true;
  }

  // One round of poll over the listener and all pending connections.
  void poll_once() {
    std::vector<pollfd> fds;
    std::vector<int> index;  // conn index per entry; -1: listener
    const auto now = Clock::now();
    auto wake_at = deadline;
    if (missing_incoming() > 0) {
      fds.push_back({listener.get(), POLLIN, 0});
      index.push_back(-1);
    }
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      if (!c.fd.valid()) {
        if (c.outgoing && now >= c.retry_at) start_connect(c);
        if (!c.fd.valid()) {
          wake_at = std::min(wake_at, c.retry_at);
          continue;
        }
      }
      short events = 0;
      if (c.connecting || (c.out_ready && c.out_sent < sizeof(Hello))) events |= POLLOUT;
      if (!c.connecting && c.in_got < sizeof(Hello)) events |= POLLIN;
      fds.push_back({c.fd.get(), events, 0});
      index.push_back(static_cast<int>(i));
    }
    const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(wake_at - now);
    const timespec ts = to_timespec(wait);
    if (::ppoll(fds.data(), fds.size(), &ts, nullptr) <= 0) return;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      if (index[k] < 0) {
        accept_all();  // appends to conns; indices below stay valid
        continue;
      }
      Conn& c = conns[index[k]];
      bool keep = true;
      if (fds[k].revents & (POLLOUT | POLLERR | POLLHUP)) on_writable(c);
      if (c.fd.valid() && !c.connecting && (fds[k].revents & (POLLIN | POLLERR | POLLHUP))) {
        keep = on_readable(c);
      }
      if (!c.outgoing && (!keep || !c.fd.valid())) c.peer = -2;  // dropped
      if (c.fd.valid() && complete(c)) {
        // on_writable may have sent the reply already, after on_readable prepared it.
        install(c);
        c.peer = -2;
      }
    }
    // A prepared reply is sent on the next round (POLLOUT); drop finished or rejected entries.
    conns.erase(
        std::remove_if(conns.begin(), conns.end(), [](const Conn& c) { return c.peer == -2; }),
        conns.end());
  }

  [[noreturn]] void timeout_error() const {
    std::vector<int> silent, unanswered;
    for (int p = t.rank_ + 1; p < t.size_; ++p) {
      if (!established[p][kDataChannel] || !established[p][kControlChannel]) silent.push_back(p);
    }
    for (const Conn& c : conns) {
      if (c.outgoing && (unanswered.empty() || unanswered.back() != c.peer)) {
        unanswered.push_back(c.peer);
      }
    }
    std::ostringstream m;
    m << context() << " timed out after "
      << std::chrono::duration_cast<std::chrono::milliseconds>(t.options_.setup_timeout).count() /
             1000.0
      << " s";
    if (!silent.empty()) m << ": " << join_ranks(silent) << " did not connect";
    for (int p : unanswered) m << "; no handshake with " << peer_address(p);
    if (!last_rejection.empty()) m << " (last problem: " << last_rejection << ")";
    throw TimeoutError(m.str());
  }

  void connect_mesh() {
    deadline = Clock::now() + t.options_.setup_timeout;
    start();
    while (!done()) {
      if (Clock::now() >= deadline) timeout_error();
      poll_once();
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Construction

TcpTransport::TcpTransport(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                           const TcpOptions& options)
    : rank_(rank), size_(size), options_(options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error("stragg: tcp transport: invalid rank " + std::to_string(rank) + " of " +
                std::to_string(size));
  }
  options_.staging_bytes =
      round_up(std::max(options_.staging_bytes, kMinStagingBytes), kPieceAlign);
  peers_.resize(size_);
  {
    Setup setup(*this);
    setup.listen();
    setup.exchange(rdv, key_prefix);
    setup.connect_mesh();
  }  // closes the listener
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    throw Error(rank_prefix(rank_) + "tcp transport: eventfd() failed: " + errno_text(errno));
  }
}

TcpTransport::~TcpTransport() {
  // Closing the sockets (Peer::~Peer) is the goodbye: peers see EOF.
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

TcpTransport::Peer& TcpTransport::peer_for(int peer, const char* what) {
  if (peer == rank_ || peer < 0 || peer >= size_) {
    throw Error(rank_prefix(rank_) + "invalid " + what + " peer " + std::to_string(peer));
  }
  return peers_[peer];
}

void TcpTransport::wake() {
  if (wake_fd_ < 0) return;  // still in the constructor
  const uint64_t one = 1;
  ssize_t r = ::write(wake_fd_, &one, sizeof one);
  (void)r;  // EAGAIN only if the counter is saturated: it is readable then anyway
}

// Something a waiter must see happened: bump the event count and wake a wait in another thread.
void TcpTransport::note_event() {
  events_.fetch_add(1);
  wake();
}

void TcpTransport::mark_dead_locked(int peer) {
  Peer& p = peers_[peer];
  if (p.dead) return;
  p.dead = true;
  note_event();
}

void TcpTransport::mark_dead(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  mark_dead_locked(peer);
}

// ------------------------------------------------------------------------------------------------
// Data plane

bool TcpTransport::progress(SendOp& op) {
  if (op.done) return false;
  Peer& p = peer_for(op.peer, "send");
  if (!p.tx_broken.empty()) throw Error(rank_prefix(rank_) + p.tx_broken);
  if (!op.started) {
    if (p.tx_in_message) {
      p.tx_broken = "the connection to rank " + std::to_string(op.peer) +
                    " is unusable: a message to it was abandoned half-way";
      throw Error(rank_prefix(rank_) + p.tx_broken);
    }
    std::memcpy(p.tx_head, &kMessageMagic, sizeof kMessageMagic);
    std::memcpy(p.tx_head + sizeof kMessageMagic, &op.header, sizeof(MessageHeader));
    p.tx_head_sent = 0;
    p.tx_in_message = true;
    op.started = true;
  }
  const size_t total = op.header.payload_bytes;
  const auto* data = static_cast<const uint8_t*>(op.data);
  bool moved = false;
  while (!op.done) {
    iovec iov[2];
    int n = 0;
    size_t want = 0;
    if (p.tx_head_sent < kFrameHeadBytes) {
      iov[n++] = {p.tx_head + p.tx_head_sent, kFrameHeadBytes - p.tx_head_sent};
    }
    if (op.sent < total) iov[n++] = {const_cast<uint8_t*>(data) + op.sent, total - op.sent};
    for (int i = 0; i < n; ++i) want += iov[i].iov_len;
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t r = ::sendmsg(p.data.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) mark_dead(op.peer);  // EPIPE, ECONNRESET
      break;
    }
    moved = true;
    size_t k = static_cast<size_t>(r);
    const size_t head = std::min(k, kFrameHeadBytes - p.tx_head_sent);
    p.tx_head_sent += head;
    op.sent += k - head;
    if (p.tx_head_sent == kFrameHeadBytes && op.sent == total) {
      op.done = true;
      p.tx_in_message = false;
    } else if (k < want) {
      break;  // the socket buffer is full
    }
  }
  p.want_write = !op.done;
  return moved;
}

// Reads whatever the data connection has into staging. False if nothing came (no data yet,
// or the peer is gone).
bool TcpTransport::fill_staging(int peer) {
  Peer& p = peers_[peer];
  const size_t cap = options_.staging_bytes;
  if (!p.rx) {
    p.rx.reset(static_cast<uint8_t*>(std::aligned_alloc(kPieceAlign, cap)));
    if (!p.rx) throw Error(rank_prefix(rank_) + "cannot allocate tcp staging memory");
  }
  // Only a partial head or a partial 64-byte unit is left when we get here: move it to the
  // (aligned) front.
  const size_t left = p.rx_end - p.rx_begin;
  if (p.rx_begin > 0) std::memmove(p.rx.get(), p.rx.get() + p.rx_begin, left);
  p.rx_begin = 0;
  p.rx_end = left;
  while (true) {
    const ssize_t r = ::recv(p.data.get(), p.rx.get() + p.rx_end, cap - p.rx_end, MSG_DONTWAIT);
    if (r > 0) {
      p.rx_end += static_cast<size_t>(r);
      return true;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    mark_dead(peer);  // EOF, ECONNRESET
    return false;
  }
}

bool TcpTransport::progress(RecvOp& op) {
  if (op.done) return false;
  Peer& p = peer_for(op.peer, "receive");
  if (!p.rx_broken.empty()) throw Error(rank_prefix(rank_) + p.rx_broken);
  if (!op.header_seen && p.rx_in_message) {
    p.rx_broken = "the connection from rank " + std::to_string(op.peer) +
                  " is unusable: a message from it was abandoned half-way";
    throw Error(rank_prefix(rank_) + p.rx_broken);
  }
  bool moved = false;
  while (!op.done) {
    const size_t avail = p.rx_end - p.rx_begin;
    if (!op.header_seen && avail >= kFrameHeadBytes) {
      take_head(op, p);
      moved = true;
      continue;
    }
    if (op.header_seen) {
      const size_t want = op.expected - op.received;
      size_t n = std::min(avail, want);
      if (n < want) n -= n % kPieceAlign;  // whole units, except for the message's last piece
      if (n > 0) {
        deliver(op, p, n);
        moved = true;
        continue;
      }
    }
    if (!fill_staging(op.peer)) break;
  }
  p.want_read = !op.done;
  return moved;
}

void TcpTransport::take_head(RecvOp& op, Peer& p) {
  const uint8_t* head = p.rx.get() + p.rx_begin;
  uint64_t magic = 0;
  std::memcpy(&magic, head, sizeof magic);
  if (magic != kMessageMagic) {
    p.rx_broken = "message stream from rank " + std::to_string(op.peer) +
                  " out of sync (no message head where one should start)";
    throw Error(rank_prefix(rank_) + p.rx_broken);
  }
  MessageHeader header;
  std::memcpy(&header, head + sizeof magic, sizeof header);
  p.rx_begin += kFrameHeadBytes;
  p.rx_in_message = true;
  try {
    op.sink->on_header(header);
  } catch (...) {
    p.rx_broken = "the connection from rank " + std::to_string(op.peer) +
                  " is unusable after a rejected message";
    throw;
  }
  op.header_seen = true;
  op.expected = header.payload_bytes;
  op.received = 0;
  if (op.expected == 0) {
    finish_receive(op, p);
    return;
  }
  // Pieces are handed out from aligned addresses: realign the buffered payload once.
  if (p.rx_begin % kPieceAlign != 0) {
    const size_t left = p.rx_end - p.rx_begin;
    std::memmove(p.rx.get(), p.rx.get() + p.rx_begin, left);
    p.rx_begin = 0;
    p.rx_end = left;
  }
}

void TcpTransport::deliver(RecvOp& op, Peer& p, size_t n) {
  try {
    op.sink->on_data(op.received, p.rx.get() + p.rx_begin, n);
  } catch (...) {
    p.rx_broken = "the connection from rank " + std::to_string(op.peer) +
                  " is unusable after a failed receive";
    throw;
  }
  p.rx_begin += n;
  op.received += n;
  if (op.received == op.expected) finish_receive(op, p);
}

void TcpTransport::finish_receive(RecvOp& op, Peer& p) {
  op.done = true;
  p.rx_in_message = false;
  if (p.rx_begin == p.rx_end) p.rx_begin = p.rx_end = 0;
}

// ------------------------------------------------------------------------------------------------
// Waiting

uint64_t TcpTransport::activity_token() { return events_.load(); }

void TcpTransport::wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) {
  poll_fds_.clear();
  poll_peers_.clear();
  poll_is_data_.clear();
  auto add = [&](int fd, short events, int peer, bool is_data) {
    poll_fds_.push_back({fd, events, 0});
    poll_peers_.push_back(peer);
    poll_is_data_.push_back(is_data ? 1 : 0);
  };
  add(wake_fd_, POLLIN, -1, false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      Peer& p = peers_[q];
      if (!p.dead) {
        short ev = POLLRDHUP;
        if (p.want_read) ev |= POLLIN;
        if (p.want_write) ev |= POLLOUT;
        add(p.data.get(), ev, q, true);
      }
      if (p.ctrl_readable || (p.ctrl_writable && p.ctrl_out_sent < p.ctrl_out.size())) {
        short ev = p.ctrl_readable ? POLLIN : 0;
        if (p.ctrl_writable && p.ctrl_out_sent < p.ctrl_out.size()) ev |= POLLOUT;
        add(p.control.get(), ev, q, false);
      }
    }
  }
  for (Peer& p : peers_) p.want_read = p.want_write = false;  // the next progress() sets them
  if (events_.load() != token) return;

  const timespec ts = to_timespec(max_wait);
  if (::ppoll(poll_fds_.data(), poll_fds_.size(), &ts, nullptr) <= 0) return;

  if (poll_fds_[0].revents != 0) {
    uint64_t drained;
    ssize_t r = ::read(wake_fd_, &drained, sizeof drained);
    (void)r;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 1; i < poll_fds_.size(); ++i) {
    const short rev = poll_fds_[i].revents;
    if (rev == 0) continue;
    const int q = poll_peers_[i];
    if (poll_is_data_[i]) {
      if (rev & (POLLRDHUP | POLLHUP | POLLERR)) mark_dead_locked(q);
      continue;
    }
    if (rev & (POLLIN | POLLHUP | POLLERR)) read_control_locked(q);
    if (rev & POLLOUT) flush_control_locked(q);
  }
}

// ------------------------------------------------------------------------------------------------
// Control plane

void TcpTransport::drain_control_locked() {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || !peers_[q].ctrl_readable) continue;
    fds.push_back({peers_[q].control.get(), POLLIN, 0});
    who.push_back(q);
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents != 0) read_control_locked(who[i]);
  }
}

void TcpTransport::read_control_locked(int peer) {
  Peer& p = peers_[peer];
  uint8_t buf[4096];
  while (p.ctrl_readable) {
    const ssize_t r = ::recv(p.control.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (r > 0) {
      p.ctrl_in.insert(p.ctrl_in.end(), buf, buf + r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // EOF or reset: the peer closed its transport or died. Its data connection decides when it
    // counts as dead (see the header); stop polling this one.
    p.ctrl_readable = false;
  }
  size_t pos = 0;
  while (p.ctrl_in.size() - pos >= sizeof(ControlHead)) {
    ControlHead head;
    std::memcpy(&head, p.ctrl_in.data() + pos, sizeof head);
    if (head.len > kMaxControlPayload || (head.type != kArrival && head.type != kAbort)) {
      p.ctrl_readable = false;
      p.ctrl_in.clear();
      if (!abort_reason_) {
        abort_reason_ =
            rank_prefix(rank_) + "corrupt control stream from rank " + std::to_string(peer);
        note_event();
      }
      return;
    }
    if (p.ctrl_in.size() - pos < sizeof head + head.len) break;
    handle_control_frame_locked(peer, head.type, p.ctrl_in.data() + pos + sizeof head, head.len);
    pos += sizeof head + head.len;
  }
  p.ctrl_in.erase(p.ctrl_in.begin(), p.ctrl_in.begin() + static_cast<std::ptrdiff_t>(pos));
}

void TcpTransport::handle_control_frame_locked(int peer, uint32_t type, const uint8_t* payload,
                                               size_t len) {
  if (type == kArrival && len == sizeof(int64_t)) {
    std::memcpy(&peers_[peer].arrival, payload, sizeof(int64_t));
  } else if (type == kAbort && !abort_reason_) {
    abort_reason_ = std::string(reinterpret_cast<const char*>(payload), len);
    note_event();
  }
}

void TcpTransport::queue_control_locked(int peer, uint32_t type, const void* payload, size_t len) {
  Peer& p = peers_[peer];
  if (!p.ctrl_writable) return;
  const ControlHead head{type, static_cast<uint32_t>(len)};
  p.ctrl_out.append(reinterpret_cast<const char*>(&head), sizeof head);
  p.ctrl_out.append(static_cast<const char*>(payload), len);
}

// Sends queued control bytes without blocking. True when nothing is left to send.
bool TcpTransport::flush_control_locked(int peer) {
  Peer& p = peers_[peer];
  while (p.ctrl_writable) {
    if (p.ctrl_out_sent == p.ctrl_out.size()) {
      p.ctrl_out.clear();
      p.ctrl_out_sent = 0;
      if (!p.arrival_pending) return true;
      p.arrival_pending = false;  // only the newest ticket is worth sending
      queue_control_locked(peer, kArrival, &own_arrival_, sizeof own_arrival_);
    }
    const ssize_t r = ::send(p.control.get(), p.ctrl_out.data() + p.ctrl_out_sent,
                             p.ctrl_out.size() - p.ctrl_out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      p.ctrl_out_sent += static_cast<size_t>(r);
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return false;
    } else {
      p.ctrl_writable = false;  // the peer is gone; nothing more to tell it
      p.ctrl_out.clear();
      p.ctrl_out_sent = 0;
    }
  }
  return true;
}

// Flushes every peer's control bytes, waiting for socket space up to `budget` in total.
void TcpTransport::flush_control_blocking_locked(std::chrono::milliseconds budget) {
  const auto deadline = Clock::now() + budget;
  while (true) {
    std::vector<pollfd> fds;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || flush_control_locked(q)) continue;
      fds.push_back({peers_[q].control.get(), POLLOUT, 0});
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
    if (fds.empty() || left.count() <= 0) return;
    const timespec ts = to_timespec(left);
    ::ppoll(fds.data(), fds.size(), &ts, nullptr);
  }
}

void TcpTransport::signal_abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    drain_control_locked();  // an abort that already arrived is the first reason
    if (!abort_reason_) abort_reason_ = reason.substr(0, kMaxAbortBytes);
    if (!abort_sent_) {
      abort_sent_ = true;
      const std::string& why = *abort_reason_;
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) queue_control_locked(q, kAbort, why.data(), why.size());
      }
    }
    flush_control_blocking_locked(kAbortFlushBudget);
    note_event();
  }
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
    fds.push_back({peers_[q].data.get(), POLLRDHUP, 0});
    who.push_back(q);
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
      mark_dead_locked(who[i]);
    }
  }
}

std::vector<int> TcpTransport::dead_peers() {
  std::lock_guard<std::mutex> lock(mu_);
  drain_control_locked();
  poll_data_hangups_locked();
  std::vector<int> dead;
  for (int q = 0; q < size_; ++q) {
    if (q != rank_ && peers_[q].dead) dead.push_back(q);
  }
  return dead;
}

void TcpTransport::announce_arrival(uint64_t coll_seq) {
  std::lock_guard<std::mutex> lock(mu_);
  own_arrival_ = static_cast<int64_t>(coll_seq);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    peers_[q].arrival_pending = true;
    flush_control_locked(q);
  }
}

int64_t TcpTransport::peer_arrival(int peer) {
  if (peer < 0 || peer >= size_) return -1;
  std::lock_guard<std::mutex> lock(mu_);
  if (peer == rank_) return own_arrival_;
  drain_control_locked();
  return peers_[peer].arrival;
}

// ------------------------------------------------------------------------------------------------

std::string local_address_toward(const std::string& host) {
  const std::string context = "stragg: tcp transport: finding the local address toward " + host;
  const SocketAddress addr = resolve(host, 9, SOCK_DGRAM, false, context);
  Fd fd(::socket(addr.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Error(context + ": socket() failed: " + errno_text(errno));
  // connect() on a UDP socket only picks the route and source address; nothing is sent.
  if (::connect(fd.get(), addr.get(), addr.len) != 0) {
    throw Error(context + ": " + errno_text(errno));
  }
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    throw Error(context + ": getsockname() failed: " + errno_text(errno));
  }
  return numeric_host(local);
}

}  // namespace stragg
