// TcpTransport across connection resets: a connection broken while both ranks live is re-dialed
// and its stream resumed (csrc/transport/tcp/resume.h, data_connection.h). Ranks are threads over
// 127.0.0.1; TcpTransport::reset_connections() breaks a connection the way a reset does (the
// peer gets a RST, this side ECONNRESET), from either end, while messages stream through. Every
// byte must arrive exactly once and in order; a peer whose re-dial is refused is dead; the
// retransmit buffer stays within its bound. No check measures time.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "transport/tcp/resend_buffer.h"
#include "transport/tcp/tcp_transport.h"
#include "transport_checks.h"

namespace stragg {
namespace {

using testing::eventually;
using testing::InMemoryRendezvous;
using testing::run_ranks;

// Small staging, socket and retransmit buffers: messages stream through many pieces, sends wait
// for acks, the ring wraps.
TcpOptions tight_options() {
  TcpOptions o;
  o.staging_bytes = 4096;
  o.socket_send_buffer = 16 * 1024;
  o.socket_recv_buffer = 16 * 1024;
  o.resend_bytes = 64 * 1024;
  o.setup_timeout = std::chrono::seconds(20);
  o.redial_backoff_max = std::chrono::milliseconds(100);
  return o;
}

testing::MakeTransport tcp_maker(const TcpOptions& opt) {
  return [opt](Rendezvous& rdv, int r, int n) {
    return std::make_unique<TcpTransport>(rdv, "resume", r, n, opt);
  };
}

TcpTransport& tcp_of(std::unique_ptr<Transport>& t) { return static_cast<TcpTransport&>(*t); }

int64_t stat(const Transport& t, const std::string& key) {
  const TransportStats s = t.stats();
  auto it = s.find(key);
  return it == s.end() ? -1 : it->second;
}

uint8_t pattern(int from, size_t msg, size_t i) {
  return static_cast<uint8_t>((i * 131 + msg * 7 + static_cast<size_t>(from) * 29) ^ (i >> 9));
}

// Message sizes: small, empty, large, odd, in a mix.
std::vector<size_t> message_sizes(size_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<size_t> out;
  const size_t choices[] = {0, 1, 100, 4096, 65 * 1024 + 3, 1 << 20, (3 << 20) + 17};
  for (size_t i = 0; i < count; ++i) out.push_back(choices[gen() % 7]);
  return out;
}

// Both ranks send `sizes` to each other (full duplex) while `breaker` runs; each checks every
// message it received, byte for byte and in order. Returns the errors ("" each if fine).
std::vector<std::string> exchange_under(std::vector<std::unique_ptr<Transport>>& ts,
                                        const std::vector<size_t>& sizes,
                                        const std::function<void(std::atomic<bool>&)>& breaker) {
  std::vector<std::string> errors(2);
  std::atomic<bool> done{false};
  std::thread chaos([&] { breaker(done); });
  run_ranks(2, [&](int r) {
    const int peer = 1 - r;
    Transport& t = *ts[r];
    size_t next_send = 0, next_recv = 0;
    std::vector<uint8_t> out;
    SendOp send;
    std::unique_ptr<testing::Receive> rv;
    const auto deadline = std::chrono::steady_clock::now() + testing::kHangGuard * 2;
    auto start_send = [&] {
      out.resize(sizes[next_send]);
      for (size_t i = 0; i < out.size(); ++i) out[i] = pattern(r, next_send, i);
      send = testing::make_send(peer, out.data(), out.size(), static_cast<uint32_t>(next_send));
    };
    if (!sizes.empty()) {
      start_send();
      rv = std::make_unique<testing::Receive>(peer);
    }
    try {
      while (next_send < sizes.size() || next_recv < sizes.size()) {
        if (std::chrono::steady_clock::now() > deadline) {
          errors[r] = "hang: sent " + std::to_string(next_send) + ", received " +
                      std::to_string(next_recv) + " of " + std::to_string(sizes.size());
          break;
        }
        const uint64_t tok = t.activity_token();
        bool moved = false;
        if (next_send < sizes.size()) {
          moved |= t.progress(send);
          if (send.done && ++next_send < sizes.size()) start_send();
        }
        if (next_recv < sizes.size()) {
          moved |= t.progress(rv->op);
          if (rv->op.done) {
            const auto& got = rv->sink.data;
            if (rv->sink.header.step != next_recv || got.size() != sizes[next_recv]) {
              errors[r] = "message " + std::to_string(next_recv) + ": got step " +
                          std::to_string(rv->sink.header.step) + ", " +
                          std::to_string(got.size()) + " bytes";
              break;
            }
            for (size_t i = 0; i < got.size(); ++i) {
              if (got[i] != pattern(peer, next_recv, i)) {
                errors[r] = "message " + std::to_string(next_recv) + " byte " +
                            std::to_string(i) + " differs";
                break;
              }
            }
            if (!errors[r].empty()) break;
            if (++next_recv < sizes.size()) rv = std::make_unique<testing::Receive>(peer);
          }
        }
        if (!t.dead_peers().empty()) {
          errors[r] = "peer counted dead";
          break;
        }
        if (!moved) t.wait_for_activity(tok, std::chrono::milliseconds(20));
      }
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  done = true;
  chaos.join();
  return errors;
}

// ------------------------------------------------------------------------------------------------
// The retransmit buffer

TEST(ResendBuffer, KeepsWhatIsNotAcknowledgedAcrossTheWrap) {
  tcp::ResendBuffer b(10);
  const uint8_t data[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  b.append(data, 8);
  EXPECT_EQ(b.room(), 2u);
  EXPECT_TRUE(b.release(6));
  b.append(data + 8, 8);  // wraps; room was 8
  EXPECT_EQ(b.begin(), 6u);
  EXPECT_EQ(b.end(), 16u);
  EXPECT_EQ(b.room(), 0u);
  b.append(data, 1);  // no room: nothing taken
  EXPECT_EQ(b.end(), 16u);
  const uint8_t* p[2];
  size_t len[2];
  const int n = b.pieces(7, p, len);
  std::vector<uint8_t> got;
  for (int i = 0; i < n; ++i) got.insert(got.end(), p[i], p[i] + len[i]);
  EXPECT_EQ(got, std::vector<uint8_t>(data + 7, data + 16));
  EXPECT_EQ(b.pieces(16, p, len), 0);
  EXPECT_FALSE(b.release(17));  // past the end
  EXPECT_TRUE(b.release(3));    // before begin: no-op
  EXPECT_EQ(b.begin(), 6u);
}

// ------------------------------------------------------------------------------------------------
// Resets mid-transfer

// Resets from both ends, during large and small messages, in both directions, many times.
TEST(TcpResume, RepeatedResetsFromEitherEndLoseAndRepeatNoByte) {
  InMemoryRendezvous rdv;
  auto ts = testing::make_group(rdv, 2, tcp_maker(tight_options()));
  const auto sizes = message_sizes(60, 11);
  std::atomic<int> resets{0};
  const auto errors = exchange_under(ts, sizes, [&](std::atomic<bool>& done) {
    std::mt19937 gen(5);
    while (!done && resets < 40) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2 + gen() % 6));
      const int side = static_cast<int>(gen() % 2);
      const int what = static_cast<int>(gen() % 3);  // data, control, both
      tcp_of(ts[side]).reset_connections(1 - side, what != 1, what != 0);
      resets++;
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  ASSERT_GT(resets.load(), 5) << "the transfer ended before the resets began";
  const int64_t reconnects = stat(*ts[0], "tcp_reconnects") + stat(*ts[1], "tcp_reconnects");
  EXPECT_GT(reconnects, 0);
  RecordProperty("resets", resets.load());
  RecordProperty("reconnects", static_cast<int>(reconnects));
  RecordProperty("resent_bytes", static_cast<int>(stat(*ts[0], "tcp_resent_bytes") +
                                                  stat(*ts[1], "tcp_resent_bytes")));
  EXPECT_TRUE(ts[0]->dead_peers().empty());
  EXPECT_TRUE(ts[1]->dead_peers().empty());
  // The group still works after the storm.
  std::vector<uint8_t> data(100000, 9);
  SendOp s = testing::make_send(1, data.data(), data.size(), 7);
  testing::Receive rv(0);
  std::thread sender([&] { testing::drive(*ts[0], &s, nullptr); });
  testing::drive(*ts[1], nullptr, &rv.op);
  sender.join();
  EXPECT_EQ(rv.sink.data, data);
}

// One reset while the executor's ring all_reduce runs on 3 ranks: the same bits as without it,
// one WARNING per re-dialed connection, the counters in stats().
TEST(TcpResume, RingAllreduceSurvivesAResetBitwise) {
  const int n = 3;
  const size_t numel = 3 << 18;  // 3 MiB of float32
  std::mutex log_mu;
  std::vector<std::string> warnings;
  set_log_sink([&](LogLevel level, const std::string& msg) {
    if (level != LogLevel::Warning) return;
    std::lock_guard<std::mutex> lock(log_mu);
    warnings.push_back(msg);
  });
  auto run = [&](bool reset, std::vector<std::vector<float>>* out,
                 std::vector<TransportStats>* stats) {
    InMemoryRendezvous rdv;
    TcpOptions opt = tight_options();
    opt.resend_bytes = 256 * 1024;
    auto ts = testing::make_group(rdv, n, tcp_maker(opt));
    std::vector<std::string> errors(n);
    std::atomic<int> started{0};
    std::thread breaker([&] {
      if (!reset) return;
      while (started < n) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      tcp_of(ts[2]).reset_connections(0);  // rank 2 dialed both at setup
      tcp_of(ts[1]).reset_connections(2, /*data=*/true, /*control=*/false);
    });
    run_ranks(n, [&](int r) {
      try {
        Executor ex(*ts[r]);
        (*out)[r].resize(numel);
        for (size_t i = 0; i < numel; ++i) (*out)[r][i] = testing::ring_input_value(r, i);
        for (uint64_t seq = 0; seq < 3; ++seq) {
          CollectiveSpec spec;
          spec.seq = seq;
          spec.numel = numel;
          started++;
          ex.run(*ring_allreduce_schedule(r, n, numel), spec, (*out)[r].data(),
                 std::chrono::seconds(60));
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
    breaker.join();
    for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    for (int r = 0; r < n; ++r) stats->push_back(ts[r]->stats());
  };
  std::vector<std::vector<float>> clean(n), faulty(n);
  std::vector<TransportStats> clean_stats, faulty_stats;
  run(false, &clean, &clean_stats);
  {
    std::lock_guard<std::mutex> lock(log_mu);
    EXPECT_TRUE(warnings.empty()) << warnings.front();
  }
  run(true, &faulty, &faulty_stats);
  set_log_sink(nullptr);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(0, std::memcmp(clean[r].data(), faulty[r].data(), numel * sizeof(float)))
        << "rank " << r << " differs from the run without a reset";
    ASSERT_EQ(0, std::memcmp(faulty[r].data(), faulty[0].data(), numel * sizeof(float)))
        << "rank " << r << " differs from rank 0";
  }
  int64_t reconnects = 0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(clean_stats[r]["tcp_reconnects"], 0);
    reconnects += faulty_stats[r]["tcp_reconnects"];
  }
  // Three connections broken (2-0 data and control, 1-2 data), each re-established once and
  // counted on both of its ends.
  EXPECT_EQ(reconnects, 6);
  std::lock_guard<std::mutex> lock(log_mu);
  EXPECT_EQ(warnings.size(), 6u);
  for (const auto& w : warnings) EXPECT_NE(w.find("re-dialed"), std::string::npos) << w;
}

// The sender finished its send (the bytes sit in its kernel buffer and retransmit buffer) and
// then makes no call at all, as an executor between collectives. A reset loses what the kernel
// held; the heartbeat thread re-dials and resends without the executor, so the receiver gets
// the whole message.
TEST(TcpResume, AnIdleSendersBytesAreResentWithoutItsExecutor) {
  InMemoryRendezvous rdv;
  TcpOptions opt = tight_options();
  opt.socket_send_buffer = 256 * 1024;  // the whole message fits in the kernel's buffers
  opt.socket_recv_buffer = 256 * 1024;
  opt.resend_bytes = 512 * 1024;
  auto ts = testing::make_group(rdv, 2, tcp_maker(opt));
  for (int sender : {0, 1}) {  // the accepting side, then the dialing side
    SCOPED_TRACE("sender " + std::to_string(sender));
    const int receiver = 1 - sender;
    std::vector<uint8_t> data(200000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = pattern(sender, 1, i);
    SendOp s = testing::make_send(receiver, data.data(), data.size(), 5);
    testing::drive(*ts[sender], &s, nullptr);
    ASSERT_TRUE(s.done);
    const int64_t before = stat(*ts[sender], "tcp_reconnects");
    const int64_t resent_before = stat(*ts[sender], "tcp_resent_bytes");
    tcp_of(ts[receiver]).reset_connections(sender, /*data=*/true, /*control=*/false);
    // The receiver notices when it reads; the sender's side only through its heartbeat thread.
    testing::Receive rv(sender);
    testing::drive(*ts[receiver], nullptr, &rv.op);
    EXPECT_EQ(rv.sink.data, data);
    EXPECT_EQ(rv.sink.header.step, 5u);
    EXPECT_EQ(stat(*ts[sender], "tcp_reconnects"), before + 1);
    // The reset dropped what waited in the receiver's socket: it came again from the buffer.
    EXPECT_GE(stat(*ts[sender], "tcp_resent_bytes") - resent_before,
              static_cast<int64_t>(data.size()) - 4096);
  }
}

// The sender keeps at most resend_bytes of unacknowledged stream: a peer that reads nothing
// makes the send stop at the bound (plus what the sockets hold), and reading releases it.
TEST(TcpResume, TheRetransmitBufferStaysBounded) {
  InMemoryRendezvous rdv;
  TcpOptions opt = tight_options();
  opt.resend_bytes = 128 * 1024;
  auto ts = testing::make_group(rdv, 2, tcp_maker(opt));
  std::vector<uint8_t> data(4 << 20, 3);
  SendOp s = testing::make_send(1, data.data(), data.size());
  for (int i = 0; i < 300 && !s.done; ++i) {
    const uint64_t tok = ts[0]->activity_token();
    if (!ts[0]->progress(s)) ts[0]->wait_for_activity(tok, std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(s.done);
  // Without reads nothing is acknowledged: what left is the ring's worth.
  EXPECT_LE(s.sent, opt.resend_bytes);
  EXPECT_GT(s.sent, 0u);
  testing::Receive rv(0);
  std::thread reader([&] { testing::drive(*ts[1], nullptr, &rv.op); });
  testing::drive(*ts[0], &s, nullptr);
  reader.join();
  EXPECT_EQ(rv.sink.data, data);
}

// ------------------------------------------------------------------------------------------------
// Dead, not reset

// A transport that closes with bytes unread resets its connections (RST, not FIN), as a killed
// process does; its listener is gone, so the re-dial (the higher rank's) or the probe (the
// lower rank's) is refused: dead at once, in both roles.
TEST(TcpResume, ARefusedRedialMarksThePeerDead) {
  for (int closing : {0, 1}) {
    SCOPED_TRACE("closing rank " + std::to_string(closing));
    InMemoryRendezvous rdv;
    auto ts = testing::make_group(rdv, 2, tcp_maker(tight_options()));
    const int other = 1 - closing;
    // The other rank sends what the closing one never reads.
    std::vector<uint8_t> data(8192, 1);
    SendOp s = testing::make_send(closing, data.data(), data.size());
    testing::drive(*ts[other], &s, nullptr);
    ASSERT_TRUE(eventually([&] {
      return stat(*ts[closing], "tcp_resend_buffer_bytes") > 0;  // and its bytes arrived
    }));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ts[closing].reset();
    ASSERT_TRUE(eventually([&] { return ts[other]->dead_peers() == std::vector<int>{closing}; }));
    EXPECT_EQ(stat(*ts[other], "tcp_reconnects"), 0);
  }
}

}  // namespace
}  // namespace stragg
