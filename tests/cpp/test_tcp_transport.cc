// TcpTransport tests: ranks are threads (or, for the killed-process case, a forked child) that
// talk over 127.0.0.1. The checks every transport must pass are in transport_checks.h; this file
// adds what is particular to TCP: setup and identity checks, stream breakage, dead peers.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "plan/planner.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "transport/mixed/peer_stats.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_transport.h"
#include "transport_checks.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;
using testing::eventually;
using testing::FileRendezvous;
using testing::InMemoryRendezvous;
using testing::kLongWait;
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

// Small staging and socket buffers: messages stream through many pieces and partial sends.
TcpOptions small_options() {
  TcpOptions o;
  o.staging_bytes = 4096;
  o.socket_send_buffer = 16 * 1024;
  o.socket_recv_buffer = 16 * 1024;
  o.setup_timeout = std::chrono::seconds(20);
  return o;
}

testing::MakeTransport tcp_maker(const TcpOptions& opt = TcpOptions{}) {
  return [opt](Rendezvous& rdv, int r, int n) {
    return std::make_unique<TcpTransport>(rdv, "tcp", r, n, opt);
  };
}

// A blocking TCP connection to 127.0.0.1:port, or -1.
int connect_loopback(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(s);
    return -1;
  }
  return s;
}

// The port in the record a rank published under `key` ("host|port|nonce").
int published_port(InMemoryRendezvous& rdv, const std::string& key) {
  auto rec = rdv.get(key, std::chrono::seconds(60));
  EXPECT_TRUE(rec.has_value()) << key;
  return rec ? std::stoi(rec->substr(rec->find('|') + 1)) : -1;
}

// ------------------------------------------------------------------------------------------------
// Setup

TEST(TcpTransport, SetupConnectsEveryPairAndLeaksNoFds) {
  const int before = count_open_fds();
  {
    InMemoryRendezvous rdv;
    auto ts = testing::make_group(rdv, 4, tcp_maker());
    for (int r = 0; r < 4; ++r) {
      auto& t = static_cast<TcpTransport&>(*ts[r]);
      EXPECT_STREQ(t.name(), "tcp");
      EXPECT_EQ(t.rank(), r);
      EXPECT_EQ(t.size(), 4);
      EXPECT_EQ(t.listen_address().rfind("127.0.0.1:", 0), 0u) << t.listen_address();
      EXPECT_TRUE(t.dead_peers().empty());
    }
    // 2 connections per pair (data + control), 2 ends each, plus per rank two eventfds (the
    // executor's wake-ups, the heartbeat thread's) and the listener kept for re-dials.
    EXPECT_EQ(count_open_fds(), before + 4 * 3 * 2 + 4 * 3);
  }
  EXPECT_EQ(count_open_fds(), before);
}

TEST(TcpTransport, StatsNameItsStagingAndEveryPeerViaTcp) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, tcp_maker());
  TransportStats stats = ts[0]->stats();
  EXPECT_EQ(stats["tcp_staging_bytes"],
            static_cast<int64_t>(static_cast<TcpTransport&>(*ts[0]).options().staging_bytes));
  EXPECT_EQ(stats["peer_transport.1"], kPeerViaTcp);
  EXPECT_EQ(stats["peer_transport.2"], kPeerViaTcp);
  EXPECT_EQ(stats.count("peer_transport.0"), 0u);
  EXPECT_EQ(stats["shm_peers"], 0);
  EXPECT_EQ(stats["tcp_peers"], 2);
}

TEST(TcpTransport, SingleRankNeedsNoPeers) {
  InMemoryRendezvous rdv;
  TcpTransport t(rdv, "one", 0, 1, TcpOptions{});
  EXPECT_TRUE(t.dead_peers().empty());
  const uint64_t tok = t.activity_token();
  t.wait_for_activity(tok, std::chrono::milliseconds(1));  // nothing to poll but the eventfd
  EXPECT_EQ(t.activity_token(), tok);
  EXPECT_FALSE(t.abort_reason().has_value());
  t.signal_abort("alone");
  EXPECT_EQ(t.abort_reason().value_or(""), "alone");
  EXPECT_NE(t.activity_token(), tok);
}

