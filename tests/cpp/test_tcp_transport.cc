// TcpTransport tests: ranks are threads (or, for the killed-process case, a forked child) that
// talk over 127.0.0.1.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/executor.h"
#include "plan/planner.h"
#include "transport/tcp/tcp_transport.h"
#include "test_util.h"
#include "transport_checks.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;
using testing::InMemoryRendezvous;
using testing::run_ranks;

int count_open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (auto* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TcpOptions small_options() {
  TcpOptions o;
  o.staging_bytes = 4096;
  o.socket_send_buffer = 16 * 1024;
  o.socket_recv_buffer = 16 * 1024;
  o.setup_timeout = std::chrono::seconds(20);
  return o;
}

// Makes `size` connected transports (one per thread, joined before returning).
std::vector<std::unique_ptr<TcpTransport>> make_group(InMemoryRendezvous& rdv,
                                                      const std::string& prefix, int size,
                                                      const TcpOptions& opt = TcpOptions{}) {
  std::vector<std::unique_ptr<TcpTransport>> ts(size);
  run_ranks(size,
            [&](int r) { ts[r] = std::make_unique<TcpTransport>(rdv, prefix, r, size, opt); });
  return ts;
}

// Collects a message into a vector and checks how the transport hands the payload over.
class VectorSink : public RecvSink {
 public:
  void on_header(const MessageHeader& h) override {
    EXPECT_EQ(headers++, 0) << "on_header called twice";
    header = h;
    data.assign(h.payload_bytes, 0);
  }
  void on_data(size_t offset, const void* src, size_t len) override {
    ASSERT_EQ(headers, 1) << "payload before the header";
    ASSERT_EQ(offset, received) << "pieces must be consecutive";
    ASSERT_LE(offset + len, data.size());
    ASSERT_GT(len, 0u);
    if (offset + len < data.size()) {
      EXPECT_EQ(len % 64, 0u) << "a non-final piece splits a 64-byte unit";
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(src) % 64, 0u) << "piece not 64-byte aligned";
    std::memcpy(data.data() + offset, src, len);
    received += len;
    pieces++;
  }
  MessageHeader header;
  std::vector<uint8_t> data;
  size_t received = 0;
  int headers = 0;
  int pieces = 0;
};

// Drives the ops to completion like the executor does; fails the test after `limit`.
void drive(Transport& t, SendOp* s, RecvOp* r,
           std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = Clock::now() + limit;
  while ((s && !s->done) || (r && !r->done)) {
    ASSERT_LT(Clock::now(), deadline) << "ops did not finish";
    const uint64_t tok = t.activity_token();
    bool moved = false;
    if (s) moved |= t.progress(*s);
    if (r) moved |= t.progress(*r);
    if (!moved) t.wait_for_activity(tok, std::chrono::milliseconds(50));
  }
}

// Polls `pred` for up to `limit`.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

// ------------------------------------------------------------------------------------------------
// Setup

TEST(TcpTransport, SetupConnectsEveryPairAndLeaksNoFds) {
  const int before = count_open_fds();
  {
    InMemoryRendezvous rdv;
    auto ts = make_group(rdv, "mesh", 4);
    for (int r = 0; r < 4; ++r) {
      EXPECT_STREQ(ts[r]->name(), "tcp");
      EXPECT_EQ(ts[r]->rank(), r);
      EXPECT_EQ(ts[r]->size(), 4);
      EXPECT_EQ(ts[r]->listen_address().rfind("127.0.0.1:", 0), 0u) << ts[r]->listen_address();
      EXPECT_TRUE(ts[r]->dead_peers().empty());
    }
    // 2 connections per pair (data + control), 2 ends each, plus one eventfd per rank.
    EXPECT_EQ(count_open_fds(), before + 4 * 3 * 2 + 4);
  }
  EXPECT_EQ(count_open_fds(), before);
}

TEST(TcpTransport, SingleRankNeedsNoPeers) {
  InMemoryRendezvous rdv;
  TcpTransport t(rdv, "one", 0, 1, TcpOptions{});
  EXPECT_TRUE(t.dead_peers().empty());
  auto t0 = Clock::now();
  t.wait_for_activity(t.activity_token(), std::chrono::milliseconds(20));
  EXPECT_GE(seconds_since(t0), 0.015);
}

TEST(TcpTransport, SetupTimesOutNamingTheMissingRanks) {
  const int before = count_open_fds();
  InMemoryRendezvous rdv;
  TcpOptions opt;
  opt.setup_timeout = std::chrono::milliseconds(300);
  try {
    TcpTransport t(rdv, "missing", 0, 3, opt);
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks [1, 2] did not join"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(count_open_fds(), before);
}

TEST(TcpTransport, SetupNamesARankThatPublishedButNeverConnects) {
  const int before = count_open_fds();
  InMemoryRendezvous rdv;
  rdv.set("silent/tcp/1", "127.0.0.1|1|12345");  // rank 1 "joined" but will never connect
  TcpOptions opt;
  opt.setup_timeout = std::chrono::milliseconds(400);
  try {
    TcpTransport t(rdv, "silent", 0, 2, opt);
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: tcp transport setup timed out"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 did not connect"), std::string::npos) << e.what();
  }
  EXPECT_EQ(count_open_fds(), before);
}

