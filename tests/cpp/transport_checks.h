// Checks every Transport must pass, shared by the shm and tcp test suites (and the executor's):
// messages stream through bounded staging in FIFO order, full-duplex exchanges finish, aborts and
// arrival tickets reach every rank, a sleeping waiter is woken by news, setup names the ranks
// that never join, a ring all_reduce is exact and bitwise identical across ranks, and mismatched
// collectives raise on every rank.
//
// No check measures time. Limits below (kHangGuard) only turn a hang into a failure: a correct
// transport finishes in milliseconds, so a loaded machine cannot make a check fail.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "plan/planner.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "transport/transport.h"

namespace stragg::testing {

// Builds rank r's transport (a collective call: every rank makes one).
using MakeTransport = std::function<std::unique_ptr<Transport>(Rendezvous&, int rank, int size)>;

// How long a check waits for something that takes milliseconds before calling it a hang.
constexpr auto kHangGuard = std::chrono::seconds(30);
// The max_wait of waits a check expects to be woken, and the timeout of collectives it expects
// to fail for another reason: longer than the (at most two) guards around them, so a wait that
// returns within those was woken, yet short enough that a broken wake-up fails the check well
// within ctest's limit instead of hanging it.
constexpr auto kLongWait = 4 * kHangGuard;

// Makes `size` connected transports (one per thread, joined before returning).
inline std::vector<std::unique_ptr<Transport>> make_group(InMemoryRendezvous& rdv, int size,
                                                          const MakeTransport& make) {
  std::vector<std::unique_ptr<Transport>> ts(size);
  run_ranks(size, [&](int r) { ts[r] = make(rdv, r, size); });
  return ts;
}

// Polls `pred` until it holds; false if it still does not after kHangGuard.
template <class Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

// Publishes that this rank began collective `seq` (what the executor does when it starts one).
inline void arrive(Transport& t, int64_t seq) {
  Progress p;
  p.seq = seq;
  t.publish_progress(p);
}

// The collective `peer` last began, as `t` sees it (-1: none).
inline int64_t arrival(Transport& t, int peer) { return t.peer_status(peer).progress.seq; }

// Collects a message into a vector and checks how the transport hands the payload over: one
// header, then consecutive, 64-byte aligned pieces that split no 64-byte unit.
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

// A receive from `peer` into a VectorSink.
struct Receive {
  explicit Receive(int peer) {
    op.peer = peer;
    op.sink = &sink;
  }
  Receive(const Receive&) = delete;
  Receive& operator=(const Receive&) = delete;
  VectorSink sink;
  RecvOp op;
};

// A send of `bytes` from `data` to `peer`, from schedule step `step`.
inline SendOp make_send(int peer, const void* data, size_t bytes, uint32_t step = 0) {
  SendOp s;
  s.peer = peer;
  s.data = data;
  s.header.payload_bytes = bytes;
  s.header.step = step;
  return s;
}

// Drives the ops to completion like the executor does.
inline void drive(Transport& t, SendOp* s, RecvOp* r) {
  const auto deadline = std::chrono::steady_clock::now() + kHangGuard;
  while ((s && !s->done) || (r && !r->done)) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "ops did not finish";
    const uint64_t tok = t.activity_token();
    bool moved = false;
    if (s) moved |= t.progress(*s);
    if (r) moved |= t.progress(*r);
    if (!moved) t.wait_for_activity(tok, std::chrono::milliseconds(50));
  }
}

// True once thread `tid` of this process sleeps in system call `nr` (SYS_ppoll, SYS_futex).
inline bool sleeps_in(pid_t tid, long nr) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long current = -1;
  return (in >> current) && current == nr;  // "running" while on a CPU
}