TEST(TcpTransport, SetupTimesOutNamingTheMissingRanksAndLeaksNoFds) {
  TcpOptions opt;
  opt.setup_timeout = std::chrono::milliseconds(300);
  testing::check_setup_names_ranks_that_never_join(tcp_maker(opt), count_open_fds);
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
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 0: tcp transport setup timed out"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1 did not connect"), std::string::npos) << msg;
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
  const int s = connect_loopback(published_port(rdv, "imp/tcp/0"));
  ASSERT_GE(s, 0);
  char junk[48] = {0};
  ASSERT_EQ(send(s, junk, sizeof junk, MSG_NOSIGNAL), 48);
  rank0.join();
  close(s);
  EXPECT_NE(error.find("rank 1 did not connect"), std::string::npos) << error;
  EXPECT_NE(error.find("not a stragg connection"), std::string::npos) << error;
}

// Strangers reach rank 0's port before rank 1 does: garbage, a well-formed hello of another
// protocol version claiming to be rank 1, and an idle connection. Rank 0 drops the first two,
// sets the mesh up with the real rank 1 (the idle one does not hold it up) and works.
TEST(TcpTransport, StrangersWithGarbageOrAnotherVersionAreDroppedAndSetupSucceeds) {
  InMemoryRendezvous rdv;
  std::vector<std::unique_ptr<TcpTransport>> ts(2);
  std::string error;
  std::thread rank0([&] {
    try {
      ts[0] = std::make_unique<TcpTransport>(rdv, "strays", 0, 2, small_options());
    } catch (const Error& e) {
      error = e.what();
    }
  });
  const int port = published_port(rdv, "strays/tcp/0");
  const int garbage = connect_loopback(port);
  const int version = connect_loopback(port);
  const int idle = connect_loopback(port);
  ASSERT_GE(garbage, 0);
  ASSERT_GE(version, 0);
  ASSERT_GE(idle, 0);
  char junk[64];
  for (size_t i = 0; i < sizeof junk; ++i) junk[i] = static_cast<char>(i * 37 + 11);
  ASSERT_EQ(send(garbage, junk, sizeof junk, MSG_NOSIGNAL), 64);
  tcp::Hello h{};
  h.magic = 0x5354524147475443ull;  // "STRAGGTC"
  h.version = 99;
  h.from = 1;
  h.to = 0;
  h.size = 2;
  ASSERT_EQ(send(version, &h, sizeof h, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof h));
  std::thread rank1(
      [&] { ts[1] = std::make_unique<TcpTransport>(rdv, "strays", 1, 2, small_options()); });
  rank0.join();
  rank1.join();
  ASSERT_EQ(error, "");
  for (int s : {garbage, version, idle}) {
    char c;
    const ssize_t got = recv(s, &c, 1, 0);  // EOF, or a reset when it had unread bytes
    EXPECT_TRUE(got == 0 || (got < 0 && errno == ECONNRESET)) << "a stray was not closed";
    close(s);
  }
  // The port stays open for re-dials; a stranger connecting after setup is dropped too.
  const int late = connect_loopback(port);
  ASSERT_GE(late, 0) << "the port was closed after setup";
  ASSERT_EQ(send(late, junk, sizeof junk, MSG_NOSIGNAL), 64);
  {
    char c;
    const ssize_t got = recv(late, &c, 1, 0);
    EXPECT_TRUE(got == 0 || (got < 0 && errno == ECONNRESET)) << "a late stray was not closed";
    close(late);
  }
  std::vector<uint8_t> data(10000, 7);
  SendOp send_op = testing::make_send(1, data.data(), data.size(), 3);
  testing::Receive rv(0);
  std::thread sender([&] { testing::drive(*ts[0], &send_op, nullptr); });
  testing::drive(*ts[1], nullptr, &rv.op);
  sender.join();
  EXPECT_EQ(rv.sink.data, data);
}

TEST(TcpTransport, AnIdleStrayConnectionDoesNotHoldSetupUp) {
  InMemoryRendezvous rdv;
  std::unique_ptr<TcpTransport> t0;
  std::thread rank0(
      [&] { t0 = std::make_unique<TcpTransport>(rdv, "stray", 0, 2, small_options()); });
  const int s = connect_loopback(published_port(rdv, "stray/tcp/0"));  // and then says nothing
  ASSERT_GE(s, 0);
  TcpTransport t1(rdv, "stray", 1, 2, small_options());
  rank0.join();
  close(s);
  ASSERT_TRUE(t0);
  SendOp send = testing::make_send(0, nullptr, 0, 3);
  testing::drive(t1, &send, nullptr);
  testing::Receive recv(1);
  testing::drive(*t0, nullptr, &recv.op);
  EXPECT_EQ(recv.sink.header.step, 3u);
}

