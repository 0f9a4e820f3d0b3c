#include <gtest/gtest.h>

#include <dirent.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "runtime/error.h"
#include "runtime/host_identity.h"
#include "transport/shm/shm_transport.h"
#include "test_util.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

// Entries this process created ("stragg-<pid>-..."): other test binaries run in parallel.
int count_stragg_shm_entries() {
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  const std::string mine = "stragg-" + std::to_string(getpid()) + "-";
  while (auto* e = readdir(d)) {
    if (std::strncmp(e->d_name, mine.c_str(), mine.size()) == 0) ++n;
  }
  closedir(d);
  return n;
}

// Collects a message into a vector.
class VectorSink : public RecvSink {
 public:
  void on_header(const MessageHeader& h) override {
    header = h;
    data.assign(h.payload_bytes, 0);
  }
  void on_data(size_t offset, const void* src, size_t len) override {
    ASSERT_LE(offset + len, data.size());
    std::memcpy(data.data() + offset, src, len);
    pieces++;
  }
  MessageHeader header;
  std::vector<uint8_t> data;
  int pieces = 0;
};

void drive(Transport& t, SendOp* s, RecvOp* r) {
  while ((s && !s->done) || (r && !r->done)) {
    uint64_t tok = t.activity_token();
    bool moved = false;
    if (s) moved |= t.progress(*s);
    if (r) moved |= t.progress(*r);
    if (!moved) t.wait_for_activity(tok, std::chrono::milliseconds(50));
  }
}

TEST(ShmTransport, SetupLeavesNothingInDevShm) {
  const int before = count_stragg_shm_entries();
  InMemoryRendezvous rdv;
  std::vector<std::unique_ptr<ShmTransport>> ts(3);
  run_ranks(3, [&](int r) { ts[r] = std::make_unique<ShmTransport>(rdv, "t", r, 3, ShmOptions{}); });
  EXPECT_EQ(count_stragg_shm_entries(), before);
  for (auto& t : ts) EXPECT_STREQ(t->name(), "shm");
}

TEST(ShmTransport, StreamsLargeMessageThroughFewSlotsInFifoOrder) {
  InMemoryRendezvous rdv;
  ShmOptions opt;
  opt.slot_bytes = 4096;
  opt.num_slots = 2;
  const size_t big = 4096 * 37 + 123;
  run_ranks(2, [&](int r) {
    ShmTransport t(rdv, "fifo", r, 2, opt);
    if (r == 0) {
      std::vector<uint8_t> a(big), b(10);
      std::iota(a.begin(), a.end(), 0);
      std::iota(b.begin(), b.end(), 100);
      SendOp s1, s2, s3;
      s1.peer = s2.peer = s3.peer = 1;
      s1.header.payload_bytes = a.size();
      s1.data = a.data();
      s1.header.step = 1;
      s2.header.payload_bytes = 0;  // header-only message
      s2.header.step = 2;
      s3.header.payload_bytes = b.size();
      s3.data = b.data();
      s3.header.step = 3;
      drive(t, &s1, nullptr);
      drive(t, &s2, nullptr);
      drive(t, &s3, nullptr);
    } else {
      VectorSink k1, k2, k3;
      RecvOp r1, r2, r3;
      r1.peer = r2.peer = r3.peer = 0;
      r1.sink = &k1;
      r2.sink = &k2;
      r3.sink = &k3;
      drive(t, nullptr, &r1);
      drive(t, nullptr, &r2);
      drive(t, nullptr, &r3);
      ASSERT_EQ(k1.data.size(), big);
      for (size_t i = 0; i < big; ++i) ASSERT_EQ(k1.data[i], static_cast<uint8_t>(i));
      EXPECT_EQ(k1.pieces, 38);
      EXPECT_EQ(k1.header.step, 1u);
      EXPECT_EQ(k2.header.step, 2u);
      EXPECT_EQ(k2.data.size(), 0u);
      EXPECT_EQ(k3.header.step, 3u);
      ASSERT_EQ(k3.data.size(), 10u);
      EXPECT_EQ(k3.data[9], 109);
    }
  });
}

