#include "common/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <map>

#include "common/error.h"

namespace stragg {

InterfaceSpec parse_interface_spec(const std::string& text) {
  InterfaceSpec spec;
  std::string rest = text;
  auto trim = [](std::string s) {
    const char* ws = " \t\r\n";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string::npos) return std::string();
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
  };
  rest = trim(rest);
  if (rest.empty()) return spec;
  if (rest[0] == '^') spec.exclude = true, rest.erase(0, 1);
  if (!rest.empty() && rest[0] == '=') spec.exact = true, rest.erase(0, 1);
  size_t start = 0;
  while (true) {
    const size_t comma = rest.find(',', start);
    const std::string name = trim(rest.substr(start, comma == std::string::npos ? std::string::npos
                                                                                 : comma - start));
    if (name.empty()) {
      throw Error("stragg: the interface list '" + text +
                  "' has an empty name (expected e.g. 'eth0', 'eth', '=eth0,eth1' or '^docker,lo')");
    }
    spec.names.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return spec;
}

namespace {

bool name_matches(const InterfaceSpec& spec, const std::string& element, const std::string& name) {
  return spec.exact ? name == element : name.compare(0, element.size(), element) == 0;
}

}  // namespace

bool interface_matches(const InterfaceSpec& spec, const std::string& name) {
  bool any = false;
  for (const std::string& e : spec.names) any = any || name_matches(spec, e, name);
  return spec.exclude ? !any : any;
}

std::vector<NetInterface> local_interfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw Error("stragg: getifaddrs() failed: cannot list interfaces");
  // Per name, in the order the system lists them: the first IPv4 address, else the first
  // global IPv6 one (link-local addresses need a scope no peer could use).
  std::vector<std::string> order;
  std::map<std::string, NetInterface> v4, v6;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || !(a->ifa_flags & IFF_UP)) continue;
    const std::string name = a->ifa_name;
    char text[INET6_ADDRSTRLEN] = {};
    NetInterface nic{name, "", (a->ifa_flags & IFF_LOOPBACK) != 0};
    if (a->ifa_addr->sa_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
      nic.address = text;
      if (!v4.count(name)) v4[name] = nic;
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;
      if (inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text)) == nullptr) continue;
      nic.address = text;
      if (!v6.count(name)) v6[name] = nic;
    } else {
      continue;
    }
    if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
  }
  freeifaddrs(list);
  std::vector<NetInterface> out;
  for (const std::string& name : order) out.push_back(v4.count(name) ? v4[name] : v6[name]);
  return out;
}

std::vector<NetInterface> select_interfaces(const InterfaceSpec& spec,
                                            const std::vector<NetInterface>& all) {
  std::vector<NetInterface> out;
  if (spec.exclude) {
    for (bool loop : {false, true}) {
      for (const NetInterface& i : all) {
        if (i.loopback == loop && interface_matches(spec, i.name)) out.push_back(i);
      }
    }
    return out;
  }
  for (const std::string& e : spec.names) {
    for (const NetInterface& i : all) {
      const bool taken = std::any_of(out.begin(), out.end(),
                                     [&](const NetInterface& o) { return o.name == i.name; });
      if (!taken && name_matches(spec, e, i.name)) out.push_back(i);
    }
  }
  return out;
}

std::string describe_interfaces(const std::vector<NetInterface>& all) {
  if (all.empty()) return "none with an address";
  std::string out;
  for (const NetInterface& i : all) out += (out.empty() ? "" : ", ") + i.name + " " + i.address;
  return out;
}

}  // namespace stragg