// ------------------------------------------------------------------------------------------------
// Messages and wake-ups

TEST(TcpTransport, StreamsLargeAndEmptyMessagesInFifoOrder) {
  std::vector<int> pieces;
  testing::check_streams_messages_in_fifo_order(tcp_maker(small_options()), 4096, &pieces);
}

TEST(TcpTransport, FullDuplexExchangeDoesNotDeadlock) {
  testing::check_full_duplex_exchange(tcp_maker(small_options()), 16 * 1024 * 1024 + 17);
}

// Paced sends (TCP_NOTSENT_LOWAT = TcpOptions::unsent_bytes on the data sockets): sends still
// finish when the kernel may hold only a few KiB unsent.
TEST(TcpTransport, FullDuplexExchangeWithPacedSends) {
  TcpOptions o;
  o.unsent_bytes = 4096;
  o.setup_timeout = std::chrono::seconds(20);
  testing::check_full_duplex_exchange(
      [o](Rendezvous& rdv, int r, int n) {
        auto t = std::make_unique<TcpTransport>(rdv, "tcp", r, n, o);
        t->set_paced_sends(true);
        return t;
      },
      4 * 1024 * 1024 + 17);
}

TEST(TcpSocket, UnsentLimitIsTheSocketsNotsentLowat) {
  tcp::Fd fd = tcp::make_stream_socket(AF_INET, 0, 0, "test");
  tcp::set_unsent_limit(fd.get(), 12345);
  int v = 0;
  socklen_t len = sizeof v;
  ASSERT_EQ(getsockopt(fd.get(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, &len), 0);
  EXPECT_EQ(v, 12345);
}

// A sink that rejects every message, like the executor on a mismatched collective.
class RejectingSink : public RecvSink {
 public:
  void on_header(const MessageHeader&) override { throw Error("rejected"); }
  void on_data(size_t, const void*, size_t) override { ADD_FAILURE() << "data after rejection"; }
};

TEST(TcpTransport, RejectedMessageLeavesTheStreamUnusable) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 2, tcp_maker());
  std::vector<uint8_t> payload(1000, 1);
  SendOp s = testing::make_send(1, payload.data(), payload.size());
  testing::drive(*ts[0], &s, nullptr);
  RejectingSink bad;
  RecvOp r1;
  r1.peer = 0;
  r1.sink = &bad;
  std::string rejection;
  ASSERT_TRUE(eventually([&] {
    try {
      ts[1]->progress(r1);
    } catch (const Error& e) {
      rejection = e.what();
    }
    return !rejection.empty();
  }));
  EXPECT_EQ(rejection, "rejected");
  testing::Receive r2(0);
  try {
    ts[1]->progress(r2.op);
    FAIL() << "expected the stream to be unusable";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 1: the connection from rank 0 is unusable"), std::string::npos) << msg;
  }
}

TEST(TcpTransport, DataWakesASleepingReceiver) {
  testing::check_data_wakes_a_sleeping_receiver(tcp_maker(), SYS_ppoll);
}

TEST(TcpTransport, WaitReturnsWhenTokenIsStale) {
  testing::check_wait_returns_when_token_is_stale(tcp_maker());
}

// ------------------------------------------------------------------------------------------------
// Faults and diagnostics

TEST(TcpTransport, AbortReachesEveryRankWithTheFirstReason) {
  testing::check_abort_reaches_every_rank_with_the_first_reason(tcp_maker());
}

TEST(TcpTransport, AbortWakesARankBlockedOnAnotherPeer) {
  testing::check_abort_wakes_a_rank_waiting_on_another_peer(tcp_maker(), SYS_ppoll);
}

TEST(TcpTransport, SignalAbortFromAnotherThreadWakesTheWaiter) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 2, tcp_maker());
  const uint64_t tok = ts[0]->activity_token();
  EXPECT_EQ(testing::wake_sleeping_waiter(*ts[0], SYS_ppoll, [&] { ts[0]->signal_abort("stop"); }),
            "");
  EXPECT_EQ(ts[0]->abort_reason().value_or(""), "stop");
  EXPECT_NE(ts[0]->activity_token(), tok);
}

TEST(TcpTransport, ProgressReportsAreVisibleToPeers) {
  testing::check_progress_reports_are_visible_to_peers(tcp_maker());
}

