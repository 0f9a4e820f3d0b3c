// Which network interface a rank's TCP transport uses: STRAGG_SOCKET_IFNAME (NCCL's syntax,
// default GLOO_SOCKET_IFNAME), matched against this host's interfaces (getifaddrs).
//
// Syntax of a spec (as NCCL_SOCKET_IFNAME): a comma list of names; an element matches every
// interface whose name starts with it ("eth" matches eth0 and eth1); a leading '=' makes the
// whole list exact names ("=eth0"), a leading '^' makes it a list to exclude ("^docker,lo";
// "^=eth1" excludes exactly eth1). Gloo's GLOO_SOCKET_IFNAME (exact names) reads as "=" + it.
#pragma once

#include <string>
#include <vector>

namespace stragg {

struct NetInterface {
  std::string name;
  std::string address;  // IPv4 if it has one, else its first global IPv6 address
  bool loopback = false;
};

struct InterfaceSpec {
  bool exclude = false;  // '^': every interface but these
  bool exact = false;    // '=': whole names, not prefixes
  std::vector<std::string> names;
  bool empty() const { return names.empty(); }
};

// Throws stragg::Error for a list with an empty element ("eth0,,eth1", "^", "=").
InterfaceSpec parse_interface_spec(const std::string& text);
bool interface_matches(const InterfaceSpec& spec, const std::string& name);

// The interfaces that are up and have an address, in the system's order.
std::vector<NetInterface> local_interfaces();

// The interfaces of `all` that `spec` selects: for a list of names in the order of the list
// (an element's matches in the system's order), for an exclusion in the system's order with
// loopback last.
std::vector<NetInterface> select_interfaces(const InterfaceSpec& spec,
                                            const std::vector<NetInterface>& all);

// "lo 127.0.0.1, eth0 10.0.0.2" (for error messages).
std::string describe_interfaces(const std::vector<NetInterface>& all);

}  // namespace stragg
