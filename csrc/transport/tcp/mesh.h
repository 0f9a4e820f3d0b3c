// Connecting the full mesh of TCP setup: listen (listener.h), publish this rank's record and
// collect everybody's through the rendezvous (exchange_all, which names ranks that never join),
// then make two connections per pair of ranks, the higher rank connecting to the lower one, and
// check every peer's identity (handshake.h). All connections are driven by one ppoll() loop under
// the setup deadline; an idle or rejected stray connection does not hold setup up. The listening
// socket and the directory of identities outlive setup: the transport keeps them to accept the
// re-dials of reset connections (resume.h). Strays still pending at the end are closed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/handshake.h"
#include "transport/tcp/listener.h"
#include "transport/tcp/socket.h"

namespace stragg {
class Rendezvous;
struct TcpOptions;
}  // namespace stragg

namespace stragg::tcp {

struct Mesh {
  std::vector<Fd> data;        // by rank; this rank's entry stays invalid
  std::vector<Fd> control;     // likewise
  std::string listen_address;  // "advertise_host:port" this rank listened on
  std::unique_ptr<Listener> listener;  // still listening
  Directory directory;                 // this rank's identity and every rank's record
};

// Collective over all `size` ranks. Throws stragg::Error (or TimeoutError after
// options.setup_timeout, for the exchange and again for connecting) naming this rank and the
// peer that failed or never joined.
Mesh connect_mesh(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                  const TcpOptions& options);

}  // namespace stragg::tcp