TEST(TcpTransport, ClosedPeerIsReportedDeadWithoutWaiting) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, tcp_maker());
  ts[2].reset();
  // dead_peers() alone finds it: no progress() or wait_for_activity() is needed.
  ASSERT_TRUE(eventually([&] { return ts[0]->dead_peers() == std::vector<int>{2}; }));
  ASSERT_TRUE(eventually([&] { return ts[1]->dead_peers() == std::vector<int>{2}; }));
  // Sending to it fails quietly (no SIGPIPE); the executor learns it from dead_peers().
  std::vector<uint8_t> payload(1 << 20, 1);
  SendOp s = testing::make_send(2, payload.data(), payload.size());
  for (int i = 0; i < 100 && !s.done; ++i) ts[0]->progress(s);
  EXPECT_FALSE(s.done);
  EXPECT_EQ(ts[0]->dead_peers(), std::vector<int>{2});
}

// A peer that closed with bytes still unread here is not dead for the executor (they may be the
// rest of a collective) but is gone for shrink_group's agreement.
TEST(TcpTransport, ClosedPeerWithUnreadBytesIsGoneNotDead) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 3, tcp_maker());
  std::vector<uint8_t> payload(4096, 7);
  SendOp s = testing::make_send(0, payload.data(), payload.size());
  for (int i = 0; i < 1000 && !s.done; ++i) ts[2]->progress(s);
  ASSERT_TRUE(s.done);
  ts[2].reset();
  ASSERT_TRUE(eventually([&] { return ts[0]->gone_peers() == std::vector<int>{2}; }));
  EXPECT_TRUE(ts[0]->dead_peers().empty());
  ASSERT_TRUE(eventually([&] { return ts[1]->gone_peers() == std::vector<int>{2}; }));
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
  testing::check_ring_allreduce(c.size, c.numel, tcp_maker(opt));
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, TcpRingAllreduce,
    ::testing::Values(RingCase{2, 0}, RingCase{2, 1}, RingCase{2, 10001}, RingCase{2, 1 << 20},
                      RingCase{3, 2}, RingCase{3, 7}, RingCase{3, 100003}, RingCase{4, 65536},
                      RingCase{4, 300007}, RingCase{5, 7}, RingCase{5, 40000}, RingCase{5, 250001}),
    [](const ::testing::TestParamInfo<RingCase>& info) {
      return "n" + std::to_string(info.param.size) + "_numel" + std::to_string(info.param.numel);
    });

// StragglAR over TCP, pipelined: the exchanges with the straggler land only what the same
// step's send has read (RecvOp::limit), through staging smaller than a part, so received bytes
// wait in staging and in the socket. Bitwise equal to the staged whole-chunk plan on every rank.
TEST(TcpExecutor, PipelinedStragglarMatchesTheStagedPlanBitwise) {
  const int n = 5;
  const size_t numel = 200003;
  PlannerConfig whole_cfg;
  whole_cfg.algo = Algorithm::Stragglar;
  whole_cfg.straggler = Straggler::of_rank(1);
  PlannerConfig piped_cfg = whole_cfg;
  piped_cfg.pipeline_bytes = 16384;
  Planner whole(n, whole_cfg), piped(n, piped_cfg);
  TcpOptions opt;
  opt.staging_bytes = 4096;
  testing::InMemoryRendezvous rdv;
  std::vector<std::vector<float>> out(n);
  std::vector<std::string> errors(n);
  testing::run_ranks(n, [&](int r) {
    try {
      TcpTransport t(rdv, "piped", r, n, opt);
      ASSERT_TRUE(t.supports_recv_limit());
      Executor ex(t);
      std::mt19937 gen(7 + r);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> buf(numel);
      for (auto& x : buf) x = dist(gen);
      std::vector<float> a = buf, b = buf;
      const PlanChoice choice = whole.choose(numel * sizeof(float), 1);
      const auto plan_a = whole.lower(r, choice, numel, sizeof(float), false);
      const auto plan_b = piped.lower(r, choice, numel, sizeof(float), true);
      ASSERT_GT(plan_b->min_lookahead, 0u) << "not pipelined";
      CollectiveSpec spec;
      spec.numel = numel;
      spec.seq = 0;
      ex.run(*plan_a, spec, a.data(), std::chrono::seconds(60));
      spec.seq = 1;
      ex.run(*plan_b, spec, b.data(), std::chrono::seconds(60));
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), numel * sizeof(float))) << "rank " << r;
      out[r] = b;
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(0, std::memcmp(out[r].data(), out[0].data(), numel * sizeof(float)))
        << "rank " << r << " differs from rank 0";
  }
}

