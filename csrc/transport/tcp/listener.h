// The listening socket of TCP setup. It listens on bind_host (or advertise_host when that is
// empty) and the configured port (0: an ephemeral one, so several ranks can share an address),
// hands out the connections that arrive while the mesh is being connected, and then stays open
// for the transport's life: the re-dials of connections that break (resume.h) arrive on it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "transport/tcp/socket.h"

namespace stragg {
struct TcpOptions;
}

namespace stragg::tcp {

class Listener {
 public:
  // Binds and listens (non-blocking, with the option's socket buffer sizes, which accepted
  // sockets inherit). Throws stragg::Error starting with `context` if the address is not one of
  // this host's or the port is taken.
  Listener(const TcpOptions& options, const std::string& context);

  int fd() const { return fd_.get(); }
  uint16_t port() const { return port_; }

  struct Accepted {
    Fd fd;               // non-blocking, close-on-exec, TCP_NODELAY
    std::string remote;  // "host:port" of the connecting side, for messages
  };
  // The next connection waiting to be accepted, or nullopt when none is. Throws stragg::Error
  // starting with `context` on a failure other than an aborted connection.
  std::optional<Accepted> accept(const std::string& context);

 private:
  Fd fd_;
  uint16_t port_ = 0;
};

}  // namespace stragg::tcp