TEST(TcpTransport, SetupNamesAPeerThatRefusesConnections) {
  // A port nobody listens on: bind, read the port, close.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  const int dead_port = ntohs(a.sin_port);
  close(s);

  const int before = count_open_fds();
  InMemoryRendezvous rdv;
  rdv.set("refuse/tcp/0", "127.0.0.1|" + std::to_string(dead_port) + "|777");
  try {
    TcpTransport t(rdv, "refuse", 1, 2, TcpOptions{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0 at 127.0.0.1:" + std::to_string(dead_port)), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("refused"), std::string::npos) << msg;
  }
  EXPECT_EQ(count_open_fds(), before);
}

TEST(TcpTransport, HandshakeIgnoresAnImpostor) {
  InMemoryRendezvous rdv;
  rdv.set("imp/tcp/1", "127.0.0.1|1|4242");  // rank 1 never comes; an impostor connects instead
  std::string error;
  std::thread rank0([&] {
    TcpOptions opt;
    opt.setup_timeout = std::chrono::milliseconds(1500);
    try {
      TcpTransport t(rdv, "imp", 0, 2, opt);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  auto rec = rdv.get("imp/tcp/0", std::chrono::seconds(5));
  ASSERT_TRUE(rec.has_value());
  const int port = std::stoi(rec->substr(rec->find('|') + 1));
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  char junk[48] = {0};
  ASSERT_EQ(send(s, junk, sizeof junk, MSG_NOSIGNAL), 48);
  rank0.join();
  close(s);
  EXPECT_NE(error.find("rank 1 did not connect"), std::string::npos) << error;
  EXPECT_NE(error.find("not a stragg connection"), std::string::npos) << error;
}

TEST(TcpTransport, AnIdleStrayConnectionDoesNotHoldSetupUp) {
  InMemoryRendezvous rdv;
  std::unique_ptr<TcpTransport> t0;
  std::thread rank0(
      [&] { t0 = std::make_unique<TcpTransport>(rdv, "stray", 0, 2, small_options()); });
  auto rec = rdv.get("stray/tcp/0", std::chrono::seconds(5));
  ASSERT_TRUE(rec.has_value());
  const int port = std::stoi(rec->substr(rec->find('|') + 1));
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);  // and then says nothing
  TcpTransport t1(rdv, "stray", 1, 2, small_options());
  rank0.join();
  close(s);
  ASSERT_TRUE(t0);
  SendOp send;
  send.peer = 0;
  send.header.step = 3;
  drive(t1, &send, nullptr);
  VectorSink sink;
  RecvOp recv;
  recv.peer = 1;
  recv.sink = &sink;
  drive(*t0, nullptr, &recv);
  EXPECT_EQ(sink.header.step, 3u);
}

// ------------------------------------------------------------------------------------------------
// Messages

TEST(TcpTransport, StreamsLargeAndEmptyMessagesInFifoOrder) {
  InMemoryRendezvous rdv;
  const size_t big = 4096 * 37 + 123;
  const size_t huge = 8 * 1024 * 1024 + 5;
  run_ranks(2, [&](int r) {
    TcpTransport t(rdv, "fifo", r, 2, small_options());
    std::vector<uint8_t> a(big), b(10), c(huge);
    std::iota(a.begin(), a.end(), 0);
    std::iota(b.begin(), b.end(), 100);
    for (size_t i = 0; i < huge; ++i) c[i] = static_cast<uint8_t>(i * 7 + 3);
    const std::vector<const std::vector<uint8_t>*> payloads = {&a, nullptr, &b, &c, nullptr};
    if (r == 0) {
      for (size_t k = 0; k < payloads.size(); ++k) {
        SendOp s;
        s.peer = 1;
        s.header.step = static_cast<uint32_t>(k + 1);
        s.header.coll_seq = 42;
        s.header.payload_bytes = payloads[k] ? payloads[k]->size() : 0;
        s.data = payloads[k] ? payloads[k]->data() : nullptr;
        drive(t, &s, nullptr);
      }
    } else {
      for (size_t k = 0; k < payloads.size(); ++k) {
        VectorSink sink;
        RecvOp rv;
        rv.peer = 0;
        rv.sink = &sink;
        drive(t, nullptr, &rv);
        EXPECT_EQ(sink.headers, 1);
        EXPECT_EQ(sink.header.step, k + 1);
        EXPECT_EQ(sink.header.coll_seq, 42u);
        if (payloads[k] == nullptr) {
          EXPECT_EQ(sink.data.size(), 0u);
          EXPECT_EQ(sink.pieces, 0);
          continue;
        }
        ASSERT_EQ(sink.data.size(), payloads[k]->size());
        EXPECT_TRUE(sink.data == *payloads[k]) << "payload " << k << " differs";
        EXPECT_GE(sink.pieces, static_cast<int>((payloads[k]->size() + 4095) / 4096));
      }
    }
  });
}

TEST(TcpTransport, FullDuplexExchangeDoesNotDeadlock) {
  InMemoryRendezvous rdv;
  const size_t n = 16 * 1024 * 1024 + 17;
  run_ranks(2, [&](int r) {
    TcpTransport t(rdv, "duplex", r, 2, small_options());
    std::vector<uint8_t> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * (r + 1));
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
    for (size_t i = 0; i < n; i += 4099) {
      ASSERT_EQ(k.data[i], static_cast<uint8_t>(i * (2 - r))) << "byte " << i;
    }
    EXPECT_EQ(k.data[n - 1], static_cast<uint8_t>((n - 1) * (2 - r)));
  });
}

// A sink that rejects every message, like the executor on a mismatched collective.
class RejectingSink : public RecvSink {
 public:
  void on_header(const MessageHeader&) override { throw Error("rejected"); }
  void on_data(size_t, const void*, size_t) override { ADD_FAILURE() << "data after rejection"; }
};

TEST(TcpTransport, RejectedMessageLeavesTheStreamUnusable) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, "reject", 2);
  std::vector<uint8_t> payload(1000, 1);
  SendOp s;
  s.peer = 1;
  s.data = payload.data();
  s.header.payload_bytes = payload.size();
  drive(*ts[0], &s, nullptr);
  RejectingSink bad;
  RecvOp r1;
  r1.peer = 0;
  r1.sink = &bad;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  bool threw = false;
  while (!threw && Clock::now() < deadline) {
    try {
      ts[1]->progress(r1);
    } catch (const Error& e) {
      threw = true;
      EXPECT_STREQ(e.what(), "rejected");
    }
  }
  ASSERT_TRUE(threw);
  VectorSink good;
  RecvOp r2;
  r2.peer = 0;
  r2.sink = &good;
  try {
    ts[1]->progress(r2);
    FAIL() << "expected the stream to be unusable";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unusable"), std::string::npos) << e.what();
  }
}

TEST(TcpTransport, WaitWakesWhenDataArrives) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, "wake", 2);
  VectorSink sink;
  RecvOp rv;
  rv.peer = 0;
  rv.sink = &sink;
  const uint64_t tok = ts[1]->activity_token();
  EXPECT_FALSE(ts[1]->progress(rv));
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    SendOp s;
    s.peer = 1;
    s.header.step = 9;
    drive(*ts[0], &s, nullptr);
  });
  const auto t0 = Clock::now();
  ts[1]->wait_for_activity(tok, std::chrono::seconds(10));
  EXPECT_LT(seconds_since(t0), 2.0);
  sender.join();
  drive(*ts[1], nullptr, &rv);
  EXPECT_EQ(sink.header.step, 9u);
}

