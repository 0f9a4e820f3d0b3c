#include "transport/tcp/listener.h"

#include <sys/socket.h>

#include <cerrno>

#include "common/error.h"
#include "transport/common.h"
#include "transport/tcp/address.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg::tcp {

Listener::Listener(const TcpOptions& o, const std::string& context) {
  const std::string& host = o.bind_host.empty() ? o.advertise_host : o.bind_host;
  const SocketAddress addr = resolve(host, o.port, SOCK_STREAM, true, context);
  fd_ = make_stream_socket(addr.family(), o.socket_send_buffer, o.socket_recv_buffer, context);
  const int one = 1;
  setsockopt(fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd_.get(), addr.get(), addr.len) != 0 || ::listen(fd_.get(), SOMAXCONN) != 0) {
    throw Error(context + ": cannot listen on " + host_port(host, o.port) + ": " +
                transport::errno_text(errno) +
                " (is the advertise/bind address one of this host's?)");
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = port_of(bound);
}

std::optional<Listener::Accepted> Listener::accept(const std::string& context) {
  while (true) {
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    Fd fd(::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&from), &len,
                    SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.valid()) {
      set_no_delay(fd.get());
      return Accepted{std::move(fd), host_port(numeric_host(from), port_of(from))};
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return std::nullopt;
    throw Error(context + ": accept() failed: " + transport::errno_text(errno));
  }
}

}  // namespace stragg::tcp
