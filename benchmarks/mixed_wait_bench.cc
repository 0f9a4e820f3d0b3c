// Micro-benchmark of the mixed transport's waiting (csrc/transport/mixed): round-trip latency of
// small messages between two ranks, each waiting with activity_token / wait_for_activity like the
// executor, and the CPU the process spends per round trip.
//
//   build/ctest/tests/cpp/mixed_wait_bench [--iters 20000] [--bytes 64]
//
// Rows (threads of one process play the ranks; "hosts" are emulated by host identities):
//   shm                 ShmTransport, 2 ranks                       (the baseline)
//   mixed local         MixedTransport, ranks 0 and 1 share a host, rank 2 idle on another: the
//                       waits sleep on the doorbell, the helper watches TCP (shm-only steps)
//   mixed local+remote  as above, but each rank also has a receive from rank 2 pending (a step
//                       with TCP and shm ops): the waits poll both for shm's spin and yield
//                       window, then sleep in ppoll() with the helper relaying the doorbell
//   same, no spin       spin_us = yield_us = 0: every wake-up goes through the helper's relay
//   shm, no spin        ShmTransport with spin_us = yield_us = 0: futex wake-ups only
//   mixed remote        MixedTransport, ranks 0 and 1 on different hosts (TCP over loopback)
//   tcp                 TcpTransport, 2 ranks
// Median and spread (min..max) of the per-batch mean round trip over 20 batches. The machine is
// shared and noisy: compare rows of one run only.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/rendezvous.h"
#include "test_util.h"
#include "transport/mixed/mixed_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

class Sink : public RecvSink {
 public:
  void on_header(const MessageHeader&) override {}
  void on_data(size_t, const void*, size_t) override {}
};

// Drives `op` (and `extra`, a receive that stays pending) until op is done.
template <class Op>
void drive(Transport& t, Op& op, RecvOp* extra) {
  while (!op.done) {
    const uint64_t token = t.activity_token();
    bool moved = t.progress(op);
    if (extra) moved |= t.progress(*extra);
    if (!moved) t.wait_for_activity(token, std::chrono::milliseconds(100));
  }
}

double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Row {
  std::string name;
  double median_us, min_us, max_us, cpu_us;
};

// Ranks 0 and 1 ping-pong `iters` messages of `bytes`; other ranks only keep their transport up
// (and, with `pending`, complete the receives ranks 0 and 1 keep pending from rank 2 at the end).
Row measure(const std::string& name, int size,
            const std::function<std::unique_ptr<Transport>(Rendezvous&, int, int)>& make, int iters,
            size_t bytes, bool pending) {
  testing::InMemoryRendezvous rdv;
  const int batches = 20;
  std::vector<double> batch_us;
  double cpu = 0;
  testing::run_ranks(size, [&](int r) {
    auto t = make(rdv, r, size);
    exchange_all(rdv, name + "/ready", r, size, "1", std::chrono::seconds(60), "bench");
    std::vector<char> buf(bytes, 1);
    Sink sink;
    if (r >= 2) {
      if (pending) {
        exchange_all(rdv, name + "/done", r, size, "1", std::chrono::minutes(10), "bench");
        for (int q : {0, 1}) {
          SendOp s;
          s.peer = q;
          drive(*t, s, nullptr);
        }
      }
      exchange_all(rdv, name + "/exit", r, size, "1", std::chrono::minutes(10), "bench");
      return;
    }
    RecvOp remote;
    remote.peer = 2;
    remote.sink = &sink;
    RecvOp* extra = pending ? &remote : nullptr;
    const double cpu0 = cpu_seconds();
    for (int b = 0; b < batches; ++b) {
      const auto t0 = Clock::now();
      for (int i = 0; i < iters / batches; ++i) {
        SendOp s;
        s.peer = 1 - r;
        s.data = buf.data();
        s.header.payload_bytes = bytes;
        RecvOp rv;
        rv.peer = 1 - r;
        rv.sink = &sink;
        if (r == 0) {
          drive(*t, s, extra);
          drive(*t, rv, extra);
        } else {
          drive(*t, rv, extra);
          drive(*t, s, extra);
        }
      }
      if (r == 0) {
        batch_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                           (iters / batches));
      }
    }
    if (r == 0) cpu = (cpu_seconds() - cpu0) * 1e6 / iters;
    if (pending) {
      exchange_all(rdv, name + "/done", r, size, "1", std::chrono::minutes(10), "bench");
      drive(*t, remote, nullptr);
    }
    exchange_all(rdv, name + "/exit", r, size, "1", std::chrono::minutes(10), "bench");
  });
  std::sort(batch_us.begin(), batch_us.end());
  return {name, batch_us[batch_us.size() / 2], batch_us.front(), batch_us.back(), cpu};
}

// `spin`: keep shm's spin and yield phases (false: wake-ups are relayed at once).
std::function<std::unique_ptr<Transport>(Rendezvous&, int, int)> mixed(std::string letters,
                                                                       bool spin = true) {
  return [letters, spin](Rendezvous& rdv, int r, int) -> std::unique_ptr<Transport> {
    std::vector<std::string> hosts;
    for (char c : letters) hosts.push_back(std::string("host-") + c);
    MixedOptions o;
    if (!spin) o.shm.spin_us = o.shm.yield_us = 0;
    return std::make_unique<MixedTransport>(rdv, "m", r, hosts, o);
  };
}

}  // namespace
}  // namespace stragg

int main(int argc, char** argv) {
  using namespace stragg;
  int iters = 20000;
  size_t bytes = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--bytes") == 0) bytes = std::strtoul(argv[i + 1], nullptr, 10);
  }
  auto shm = [](Rendezvous& rdv, int r, int n) -> std::unique_ptr<Transport> {
    return std::make_unique<ShmTransport>(rdv, "s", r, n, ShmOptions{});
  };
  auto shm_no_spin = [](Rendezvous& rdv, int r, int n) -> std::unique_ptr<Transport> {
    ShmOptions o;
    o.spin_us = o.yield_us = 0;
    return std::make_unique<ShmTransport>(rdv, "s0", r, n, o);
  };
  auto tcp = [](Rendezvous& rdv, int r, int n) -> std::unique_ptr<Transport> {
    return std::make_unique<TcpTransport>(rdv, "t", r, n, TcpOptions{});
  };
  std::vector<Row> rows;
  rows.push_back(measure("shm", 2, shm, iters, bytes, false));
  rows.push_back(measure("mixed local", 3, mixed("AAB"), iters, bytes, false));
  rows.push_back(measure("mixed local+remote", 3, mixed("AAB"), iters, bytes, true));
  rows.push_back(measure("  same, no spin", 3, mixed("AAB", false), iters, bytes, true));
  rows.push_back(measure("shm, no spin", 2, shm_no_spin, iters, bytes, false));
  rows.push_back(measure("mixed remote", 3, mixed("ABB"), iters, bytes, false));
  rows.push_back(measure("tcp", 2, tcp, iters, bytes, false));
  std::printf("%zu-byte round trips, %d iterations: median (min..max) of 20 batch means\n", bytes,
              iters);
  std::printf("%-20s %28s %22s\n", "", "round trip (us)", "process CPU/trip (us)");
  for (const Row& r : rows) {
    std::printf("%-20s %10.2f (%6.2f..%7.2f) %22.2f\n", r.name.c_str(), r.median_us, r.min_us,
                r.max_us, r.cpu_us);
  }
  return 0;
}
