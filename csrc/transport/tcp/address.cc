#include "transport/tcp/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/common.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg {
namespace tcp {

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

std::string host_port(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace tcp

std::string local_address_toward(const std::string& host) {
  using transport::errno_text;
  const std::string context = "stragg: tcp transport: finding the local address toward " + host;
  const tcp::SocketAddress addr = tcp::resolve(host, 9, SOCK_DGRAM, false, context);
  tcp::Fd fd(::socket(addr.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
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
  return tcp::numeric_host(local);
}

}  // namespace stragg