// Runs t.wait_for_activity(token taken now, kLongWait) on a thread of its own and, once that
// thread sleeps in system call `sleep_nr`, runs `wake`. Returns "" if the wait then returned
// within kHangGuard, else what went wrong.
inline std::string wake_sleeping_waiter(Transport& t, long sleep_nr,
                                        const std::function<void()>& wake) {
  const uint64_t token = t.activity_token();
  std::atomic<pid_t> tid{0};
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    t.wait_for_activity(token, kLongWait);
    returned = true;
  });
  std::string problem;
  if (!eventually([&] { return returned || (tid != 0 && sleeps_in(tid, sleep_nr)); })) {
    problem = "the wait never went to sleep";
  } else if (returned) {
    problem = "the wait returned before anything happened";
  } else {
    wake();
    if (!eventually([&] { return returned.load(); })) problem = "the wait was not woken";
  }
  waiter.join();  // after kLongWait at the latest
  return problem;
}

// ------------------------------------------------------------------------------------------------
// Setup

// Rank 0 of 3 sets up alone: setup names ranks 1 and 2 and leaves no resources behind, counted
// by `resources` (open descriptors, /dev/shm entries). `make` uses a short setup timeout.
inline void check_setup_names_ranks_that_never_join(const MakeTransport& make,
                                                    const std::function<int()>& resources) {
  const int before = resources();
  InMemoryRendezvous rdv;
  try {
    make(rdv, 0, 3);
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("ranks [1, 2] did not join"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  }
  EXPECT_EQ(resources(), before);
}

// ------------------------------------------------------------------------------------------------
// Messages

// Rank 0 sends large, empty, small, huge and empty messages to rank 1, which receives them in
// order, intact, each in at least ceil(size / max_piece) pieces; `pieces` gets their counts.
inline void check_streams_messages_in_fifo_order(const MakeTransport& make, size_t max_piece,
                                                 std::vector<int>* pieces) {
  InMemoryRendezvous rdv;
  std::vector<uint8_t> big(4096 * 37 + 123), small(10), huge(8 * 1024 * 1024 + 5);
  std::iota(big.begin(), big.end(), 0);
  std::iota(small.begin(), small.end(), 100);
  for (size_t i = 0; i < huge.size(); ++i) huge[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::vector<const std::vector<uint8_t>*> payloads = {&big, nullptr, &small, &huge, nullptr};
  pieces->assign(payloads.size(), 0);
  run_ranks(2, [&](int r) {
    auto t = make(rdv, r, 2);
    for (size_t k = 0; k < payloads.size(); ++k) {
      const size_t bytes = payloads[k] ? payloads[k]->size() : 0;
      if (r == 0) {
        SendOp s = make_send(1, payloads[k] ? payloads[k]->data() : nullptr, bytes, k + 1);
        s.header.coll_seq = 42;
        drive(*t, &s, nullptr);
        continue;
      }
      Receive rv(0);
      drive(*t, nullptr, &rv.op);
      const VectorSink& sink = rv.sink;
      (*pieces)[k] = sink.pieces;
      EXPECT_EQ(sink.headers, 1);
      EXPECT_EQ(sink.header.step, k + 1);
      EXPECT_EQ(sink.header.coll_seq, 42u);
      ASSERT_EQ(sink.data.size(), bytes);
      EXPECT_TRUE(bytes == 0 || sink.data == *payloads[k]) << "payload " << k << " differs";
      EXPECT_GE(sink.pieces, static_cast<int>((bytes + max_piece - 1) / max_piece));
    }
  });
}

// Both ranks send `n` bytes to each other at once, each driving its send and receive together.
inline void check_full_duplex_exchange(const MakeTransport& make, size_t n) {
  InMemoryRendezvous rdv;
  run_ranks(2, [&](int r) {
    auto t = make(rdv, r, 2);
    std::vector<uint8_t> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * (r + 1));
    SendOp s = make_send(1 - r, out.data(), n);
    Receive rv(1 - r);
    drive(*t, &s, &rv.op);
    const VectorSink& k = rv.sink;
    ASSERT_EQ(k.data.size(), n);
    for (size_t i = 0; i < n; i += 4099) {
      ASSERT_EQ(k.data[i], static_cast<uint8_t>(i * (2 - r))) << "byte " << i;
    }
    EXPECT_EQ(k.data[n - 1], static_cast<uint8_t>((n - 1) * (2 - r)));
  });
}

// ------------------------------------------------------------------------------------------------
// Faults, tickets and wake-ups

// Rank 1 aborts, then ranks 2 and 1 again: every rank keeps the first reason.
inline void check_abort_reaches_every_rank_with_the_first_reason(const MakeTransport& make) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, 3, make);
  for (auto& t : ts) EXPECT_FALSE(t->abort_reason().has_value());
  ts[1]->signal_abort("first reason");
  for (auto& t : ts) {
    ASSERT_TRUE(eventually([&] { return t->abort_reason().has_value(); }));
    EXPECT_EQ(*t->abort_reason(), "first reason");
  }
  ts[2]->signal_abort("second reason");  // rank 2 already knows the first reason
  ts[1]->signal_abort("third reason");   // idempotent
  // Progress reports travel behind any abort a rank sent: once every rank sees every report,
  // the later aborts have been delivered too.
  for (auto& t : ts) arrive(*t, 99);
  for (int r = 0; r < 3; ++r) {
    for (int q = 0; q < 3; ++q) {
      ASSERT_TRUE(eventually([&] { return arrival(*ts[r], q) == 99; })) << r << " " << q;
    }
  }
  for (auto& t : ts) EXPECT_EQ(*t->abort_reason(), "first reason");
}