// ------------------------------------------------------------------------------------------------
// Faults and diagnostics

TEST(TcpTransport, AbortReachesEveryRankWithTheFirstReason) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, "abort", 3);
  for (auto& t : ts) EXPECT_FALSE(t->abort_reason().has_value());
  ts[1]->signal_abort("first reason");
  for (auto& t : ts) {
    ASSERT_TRUE(eventually([&] { return t->abort_reason().has_value(); }));
    EXPECT_EQ(*t->abort_reason(), "first reason");
  }
  ts[2]->signal_abort("second reason");  // rank 2 already knows the first reason
  ts[1]->signal_abort("third reason");   // idempotent
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (auto& t : ts) EXPECT_EQ(*t->abort_reason(), "first reason");
}

TEST(TcpTransport, AbortWakesARankBlockedOnAnotherPeer) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, "abortwake", 3);
  // Rank 0 waits for a message from rank 2 that never comes; rank 1 (for which rank 0 has no
  // receive posted) aborts.
  std::atomic<double> noticed_after{-1};
  std::atomic<Clock::time_point> aborted_at{Clock::now()};
  std::thread waiter([&] {
    VectorSink sink;
    RecvOp rv;
    rv.peer = 2;
    rv.sink = &sink;
    const auto give_up = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < give_up) {
      const uint64_t tok = ts[0]->activity_token();
      if (ts[0]->progress(rv)) continue;
      if (ts[0]->abort_reason()) {
        noticed_after = seconds_since(aborted_at.load());
        return;
      }
      ts[0]->wait_for_activity(tok, std::chrono::seconds(10));  // long: only a wake-up helps
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  aborted_at = Clock::now();
  ts[1]->signal_abort("rank 1 gives up");
  waiter.join();
  EXPECT_GE(noticed_after.load(), 0.0);
  EXPECT_LT(noticed_after.load(), 1.0);
  EXPECT_EQ(*ts[0]->abort_reason(), "rank 1 gives up");
}

TEST(TcpTransport, SignalAbortFromAnotherThreadWakesTheWaiter) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, "selfwake", 2);
  const uint64_t tok = ts[0]->activity_token();
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ts[0]->signal_abort("stop");
  });
  const auto t0 = Clock::now();
  ts[0]->wait_for_activity(tok, std::chrono::seconds(10));
  EXPECT_LT(seconds_since(t0), 2.0);
  other.join();
  EXPECT_EQ(*ts[0]->abort_reason(), "stop");
  EXPECT_NE(ts[0]->activity_token(), tok);
}

