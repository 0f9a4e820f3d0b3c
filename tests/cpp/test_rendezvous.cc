// exchange_all over a scripted store: timeouts name only the ranks really missing (never the
// rank itself), a failing store raises at once naming it, late records are taken.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>
#include <string>

#include "common/error.h"
#include "common/rendezvous.h"

namespace stragg {
namespace {

using std::chrono::milliseconds;

// Keys present from the start; get() of a missing key times out at once, or fails like a store
// whose host went away once `fail` is set. check() may be made to deny keys that exist (what a
// store error used to look like), and a key may appear only after the first get() timed out.
class ScriptedStore : public Rendezvous {
 public:
  void set(const std::string& key, const std::string& value) override { kv[key] = value; }
  std::optional<std::string> get(const std::string& key, milliseconds) override {
    if (fail) throw StoreError("lost the TCPStore at 10.0.0.1:29500: Connection reset by peer");
    ++gets;
    if (!kv.count(key)) {
      for (auto& [k, v] : appear_after_timeout) kv[k] = v;
      appear_after_timeout.clear();
      return std::nullopt;
    }
    return kv[key];
  }
  bool check(const std::string& key) override {
    if (fail) throw StoreError("lost the TCPStore at 10.0.0.1:29500: Broken pipe");
    return kv.count(key) && !deny.count(key);
  }
  std::string describe() const override { return "the TCPStore at 10.0.0.1:29500"; }
  bool hosted_by_rank0() const override { return rank0_hosts; }

  std::map<std::string, std::string> kv;
  std::map<std::string, std::string> appear_after_timeout;
  std::set<std::string> deny;
  bool fail = false;
  bool rank0_hosts = false;
  int gets = 0;
};

std::string timeout_message(ScriptedStore& s, int rank, int size) {
  try {
    exchange_all(s, "hello", rank, size, "mine", milliseconds(5), "process group setup");
  } catch (const TimeoutError& e) {
    return e.what();
  }
  return "no timeout";
}

TEST(ExchangeAll, TimeoutNamesOnlyTheMissingRanksNeverItself) {
  ScriptedStore s;
  s.kv = {{"hello/0", "a"}, {"hello/2", "c"}};
  s.deny = {"hello/1"};  // this rank's own key, as a flaky check() would report it
  EXPECT_EQ(timeout_message(s, 1, 4),
            "stragg: rank 1: process group setup timed out after 0.005 s: rank 3 did not join");
  ScriptedStore t;
  t.kv = {{"hello/1", "b"}};
  EXPECT_EQ(timeout_message(t, 2, 4),
            "stragg: rank 2: process group setup timed out after 0.005 s: ranks [0, 3] did not "
            "join");
}

TEST(ExchangeAll, RecordsThatArriveAsTheTimeRunsOutAreTaken) {
  ScriptedStore s;
  s.kv = {{"hello/1", "b"}};
  s.appear_after_timeout = {{"hello/0", "a"}, {"hello/2", "c"}};
  const auto v = exchange_all(s, "hello", 1, 3, "b", milliseconds(5), "setup");
  EXPECT_EQ(v, (std::vector<std::string>{"a", "b", "c"}));
}

TEST(ExchangeAll, AFailingStoreRaisesAtOnceNamingItAndTheError) {
  ScriptedStore s;
  s.kv = {{"hello/0", "a"}};
  s.fail = true;
  try {
    exchange_all(s, "hello", 1, 3, "b", std::chrono::minutes(5), "process group setup");
    FAIL() << "expected a StoreError";
  } catch (const TimeoutError& e) {
    FAIL() << "a store error reported as a timeout: " << e.what();
  } catch (const StoreError& e) {
    EXPECT_EQ(std::string(e.what()),
              "stragg: rank 1: process group setup: lost the TCPStore at 10.0.0.1:29500: "
              "Connection reset by peer (while waiting for rank 0)");
  }
}

TEST(ExchangeAll, WhenRank0HostsTheStoreOnlyTheAbsentProcessIsNamed) {
  // Rank 0 waits in torch's TCPStore for the process that never connected: it is missing from
  // stragg's setup too, but only the absent process is named, with why rank 0 is not.
  ScriptedStore s;
  s.rank0_hosts = true;
  s.kv = {{"hello/1", "b"}, {"hello/2", "c"}};
  EXPECT_EQ(timeout_message(s, 1, 4),
            "stragg: rank 1: process group setup timed out after 0.005 s: rank 3 did not join "
            "(rank 0 hosts the TCPStore at 10.0.0.1:29500 and enters stragg's setup only after "
            "all 4 processes connected to it, so it waits for that one in torch's TCPStore, "
            "which raises 'N/4 clients joined' there: the process that never started is rank 3)");
  ScriptedStore two;
  two.rank0_hosts = true;
  two.kv = {{"hello/1", "b"}};
  const std::string m = timeout_message(two, 1, 4);
  EXPECT_EQ(m.find("stragg: rank 1: process group setup timed out after 0.005 s: ranks [2, 3] "
                   "did not join (rank 0 hosts"),
            0u)
      << m;
  EXPECT_NE(m.find("the process that never started is among ranks [2, 3])"), std::string::npos)
      << m;
  // Every other rank joined: rank 0 itself is late (its TCPStore wait is over), and named.
  ScriptedStore late0;
  late0.rank0_hosts = true;
  late0.kv = {{"hello/1", "b"}, {"hello/2", "c"}, {"hello/3", "d"}};
  EXPECT_EQ(timeout_message(late0, 1, 4),
            "stragg: rank 1: process group setup timed out after 0.005 s: rank 0 did not join");
  // Rank 0 joined an earlier exchange of this setup: it is past torch's TCPStore wait, and a
  // later exchange that misses it names it.
  ScriptedStore after;
  after.rank0_hosts = true;
  after.kv = {{"first/0", "a"}, {"first/2", "c"}, {"first/3", "d"}, {"hello/2", "c"}};
  exchange_all(after, "first", 1, 4, "b", milliseconds(5), "shm transport setup");
  EXPECT_EQ(timeout_message(after, 1, 4),
            "stragg: rank 1: process group setup timed out after 0.005 s: ranks [0, 3] did not "
            "join");
  // Not hosted by rank 0 (torchrun's agent store, a store of its own): every absent rank named.
  ScriptedStore agent;
  agent.kv = {{"hello/1", "b"}, {"hello/2", "c"}};
  EXPECT_EQ(timeout_message(agent, 1, 4),
            "stragg: rank 1: process group setup timed out after 0.005 s: ranks [0, 3] did not "
            "join");
  s.fail = true;
  try {
    exchange_all(s, "hello", 2, 4, "c", milliseconds(5), "process group setup");
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("; rank 0 hosts it: see rank 0's error"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace stragg
