// The settings table and its one parser.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/error.h"
#include "common/interfaces.h"
#include "plan/settings.h"

namespace stragg {
namespace {

Settings parse(const std::string& key, const std::string& raw) {
  return parse_settings({{key, raw, "STRAGG_TEST"}});
}

std::string error_of(const std::string& key, const std::string& raw) {
  try {
    parse(key, raw);
  } catch (const SettingsError& e) {
    return e.what();
  }
  return "";
}

TEST(Settings, DefaultsRoundTripThroughTheTable) {
  const Settings d;
  std::set<std::string> keys, envs;
  for (const SettingInfo& info : settings_table()) {
    EXPECT_TRUE(keys.insert(info.key).second) << info.key;
    EXPECT_TRUE(envs.insert(info.env).second) << info.env;
    EXPECT_EQ(info.env.rfind("STRAGG_", 0), 0u) << info.env;
    EXPECT_FALSE(info.meaning.empty()) << info.key;
    // The documented default is what an empty value gives, and what the struct holds.
    EXPECT_EQ(setting_text(parse(info.key, info.default_text), info.key), setting_text(d, info.key))
        << info.key;
    EXPECT_EQ(setting_text(parse(info.key, ""), info.key), setting_text(d, info.key)) << info.key;
  }
}

TEST(Settings, TypedValues) {
  EXPECT_EQ(parse("algo", " RHD ").algo, Algorithm::Rhd);
  EXPECT_EQ(parse("transport", "tcp").transport, TransportChoice::Tcp);
  EXPECT_EQ(parse("straggler", "3").straggler, Straggler::of_rank(3));
  EXPECT_EQ(parse("straggler", "dynamic").straggler, Straggler::dynamic());
  EXPECT_EQ(parse("straggler", "none").straggler, Straggler::none());
  EXPECT_EQ(parse("straggler", "auto").straggler, Straggler::profiled());
  EXPECT_EQ(parse("dynamic_window_us", "250").dynamic_window_us, 250);
  EXPECT_EQ(parse("dynamic_window_us", "auto").dynamic_window_us, -1);
  EXPECT_EQ(parse("shm_slot_bytes", "1MiB").shm_slot_bytes, size_t{1} << 20);
  EXPECT_EQ(parse("profile", "off").profile, false);
  EXPECT_EQ(parse("debug", "DETAIL").debug, DebugLevel::Detail);
  const Settings s = parse("slowdown", "3=2, 1=1.5");
  ASSERT_EQ(s.slowdowns.size(), 2u);
  EXPECT_EQ(s.slowdowns[0], (Slowdown{1, 1.5}));
  EXPECT_EQ(s.slowdowns[1], (Slowdown{3, 2.0}));
  EXPECT_EQ(setting_text(s, "slowdown"), "1=1.5,3=2");
  EXPECT_DOUBLE_EQ(parse("alpha_us", "10").link_model().alpha_s, 10e-6);
  EXPECT_DOUBLE_EQ(parse("bandwidth_gbps", "2").link_model().beta_s_per_byte, 0.5e-9);
}

TEST(Settings, InitialLinkModelAssumesANetworkOverTcpUnlessTheUserSetOne) {
  const Settings defaults = parse_settings({});
  EXPECT_DOUBLE_EQ(defaults.initial_link_model(false).beta_s_per_byte,
                   1.0 / kDefaultBandwidthBytesPerS);
  EXPECT_DOUBLE_EQ(defaults.initial_link_model(true).beta_s_per_byte,
                   1.0 / kNetworkBandwidthBytesPerS);
  EXPECT_DOUBLE_EQ(defaults.initial_link_model(true).alpha_s, kDefaultAlphaS);
  // Either value set: the user's model, over TCP too.
  EXPECT_DOUBLE_EQ(parse("bandwidth_gbps", "2").initial_link_model(true).beta_s_per_byte, 0.5e-9);
  EXPECT_DOUBLE_EQ(parse("alpha_us", "10").initial_link_model(true).beta_s_per_byte,
                   1.0 / kDefaultBandwidthBytesPerS);
}

TEST(Settings, ErrorsNameTheSourceTheValueAndWhatIsAccepted) {
  const std::string e = error_of("shm_slots", "0");
  EXPECT_NE(e.find("STRAGG_TEST='0'"), std::string::npos) << e;
  EXPECT_NE(e.find("an integer from 1 to 1024"), std::string::npos) << e;
  EXPECT_NE(error_of("algo", "fastest").find("one of auto, ring, rhd"), std::string::npos);
  EXPECT_NE(error_of("straggler", "-1").find("a rank of the group"), std::string::npos);
  EXPECT_NE(error_of("slowdown", "3=0.5").find("L >= 1"), std::string::npos);
  EXPECT_NE(error_of("slowdown", "3=2,3=3").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("bandwidth_gbps", "0").find("a number > 0"), std::string::npos);
  EXPECT_NE(error_of("profile", "maybe").find("1/0"), std::string::npos);
  EXPECT_NE(error_of("tcp_port", "70000").find("0 to 65535"), std::string::npos);
  EXPECT_NE(error_of("nonsense", "1").find("unknown setting 'nonsense'"), std::string::npos);
  EXPECT_NO_THROW(parse_settings({{"profile_adopt", "0.4", "STRAGG_PROFILE_ADOPT"}}));
  const std::string cross = [] {
    try {
      parse_settings({{"profile_adopt", "0.2", "STRAGG_PROFILE_ADOPT"}});
    } catch (const SettingsError& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(cross.find("STRAGG_PROFILE_DROP=0.3 (default) must not exceed STRAGG_PROFILE_ADOPT=0.2"),
            std::string::npos)
      << cross;
}

TEST(SocketIfname, NcclSyntaxPrefixesExactNamesAndExclusions) {
  const std::vector<NetInterface> all = {
      {"lo", "127.0.0.1", true}, {"eth0", "10.0.0.2", false}, {"eth1", "10.0.1.2", false},
      {"ib0", "10.1.0.2", false}, {"docker0", "172.17.0.1", false}};
  auto names = [&](const std::string& spec) {
    std::string out;
    for (const NetInterface& i : select_interfaces(parse_interface_spec(spec), all)) {
      out += (out.empty() ? "" : ",") + i.name;
    }
    return out;
  };
  EXPECT_EQ(names("eth"), "eth0,eth1");          // a prefix
  EXPECT_EQ(names("eth1,eth"), "eth1,eth0");     // in the list's order, each once
  EXPECT_EQ(names("=eth"), "");                  // exact names only
  EXPECT_EQ(names("=eth1, ib0"), "eth1,ib0");
  EXPECT_EQ(names("^docker,eth"), "ib0,lo");     // excluded; loopback last
  EXPECT_EQ(names("^=eth0"), "eth1,ib0,docker0,lo");
  EXPECT_EQ(names("wlan"), "");
  EXPECT_TRUE(parse_interface_spec("  ").empty());
  for (const char* bad : {"eth0,,eth1", "^", "=", "eth0,", "^=,x"}) {
    EXPECT_THROW(parse_interface_spec(bad), Error) << bad;
  }
  EXPECT_EQ(describe_interfaces(all).substr(0, 27), "lo 127.0.0.1, eth0 10.0.0.2");
}

TEST(SocketIfname, ThisHostListsLoopbackAndTheSettingValidates) {
  const std::vector<NetInterface> here = local_interfaces();
  const auto lo = select_interfaces(parse_interface_spec("=lo"), here);
  ASSERT_EQ(lo.size(), 1u) << describe_interfaces(here);
  EXPECT_EQ(lo[0].address, "127.0.0.1");
  EXPECT_TRUE(lo[0].loopback);
  EXPECT_EQ(parse("socket_ifname", "^docker,lo").socket_ifname, "^docker,lo");
  EXPECT_EQ(parse("socket_ifname", " ").socket_ifname, "");
  EXPECT_NE(error_of("socket_ifname", "eth0,,eth1").find("STRAGG_TEST='eth0,,eth1' is not accepted"),
            std::string::npos);
}

TEST(Settings, OneSizeParser) {
  EXPECT_EQ(parse_size("4096", "x"), 4096u);
  EXPECT_EQ(parse_size("512KiB", "x"), 512u * 1024);
  EXPECT_EQ(parse_size(" 1 mib", "x"), size_t{1} << 20);
  EXPECT_EQ(parse_size("2GiB", "x"), size_t{2} << 30);
  EXPECT_EQ(parse_size("1MB", "x"), 1000000u);
  EXPECT_EQ(parse_size("3kb", "x"), 3000u);
  EXPECT_EQ(parse_size("7B", "x"), 7u);
  for (const char* bad : {"1M", "1K", "-1", "1.5MiB", "MiB", "", "1 TiB"}) {
    EXPECT_THROW(parse_size(bad, "x"), SettingsError) << bad;
  }
  try {
    parse_size("1M", "STRAGG_SHM_SLOT_BYTES");
  } catch (const SettingsError& e) {
    EXPECT_NE(std::string(e.what()).find("'m' is ambiguous"), std::string::npos) << e.what();
  }
  EXPECT_EQ(format_size(512 * 1024), "512KiB");
  EXPECT_EQ(format_size(1000), "1000");
  EXPECT_EQ(format_size(size_t{3} << 20), "3MiB");
}

TEST(Settings, MustMatchValuesCoverThePlanAndTheProfiler) {
  std::set<std::string> keys;
  for (const auto& [k, v] : must_match_values(Settings{})) keys.insert(k);
  for (const char* k : {"transport", "algo", "straggler", "alpha_us", "bandwidth_gbps",
                        "shm_slot_bytes", "profile_every", "probe_every", "slowdown"}) {
    EXPECT_TRUE(keys.count(k)) << k;
  }
  EXPECT_FALSE(keys.count("tcp_port"));
  EXPECT_FALSE(keys.count("debug"));
}

}  // namespace
}  // namespace stragg
