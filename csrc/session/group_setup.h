// The setup handshake of a group (no torch here). Every rank publishes a hello record through
// the rendezvous: its host identity, the address it would use for TCP, and the settings all ranks
// must agree on (Settings table rows marked must_match). All ranks then decide the transport from
// the same records and build it:
//   auto -> shared memory when every rank is on this host (same boot and network namespace);
//           across hosts, when every rank knows its address: TCP if every rank is alone on its
//           host, else the mixed transport (shared memory to the ranks of the same host, TCP to
//           the others, transport/mixed/mixed_transport.h); otherwise the inner Gloo backend.
// A setting that differs between ranks raises on every rank, naming it and both values.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous.h"
#include "plan/settings.h"
#include "transport/transport.h"

namespace stragg {

struct GroupSetup {
  TransportChoice transport = TransportChoice::Gloo;  // Shm, Tcp, Mixed or Gloo (delegated)
  bool same_host = true;                              // every rank on this host
  std::vector<int> host_of;                           // host index of every rank (HostLayout)
  std::unique_ptr<Transport> impl;                    // null for Gloo
};

// Collective over `size` ranks (size >= 2). `store_host`: host of the rendezvous store
// (TCPStore / MASTER_ADDR), whose route picks this rank's TCP address when Settings::tcp_host is
// empty. Throws stragg::Error (TimeoutError for ranks that never join) naming this rank and the
// problem; SettingsError for settings that differ between ranks.
GroupSetup set_up_group(Rendezvous& rdv, int rank, int size, const Settings& settings,
                        const std::string& store_host, std::chrono::milliseconds timeout);

}  // namespace stragg