// Progress reports reach every peer whole (seq, call, step, awaited ranks), the newest wins,
// and unknown ranks read seq -1. Healthy peers read as alive.
inline void check_progress_reports_are_visible_to_peers(const MakeTransport& make) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, 3, make);
  EXPECT_EQ(arrival(*ts[0], 1), -1);
  EXPECT_EQ(arrival(*ts[0], 7), -1);
  Progress p;
  p.seq = 7;
  p.call = 3;
  p.step = 5;
  p.awaiting = {0, 2};
  ts[1]->publish_progress(p);
  ASSERT_TRUE(eventually([&] { return arrival(*ts[0], 1) == 7; }));
  ASSERT_TRUE(eventually([&] { return arrival(*ts[2], 1) == 7; }));
  // Later fields may trail the sequence number by one beat.
  ASSERT_TRUE(eventually([&] { return ts[2]->peer_status(1).progress.step == 5; }));
  const PeerStatus s = ts[2]->peer_status(1);
  EXPECT_EQ(s.progress.call, 3);
  EXPECT_EQ(s.progress.awaiting, (std::vector<int>{0, 2}));
  EXPECT_EQ(s.liveness, Liveness::Alive);
  EXPECT_EQ(arrival(*ts[1], 1), 7);
  EXPECT_EQ(arrival(*ts[0], 2), -1);
  for (int64_t seq = 8; seq < 2000; ++seq) arrive(*ts[1], seq);
  ASSERT_TRUE(eventually([&] { return arrival(*ts[0], 1) == 1999; }));
  EXPECT_TRUE(ts[0]->dead_peers().empty());
}

// A wait whose token is already stale returns without being woken.
inline void check_wait_returns_when_token_is_stale(const MakeTransport& make) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, 2, make);
  const uint64_t tok = ts[0]->activity_token();
  ts[1]->signal_abort("wake");
  ASSERT_TRUE(eventually([&] { return ts[0]->abort_reason().has_value(); }));
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    ts[0]->wait_for_activity(tok, kLongWait);
    returned = true;
  });
  EXPECT_TRUE(eventually([&] { return returned.load(); })) << "the wait slept on a stale token";
  waiter.join();
  EXPECT_NE(ts[0]->activity_token(), tok);
}