TEST(ShmTransport, FullDuplexExchangeDoesNotDeadlock) {
  InMemoryRendezvous rdv;
  ShmOptions opt;
  opt.slot_bytes = 4096;
  opt.num_slots = 1;
  const size_t n = 4096 * 20;
  run_ranks(2, [&](int r) {
    ShmTransport t(rdv, "duplex", r, 2, opt);
    std::vector<uint8_t> out(n, static_cast<uint8_t>(r + 1));
    SendOp s;
    s.peer = 1 - r;
    s.data = out.data();
    s.header.payload_bytes = n;
    VectorSink k;
    RecvOp rv;
    rv.peer = 1 - r;
    rv.sink = &k;
    drive(t, &s, &rv);
    ASSERT_EQ(k.data.size(), n);
    EXPECT_EQ(k.data[0], static_cast<uint8_t>(2 - r));
    EXPECT_EQ(k.data[n - 1], static_cast<uint8_t>(2 - r));
  });
}

TEST(ShmTransport, AbortReachesEveryRankWithTheFirstReason) {
  InMemoryRendezvous rdv;
  std::vector<std::unique_ptr<ShmTransport>> ts(3);
  run_ranks(3, [&](int r) { ts[r] = std::make_unique<ShmTransport>(rdv, "abort", r, 3, ShmOptions{}); });
  for (auto& t : ts) EXPECT_FALSE(t->abort_reason().has_value());
  ts[1]->signal_abort("first reason");
  ts[2]->signal_abort("second reason");
  for (auto& t : ts) {
    auto reason = t->abort_reason();
    ASSERT_TRUE(reason.has_value());
    EXPECT_EQ(*reason, "first reason");
  }
}

TEST(ShmTransport, ArrivalTicketsAreVisibleToPeers) {
  InMemoryRendezvous rdv;
  std::vector<std::unique_ptr<ShmTransport>> ts(2);
  run_ranks(2, [&](int r) { ts[r] = std::make_unique<ShmTransport>(rdv, "arr", r, 2, ShmOptions{}); });
  EXPECT_EQ(ts[0]->peer_arrival(1), -1);
  ts[1]->announce_arrival(7);
  EXPECT_EQ(ts[0]->peer_arrival(1), 7);
  EXPECT_TRUE(ts[0]->dead_peers().empty());
}

TEST(ShmTransport, SetupTimesOutNamingTheMissingRank) {
  InMemoryRendezvous rdv;
  ShmOptions opt;
  opt.setup_timeout = std::chrono::milliseconds(300);
  const int before = count_stragg_shm_entries();
  try {
    ShmTransport t(rdv, "missing", 0, 3, opt);
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks [1, 2] did not join"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(count_stragg_shm_entries(), before);
}

TEST(ShmTransport, WaitReturnsWhenTokenIsStale) {
  InMemoryRendezvous rdv;
  std::vector<std::unique_ptr<ShmTransport>> ts(2);
  run_ranks(2, [&](int r) { ts[r] = std::make_unique<ShmTransport>(rdv, "tok", r, 2, ShmOptions{}); });
  uint64_t tok = ts[0]->activity_token();
  ts[1]->signal_abort("wake");  // rings every doorbell
  auto t0 = std::chrono::steady_clock::now();
  ts[0]->wait_for_activity(tok, std::chrono::seconds(5));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TEST(HostIdentity, IncludesNetworkNamespace) {
  auto id = host_identity();
  EXPECT_NE(id.find("/net:"), std::string::npos);
  EXPECT_EQ(id, host_identity());
  EXPECT_FALSE(process_is_dead(getpid()));
}

}  // namespace
}  // namespace stragg