TEST(TcpTransport, ArrivalTicketsAreVisibleToPeers) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, "arr", 3);
  EXPECT_EQ(ts[0]->peer_arrival(1), -1);
  EXPECT_EQ(ts[0]->peer_arrival(7), -1);
  ts[1]->announce_arrival(7);
  ASSERT_TRUE(eventually([&] { return ts[0]->peer_arrival(1) == 7; }));
  ASSERT_TRUE(eventually([&] { return ts[2]->peer_arrival(1) == 7; }));
  EXPECT_EQ(ts[1]->peer_arrival(1), 7);
  EXPECT_EQ(ts[0]->peer_arrival(2), -1);
  for (uint64_t seq = 8; seq < 2000; ++seq) ts[1]->announce_arrival(seq);
  ASSERT_TRUE(eventually([&] { return ts[0]->peer_arrival(1) == 1999; }));
  EXPECT_TRUE(ts[0]->dead_peers().empty());
}

TEST(TcpTransport, ClosedPeerIsReportedDeadAtOnce) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, "dead", 3);
  ts[2].reset();
  const auto t0 = Clock::now();
  ASSERT_TRUE(eventually([&] { return ts[0]->dead_peers() == std::vector<int>{2}; }));
  EXPECT_LT(seconds_since(t0), 0.5);
  EXPECT_EQ(ts[1]->dead_peers(), std::vector<int>{2});
  // Sending to it fails quietly (no SIGPIPE); the executor learns it from dead_peers().
  std::vector<uint8_t> payload(1 << 20, 1);
  SendOp s;
  s.peer = 2;
  s.data = payload.data();
  s.header.payload_bytes = payload.size();
  for (int i = 0; i < 100 && !s.done; ++i) ts[0]->progress(s);
  EXPECT_FALSE(s.done);
}