// Rank 0 sleeps waiting for a message from rank 2 that never comes; rank 1 (for which rank 0
// has no receive posted) aborts: the abort wakes rank 0. `sleep_nr`: the system call a waiting
// rank sleeps in.
inline void check_abort_wakes_a_rank_waiting_on_another_peer(const MakeTransport& make,
                                                             long sleep_nr) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, 3, make);
  Receive rv(2);
  EXPECT_FALSE(ts[0]->progress(rv.op));
  EXPECT_EQ(wake_sleeping_waiter(*ts[0], sleep_nr, [&] { ts[1]->signal_abort("rank 1 gives up"); }),
            "");
  EXPECT_EQ(ts[0]->abort_reason().value_or(""), "rank 1 gives up");
  EXPECT_FALSE(rv.op.done);
}

// Rank 1 sleeps waiting for a message; rank 0 sends it: the data wakes rank 1.
inline void check_data_wakes_a_sleeping_receiver(const MakeTransport& make, long sleep_nr) {
  InMemoryRendezvous rdv;
  auto ts = make_group(rdv, 2, make);
  Receive rv(0);
  EXPECT_FALSE(ts[1]->progress(rv.op));
  SendOp s = make_send(1, nullptr, 0, 9);
  EXPECT_EQ(wake_sleeping_waiter(*ts[1], sleep_nr, [&] { drive(*ts[0], &s, nullptr); }), "");
  drive(*ts[1], nullptr, &rv.op);
  EXPECT_EQ(rv.sink.header.step, 9u);
  EXPECT_FALSE(ts[1]->abort_reason().has_value());
}

// ------------------------------------------------------------------------------------------------
// Ranks in other processes (forked children), for what threads cannot show: a stopped process,
// a process that exits.

// A fresh directory for a FileRendezvous; removed by the destructor.
struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/stragg-test-XXXXXX";
    path = mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

// Rank 0 is a child process that sends one message to rank 1 and exits before rank 1 reads
// it: rank 1 must not count it dead while its bytes are unread, and reads them whole.
inline void check_a_rank_may_exit_before_its_last_message_is_read(const MakeTransport& make) {
  TempDir dir;
  const size_t bytes = 200 * 1000;  // fits in shm slots and loopback socket buffers
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      FileRendezvous rdv(dir.path);
      auto t = make(rdv, 0, 2);
      std::vector<uint8_t> data(bytes);
      for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 7);
      SendOp s = make_send(1, data.data(), bytes, 4);
      drive(*t, &s, nullptr);
      _exit(s.done ? 0 : 2);
    } catch (...) {
      _exit(1);
    }
  }
  FileRendezvous rdv(dir.path);
  auto t = make(rdv, 1, 2);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(t->dead_peers().empty()) << "rank 0 counted dead while its message is unread";
  Receive rv(0);
  drive(*t, nullptr, &rv.op);
  ASSERT_EQ(rv.sink.data.size(), bytes);
  for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(rv.sink.data[i], static_cast<uint8_t>(i * 7)) << i;
  EXPECT_TRUE(eventually([&] { return t->dead_peers() == std::vector<int>{0}; }));
}

