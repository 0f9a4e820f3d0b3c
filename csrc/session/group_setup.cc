#include "session/group_setup.h"

#include <sched.h>

#include <sstream>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/host_identity.h"
#include "common/interfaces.h"
#include "common/log.h"
#include "transport/mixed/host_layout.h"
#include "transport/mixed/mixed_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg {
namespace {

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::string env_name(const std::string& key) {
  for (const SettingInfo& info : settings_table()) {
    if (info.key == key) return info.env;
  }
  return key;
}

// This rank's TCP address ("-" when unknown, "!" + why when the interfaces the user named give
// none), worked out before the exchange so that every rank decides the transport from the same
// information: STRAGG_TCP_HOST, else the first interface STRAGG_SOCKET_IFNAME (or
// GLOO_SOCKET_IFNAME) selects, else the one whose route reaches the store.
std::string tcp_address(const Settings& s, const std::string& store_host, int rank) {
  std::string address = s.tcp_host;
  if (address.empty() && !s.socket_ifname.empty()) {
    const std::vector<NetInterface> all = local_interfaces();
    const std::vector<NetInterface> chosen =
        select_interfaces(parse_interface_spec(s.socket_ifname), all);
    if (chosen.empty()) {
      return "!stragg: rank " + std::to_string(rank) +
             ": STRAGG_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME) '" + s.socket_ifname +
             "' selects no interface that is up with an address on its host (it has: " +
             describe_interfaces(all) + ")";
    }
    if (chosen.size() > 1) {
      std::vector<NetInterface> rest(chosen.begin() + 1, chosen.end());
      log_info("stragg: rank " + std::to_string(rank) + ": interfaces '" + s.socket_ifname +
               "' select " + describe_interfaces(chosen) + "; the TCP transport uses " +
               chosen[0].name + " (one interface per rank: " + describe_interfaces(rest) +
               " unused)");
    }
    return chosen[0].address;
  }
  if (address.empty() && !store_host.empty()) {
    try {
      address = local_address_toward(store_host);
    } catch (const Error& e) {
      log_warning(e.what());  // no route: TCP is not possible, auto falls back to Gloo
      address.clear();
    }
  }
  return address.empty() ? "-" : address;
}

// Hello record: host identity, TCP address, then "key=value" per must-match setting.
std::string hello_record(const Settings& s, const std::string& address) {
  std::string out = host_identity() + "\n" + address;
  for (const auto& [key, value] : must_match_values(s)) out += "\n" + key + "=" + value;
  return out;
}

void check_settings_match(const std::vector<std::vector<std::string>>& hello, int rank) {
  const auto& mine = hello[rank];
  for (size_t r = 0; r < hello.size(); ++r) {
    const auto& theirs = hello[r];
    if (theirs.size() != mine.size()) {
      throw Error("stragg: rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                  " sent a setup record of another stragg version (" +
                  std::to_string(theirs.size()) + " fields, this rank has " +
                  std::to_string(mine.size()) + ")");
    }
    for (size_t i = 2; i < mine.size(); ++i) {
      if (theirs[i] == mine[i]) continue;
      const std::string key = mine[i].substr(0, mine[i].find('='));
      const int lo = std::min<int>(rank, static_cast<int>(r));
      const int hi = std::max<int>(rank, static_cast<int>(r));
      auto value = [&](int q) {
        const std::string& f = hello[q][i];
        return f.substr(f.find('=') + 1);
      };
      throw SettingsError("stragg: rank " + std::to_string(rank) + ": " + env_name(key) +
                          " mismatch: rank " + std::to_string(lo) + " uses '" + value(lo) +
                          "', rank " + std::to_string(hi) + " uses '" + value(hi) +
                          "' (it must be equal on all ranks)");
    }
  }
}

TransportChoice decide(const Settings& s, const HostLayout& hosts, bool all_addresses, int rank) {
  TransportChoice chosen = s.transport;
  if (chosen == TransportChoice::Auto) {
    if (hosts.all_on_one_host()) {
      chosen = TransportChoice::Shm;
    } else if (!all_addresses) {
      chosen = TransportChoice::Gloo;
    } else {
      chosen = hosts.every_rank_alone() ? TransportChoice::Tcp : TransportChoice::Mixed;
    }
  }
  if (chosen == TransportChoice::Shm && !hosts.all_on_one_host()) {
    throw Error("stragg: rank " + std::to_string(rank) +
                ": STRAGG_TRANSPORT=shm but the ranks are not on one host (different host, boot "
                "or network namespace; ranks per host: " +
                hosts.describe() + ")");
  }
  if ((chosen == TransportChoice::Tcp || chosen == TransportChoice::Mixed) && !all_addresses) {
    throw Error("stragg: rank " + std::to_string(rank) +
                ": STRAGG_TRANSPORT=" + transport_choice_name(chosen) +
                " needs every rank's address: set STRAGG_TCP_HOST (or use a TCPStore / "
                "MASTER_ADDR, whose route picks it)");
  }
  return chosen;
}

// STRAGG_SPIN_US=auto: busy-poll 5 us before yielding, unless this host runs more ranks than
// this process may use CPUs: then a spinning rank holds the CPU its peer needs, so it yields at
// once (OpenMPI's yield_when_idle when oversubscribed does the same).
int spin_us_for(const Settings& settings, int ranks_on_host) {
  if (settings.spin_us >= 0) return settings.spin_us;
  cpu_set_t set;
  int cpus = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus > 0 && ranks_on_host > cpus ? 0 : 5;
}

ShmOptions shm_options(const Settings& settings, std::chrono::milliseconds timeout,
                       int ranks_on_host) {
  ShmOptions o;
  o.slot_bytes = settings.shm_slot_bytes;
  o.num_slots = settings.shm_slots;
  o.spin_us = spin_us_for(settings, ranks_on_host);
  o.yield_us = settings.yield_us;
  o.oneshot_bytes = settings.oneshot_bytes;
  o.setup_timeout = timeout;
  return o;
}

TcpOptions tcp_options(const Settings& settings, const std::string& address,
                       std::chrono::milliseconds timeout) {
  TcpOptions o;
  o.advertise_host = address;
  o.port = settings.tcp_port;
  o.staging_bytes = settings.tcp_staging_bytes;
  o.unsent_bytes = settings.tcp_unsent_bytes;
  o.setup_timeout = timeout;
  return o;
}

}  // namespace

GroupSetup set_up_group(Rendezvous& rdv, int rank, int size, const Settings& settings,
                        const std::string& store_host, std::chrono::milliseconds timeout) {
  const std::string address = tcp_address(settings, store_host, rank);
  const std::vector<std::string> records =
      exchange_all(rdv, "hello", rank, size, hello_record(settings, address), timeout,
                   "process group setup");
  std::vector<std::vector<std::string>> hello;
  for (const auto& r : records) hello.push_back(split_lines(r));
  check_settings_match(hello, rank);
  GroupSetup out;
  bool all_addresses = true;
  std::vector<std::string> identities;
  for (const auto& h : hello) {
    if (h.size() < 2) {
      throw Error("stragg: rank " + std::to_string(rank) + ": bad setup record from a peer");
    }
    identities.push_back(h[0]);
    all_addresses = all_addresses && h[1] != "-" && (h[1].empty() || h[1][0] != '!');
  }
  const HostLayout hosts(identities);
  for (size_t r = 0; r < hello.size() && !hosts.all_on_one_host(); ++r) {
    // Interfaces a user named but that give no address are an error, not a fallback to Gloo.
    const std::string& a = hello[r][1];
    if (!a.empty() && a[0] == '!') {
      throw Error(static_cast<int>(r) == rank
                      ? a.substr(1)
                      : "stragg: rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                            " has no address for the TCP transport: " + a.substr(1));
    }
  }
  out.same_host = hosts.all_on_one_host();
  for (int r = 0; r < size; ++r) out.host_of.push_back(hosts.host_of(r));
  out.transport = decide(settings, hosts, all_addresses, rank);
  int ranks_on_host = 0;
  for (int r = 0; r < size; ++r) ranks_on_host += out.host_of[r] == out.host_of[rank] ? 1 : 0;
  if (out.transport == TransportChoice::Shm) {
    out.impl =
        std::make_unique<ShmTransport>(rdv, "shm", rank, size,
                                              shm_options(settings, timeout, ranks_on_host));
  } else if (out.transport == TransportChoice::Tcp) {
    out.impl = std::make_unique<TcpTransport>(rdv, "tcp", rank, size,
                                              tcp_options(settings, address, timeout));
  } else if (out.transport == TransportChoice::Mixed) {
    MixedOptions o{shm_options(settings, timeout, ranks_on_host),
                   tcp_options(settings, address, timeout)};
    o.shm.oneshot_bytes = 0;  // the one-shot all_reduce needs every rank in memory
    out.impl = std::make_unique<MixedTransport>(rdv, "mixed", rank, identities, o);
  }
  return out;
}

}  // namespace stragg