// ------------------------------------------------------------------------------------------------
// Ring all_reduce through the executor

struct RingCase {
  int size;
  size_t numel;
};

class TcpRingAllreduce : public ::testing::TestWithParam<RingCase> {};

TEST_P(TcpRingAllreduce, SumMatchesReferenceAndIsBitwiseIdentical) {
  const RingCase c = GetParam();
  TcpOptions opt;
  opt.staging_bytes = 8192;  // small staging: large cases stream through many pieces
  testing::check_ring_allreduce(c.size, c.numel, [&](Rendezvous& rdv, int r, int n) {
    return std::make_unique<TcpTransport>(rdv, "ring", r, n, opt);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, TcpRingAllreduce,
    ::testing::Values(RingCase{2, 0}, RingCase{2, 1}, RingCase{2, 10001}, RingCase{2, 1 << 20},
                      RingCase{3, 2}, RingCase{3, 7}, RingCase{3, 100003}, RingCase{4, 65536},
                      RingCase{4, 300007}, RingCase{5, 7}, RingCase{5, 40000}, RingCase{5, 250001}),
    [](const ::testing::TestParamInfo<RingCase>& info) {
      return "n" + std::to_string(info.param.size) + "_numel" + std::to_string(info.param.numel);
    });

TEST(TcpExecutor, MismatchedNumelRaisesOnEveryRank) {
  testing::check_numel_mismatch_raises_everywhere(3, [](Rendezvous& rdv, int r, int n) {
    return std::make_unique<TcpTransport>(rdv, "mm", r, n, TcpOptions{});
  });
}

TEST(TcpExecutor, TimeoutNamesTheRankThatNeverArrived) {
  InMemoryRendezvous rdv;
  const int n = 3;
  std::vector<std::string> errors(n);
  std::atomic<int> finished{0};
  run_ranks(n, [&](int r) {
    TcpTransport t(rdv, "late", r, n, TcpOptions{});
    if (r == 2) {  // never calls all_reduce; stays alive until the others gave up
      while (finished.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    Executor ex(t);
    std::vector<float> buf(1000, 1.0f);
    CollectiveSpec spec;
    spec.seq = 5;
    spec.numel = buf.size();
    try {
      ex.run(*ring_allreduce_plan(r, n, buf.size()), spec, buf.data(),
             std::chrono::milliseconds(500));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
    finished++;
  });
  // Whoever timed out first names rank 2; the other may instead report that abort.
  const std::string all = errors[0] + " | " + errors[1];
  EXPECT_NE(all.find("rank 2 has not called all_reduce #5"), std::string::npos) << all;
  EXPECT_NE(errors[0], "");
  EXPECT_NE(errors[1], "");
}

TEST(TcpExecutor, PeerClosingMidCollectiveMakesTheOthersRaisePromptly) {
  InMemoryRendezvous rdv;
  const int n = 3;
  std::vector<std::string> errors(n);
  std::vector<double> took(n, -1);
  run_ranks(n, [&](int r) {
    auto t = std::make_unique<TcpTransport>(rdv, "close", r, n, TcpOptions{});
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      t.reset();  // gone mid-collective: the others are already waiting for it
      return;
    }
    Executor ex(*t);
    std::vector<float> buf(1 << 20, 1.0f);
    CollectiveSpec spec;
    spec.numel = buf.size();
    const auto t0 = Clock::now();
    try {
      ex.run(*ring_allreduce_plan(r, n, buf.size()), spec, buf.data(), std::chrono::seconds(60));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
    took[r] = seconds_since(t0);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("2 has died"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_LT(took[r], 2.0) << "rank " << r;
  }
}

// A rendezvous in a directory, for ranks in different processes.
class FileRendezvous : public Rendezvous {
 public:
  explicit FileRendezvous(std::string dir) : dir_(std::move(dir)) {}
  void set(const std::string& key, const std::string& value) override {
    const std::string tmp = path(key) + ".tmp" + std::to_string(getpid());
    { std::ofstream(tmp) << value; }
    std::rename(tmp.c_str(), path(key).c_str());
  }
  std::optional<std::string> get(const std::string& key,
                                 std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    while (!check(key)) {
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::ifstream in(path(key));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bool check(const std::string& key) override {
    struct stat st;
    return ::stat(path(key).c_str(), &st) == 0;
  }

 private:
  std::string path(const std::string& key) const {
    std::string k = key;
    for (char& ch : k) ch = ch == '/' ? '_' : ch;
    return dir_ + "/" + k;
  }
  std::string dir_;
};

TEST(TcpExecutor, KilledProcessIsDetectedWithinMilliseconds) {
  char dir_template[] = "/tmp/stragg-tcp-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const size_t numel = 1 << 20;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: joins, then hangs inside its "collective" until killed
    try {
      FileRendezvous rdv(dir);
      TcpTransport t(rdv, "kill", 1, 2, TcpOptions{});
      t.announce_arrival(0);
      pause();
    } catch (...) {
    }
    _exit(1);
  }
  std::string error;
  double detect_s = -1;
  {
    FileRendezvous rdv(dir);
    TcpTransport t(rdv, "kill", 0, 2, TcpOptions{});
    Executor ex(t);
    std::vector<float> buf(numel, 1.0f);
    CollectiveSpec spec;
    spec.numel = numel;
    std::atomic<int64_t> killed_at_ns{0};
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      killed_at_ns = Clock::now().time_since_epoch().count();
      kill(child, SIGKILL);
    });
    try {
      ex.run(*ring_allreduce_plan(0, 2, numel), spec, buf.data(), std::chrono::seconds(60));
    } catch (const Error& e) {
      error = e.what();
      detect_s = (Clock::now().time_since_epoch().count() - killed_at_ns.load()) / 1e9;
    }
    killer.join();
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  std::system(("rm -rf " + dir).c_str());
  EXPECT_NE(error.find("rank 1 has died"), std::string::npos) << error;
  EXPECT_GE(detect_s, 0.0);
  EXPECT_LT(detect_s, 0.5) << "detection took " << detect_s << " s";
}

// Throughput check, not a correctness test: STRAGG_TCP_BENCH=1 ./test_tcp_transport
// --gtest_filter='*Bench*' (optional STRAGG_TCP_BENCH_MIB, _RANKS, _STAGING, _SOCKBUF).
TEST(TcpExecutor, BenchRingAllreduce) {
  if (!std::getenv("STRAGG_TCP_BENCH")) GTEST_SKIP() << "set STRAGG_TCP_BENCH=1 to run";
  auto env = [](const char* name, long dflt) {
    const char* v = std::getenv(name);
    return v ? std::atol(v) : dflt;
  };
  const size_t mib = static_cast<size_t>(env("STRAGG_TCP_BENCH_MIB", 64));
  const int n = static_cast<int>(env("STRAGG_TCP_BENCH_RANKS", 2));
  TcpOptions opt;
  opt.staging_bytes = static_cast<size_t>(env("STRAGG_TCP_BENCH_STAGING", 512 * 1024));
  opt.socket_send_buffer = static_cast<int>(env("STRAGG_TCP_BENCH_SOCKBUF", 0));
  opt.socket_recv_buffer = opt.socket_send_buffer;
  const size_t numel = mib * 1024 * 1024 / sizeof(float);
  InMemoryRendezvous rdv;
  std::vector<double> secs(n);
  run_ranks(n, [&](int r) {
    TcpTransport t(rdv, "bench", r, n, opt);
    Executor ex(t);
    std::vector<float> buf(numel, 1.0f);
    for (uint64_t seq = 0; seq < 4; ++seq) {
      CollectiveSpec spec;
      spec.seq = seq;
      spec.numel = numel;
      const auto t0 = Clock::now();
      ex.run(*ring_allreduce_plan(r, n, numel), spec, buf.data(), std::chrono::seconds(120));
      if (seq > 0) secs[r] += seconds_since(t0) / 3;  // the first run warms up
    }
  });
  const double bytes = static_cast<double>(numel * sizeof(float));
  std::printf(
      "tcp ring all_reduce: %d ranks, %zu MiB: %.1f ms per call, algbw %.2f GB/s, "
      "busbw %.2f GB/s\n",
      n, mib, secs[0] * 1e3, bytes / secs[0] / 1e9, bytes * 2.0 * (n - 1) / n / secs[0] / 1e9);
}

}  // namespace
}  // namespace stragg