// Three ranks run a Ring all_reduce; rank 2 is a child process that stops itself (SIGSTOP) right
// after it announced the collective. Rank 0 waits for rank 2's data; rank 1 waits only for rank
// 0 and times out first: its message, and the abort rank 0 then reports, must both name rank 2
// as the rank that stopped (not rank 0, the one rank 1 waits for). Returns the two messages.
inline std::vector<std::string> check_a_stopped_rank_is_named_by_every_survivor(
    const MakeTransport& make) {
  TempDir dir;
  const size_t numel = 3000;  // every send fits in the staging: rank 1 never waits for rank 2
  const pid_t child = fork();
  EXPECT_GE(child, 0);
  if (child == 0) {
    try {
      FileRendezvous rdv(dir.path);
      auto t = make(rdv, 2, 3);
      Executor ex(*t);
      std::vector<float> buf(numel, 1.0f);
      CollectiveSpec spec;
      spec.numel = numel;
      arrive(*t, 0);
      raise(SIGSTOP);
      ex.run(*ring_allreduce_schedule(2, 3, numel), spec, buf.data(), kLongWait);
    } catch (...) {
    }
    _exit(0);
  }
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    FileRendezvous rdv(dir.path);
    auto t = make(rdv, r, 3);
    EXPECT_TRUE(eventually([&] { return arrival(*t, 2) == 0; }));
    Executor ex(*t);
    std::vector<float> buf(numel, 1.0f);
    CollectiveSpec spec;
    spec.numel = numel;
    try {
      ex.run(*ring_allreduce_schedule(r, 3, numel), spec, buf.data(),
             r == 1 ? std::chrono::milliseconds(5000) : kLongWait);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_NE(errors[1].find("stragg: rank 1: all_reduce #0 timed out (no progress within the "
                           "timeout of 5 s): rank 2 stopped responding ("),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("; rank 1 was in step 1, waiting for rank 0"), std::string::npos)
      << errors[1];
  EXPECT_NE(errors[0].find("stragg: rank 0: all_reduce #0: the group was aborted: rank 1: "
                           "all_reduce #0 timed out (no progress within the timeout of 5 s): "
                           "rank 2 stopped responding ("),
            std::string::npos)
      << errors[0];
  return errors;
}

// ------------------------------------------------------------------------------------------------
// Ring all_reduce through the executor

inline float ring_input_value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 0.5 + (i % 97) * 0.25);
}

// Ring all_reduce (SUM, float32) of `numel` elements on `size` ranks, twice in a row (state
// carries over between collectives): matches a float64 reference and is bitwise identical.
inline void check_ring_allreduce(int size, size_t numel, const MakeTransport& make) {
  InMemoryRendezvous rdv;
  std::vector<std::vector<float>> out(size);
  std::vector<std::string> errors(size);
  run_ranks(size, [&](int r) {
    try {
      auto t = make(rdv, r, size);
      Executor ex(*t);
      std::vector<float> buf(numel);
      for (size_t i = 0; i < numel; ++i) buf[i] = ring_input_value(r, i);
      for (uint64_t seq = 0; seq < 2; ++seq) {
        std::vector<float> work = buf;
        CollectiveSpec spec;
        spec.seq = seq;
        spec.numel = numel;
        ex.run(*ring_allreduce_schedule(r, size, numel), spec, work.data(),
               std::chrono::seconds(60));
        out[r] = work;
      }
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < size; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (size_t i = 0; i < numel; ++i) {
    double ref = 0;
    for (int r = 0; r < size; ++r) ref += ring_input_value(r, i);
    ASSERT_NEAR(out[0][i], ref, 1e-4 * std::fabs(ref) + 1e-5) << "element " << i;
  }
  for (int r = 1; r < size; ++r) {
    ASSERT_EQ(out[r].size(), numel);
    if (numel == 0) continue;
    ASSERT_EQ(0, std::memcmp(out[r].data(), out[0].data(), numel * sizeof(float)))
        << "rank " << r << " differs from rank 0";
  }
}

// Rank 2 passes a different numel: every rank must raise naming the mismatch.
inline void check_numel_mismatch_raises_everywhere(int size, const MakeTransport& make) {
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(size);
  run_ranks(size, [&](int r) {
    auto t = make(rdv, r, size);
    Executor ex(*t);
    const size_t numel = (r == 2) ? 100 : 200;
    std::vector<float> buf(numel, 1.0f);
    CollectiveSpec spec;
    spec.numel = numel;
    try {
      ex.run(*ring_allreduce_schedule(r, size, numel), spec, buf.data(), std::chrono::seconds(20));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_NE(errors[r].find("mismatch"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("numel"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

}  // namespace stragg::testing
