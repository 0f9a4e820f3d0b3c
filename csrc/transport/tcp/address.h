// Socket addresses of the TCP transport: resolving a host (IPv4/IPv6 literal or name) and port,
// and printing addresses as "host:port" ("[v6]:port"). local_address_toward(), declared in
// tcp_transport.h, lives in address.cc.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace stragg::tcp {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t len = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// Resolves `host` and `port` for `socktype` (SOCK_STREAM, SOCK_DGRAM); the first result wins.
// `passive`: an address to bind to. Throws stragg::Error starting with `context`.
SocketAddress resolve(const std::string& host, uint16_t port, int socktype, bool passive,
                      const std::string& context);

// The numeric host of an IPv4/IPv6 address ("" for other families).
std::string numeric_host(const sockaddr_storage& ss);
// The port of an IPv4/IPv6 address (0 for other families).
uint16_t port_of(const sockaddr_storage& ss);
// "host:port", with brackets around an IPv6 host.
std::string host_port(const std::string& host, uint16_t port);

}  // namespace stragg::tcp