TEST(TcpExecutor, MismatchedNumelRaisesOnEveryRank) {
  testing::check_numel_mismatch_raises_everywhere(3, tcp_maker());
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
      ex.run(*ring_allreduce_schedule(r, n, buf.size()), spec, buf.data(),
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

// The collective timeout is far beyond the test: a rank that raises "has died" learned it from
// the closed connection, not from running out of time.
TEST(TcpExecutor, PeerClosingMidCollectiveMakesTheOthersRaiseNamingIt) {
  InMemoryRendezvous rdv;
  const int n = 3;
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    auto t = std::make_unique<TcpTransport>(rdv, "close", r, n, TcpOptions{});
    if (r == 2) {  // gone once the others started the collective and wait for it
      EXPECT_TRUE(
          eventually([&] { return testing::arrival(*t, 0) == 0 && testing::arrival(*t, 1) == 0; }));
      t.reset();
      return;
    }
    Executor ex(*t);
    std::vector<float> buf(1 << 20, 1.0f);
    CollectiveSpec spec;
    spec.numel = buf.size();
    try {
      ex.run(*ring_allreduce_schedule(r, n, buf.size()), spec, buf.data(), kLongWait);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("2 has died"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

TEST(TcpTransport, ARankMayExitBeforeItsLastMessageIsRead) {
  testing::check_a_rank_may_exit_before_its_last_message_is_read(tcp_maker());
}

// The stopped rank's heartbeats stop: after kSilentAfter the survivors know.
TEST(TcpExecutor, AStoppedRankIsNamedByEverySurvivor) {
  const auto errors = testing::check_a_stopped_rank_is_named_by_every_survivor(tcp_maker());
  EXPECT_NE(errors[1].find("no heartbeat for "), std::string::npos) << errors[1];
}

// Rank 1 is a child process, killed while rank 0 waits for it inside a collective: rank 0
// raises naming it (with a collective timeout far beyond the test, so from the kernel closing
// the dead process's sockets), and the child is gone.
TEST(TcpExecutor, KilledProcessIsReportedDead) {
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
      testing::arrive(t, 0);
      pause();
    } catch (...) {
    }
    _exit(1);
  }
  std::string error;
  {
    FileRendezvous rdv(dir);
    TcpTransport t(rdv, "kill", 0, 2, TcpOptions{});
    Executor ex(t);
    std::vector<float> buf(numel, 1.0f);
    CollectiveSpec spec;
    spec.numel = numel;
    std::thread killer([&] {
      // Both ranks are inside collective #0 (rank 0's own ticket is taken when it starts).
      EXPECT_TRUE(
          eventually([&] { return testing::arrival(t, 0) == 0 && testing::arrival(t, 1) == 0; }));
      kill(child, SIGKILL);
    });
    try {
      ex.run(*ring_allreduce_schedule(0, 2, numel), spec, buf.data(), kLongWait);
    } catch (const Error& e) {
      error = e.what();
    }
    killer.join();
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  std::filesystem::remove_all(dir);
  EXPECT_NE(error.find("rank 1 has died"), std::string::npos) << error;
}

// Throughput, not a correctness test: STRAGG_BENCH=1 ./test_tcp_transport
// --gtest_filter='*Bench*' (optional STRAGG_BENCH_MIB, _RANKS, _STAGING, _SOCKBUF, _RESEND).
TEST(TcpExecutor, BenchRingAllreduce) {
  if (!std::getenv("STRAGG_BENCH")) GTEST_SKIP() << "set STRAGG_BENCH=1 to run";
  auto env = [](const char* name, long dflt) {
    const char* v = std::getenv(name);
    return v ? std::atol(v) : dflt;
  };
  const size_t mib = static_cast<size_t>(env("STRAGG_BENCH_MIB", 64));
  const int n = static_cast<int>(env("STRAGG_BENCH_RANKS", 2));
  TcpOptions opt;
  opt.staging_bytes = static_cast<size_t>(env("STRAGG_BENCH_STAGING", 512 * 1024));
  opt.socket_send_buffer = static_cast<int>(env("STRAGG_BENCH_SOCKBUF", 0));
  opt.socket_recv_buffer = opt.socket_send_buffer;
  opt.resend_bytes = static_cast<size_t>(env("STRAGG_BENCH_RESEND", 4 << 20));
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
      ex.run(*ring_allreduce_schedule(r, n, numel), spec, buf.data(), std::chrono::seconds(120));
      // The first run warms up.
      if (seq > 0) secs[r] += std::chrono::duration<double>(Clock::now() - t0).count() / 3;
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
