// The GPU executor's stream semantics and fault paths, run on host devices (in-process ranks):
// run() orders after the caller's stream without blocking on it; deadlines turn into TimeoutError
// naming the rank that never called the collective; aborts, dead ranks and device errors fail
// every rank promptly with a message naming them.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "host_gpu_util.h"
#include "plan/planner.h"

namespace stragg::gpu {
namespace {

using testing::contains;
using testing::HostGroup;
using testing::Latch;
using testing::run_ranks;
using namespace std::chrono_literals;

LoweredSchedule ring_plan(int n, int r, size_t numel) {
  return *ring_allreduce_schedule(r, n, numel);
}

CollectiveSpec spec_of(size_t numel, uint64_t seq = 0) {
  CollectiveSpec spec;
  spec.numel = numel;
  spec.seq = seq;
  return spec;
}

// The producer of the input is still blocked on the caller's stream when run() returns: run()
// only orders the collective after it. The collective cannot complete before the producer ran,
// and a consumer stream that waits on the completion sees the reduced data.
TEST(HostGpuStreams, RunOrdersAfterTheCallerStreamWithoutWaitingForIt) {
  const int n = 2;
  const size_t numel = 20000;  // several staging pieces per message
  // Everything stream work refers to outlives the devices (declared before the group).
  std::vector<std::vector<float>> bufs(n, std::vector<float>(numel, -1.0f));
  Latch producers;
  HostGroup g(n);
  std::atomic<int> returned{0};
  std::vector<std::string> notes(n);
  std::vector<std::vector<float>> out(n, std::vector<float>(numel));
  const auto errors = run_ranks(n, [&](int r) {
    host::HostDevice& dev = *g.devices[r];
    host::HostP2P p2p(g.group, r, dev, 10s);
    GpuExecutor ex(p2p, dev);
    const Stream caller = dev.create_stream(), consumer = dev.create_stream();
    std::vector<float>& buf = bufs[r];
    std::atomic<bool> produced{false};
    dev.enqueue(caller, [&] {
      producers.wait();
      for (size_t i = 0; i < numel; ++i) buf[i] = static_cast<float>(i % 100 + r);
      produced = true;
    });
    const auto spec = spec_of(numel);
    const GpuCompletion done = ex.run(ring_plan(n, r, numel), spec, buf.data(), caller, 10s);
    if (produced) notes[r] += "run() returned after the producer ran; ";
    if (done.query()) notes[r] += "completed before the producer ran; ";
    if (++returned == n) producers.open();  // every rank enqueued everything: let them go
    done.stream_wait(consumer);
    dev.enqueue(consumer, [&] { std::memcpy(out[r].data(), buf.data(), numel * sizeof(float)); });
    dev.synchronize(consumer);
    if (!done.query()) notes[r] += "consumer ran before completion; ";
    ex.wait(done, spec, 10s);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ("", errors[r]) << "rank " << r;
    EXPECT_EQ("", notes[r]) << "rank " << r;
    for (size_t i = 0; i < numel; ++i) {
      ASSERT_EQ(out[r][i], static_cast<float>(2 * (i % 100) + 1)) << "rank " << r << " " << i;
    }
  }
}

// Rank 2 joined the group but never calls the collective: the others time out, and every error
// names it, with the last collective it did call.
TEST(HostGpuFaults, MissingRankIsNamedOnEveryWaitingRank) {
  const int n = 3;
  const size_t numel = 3000;
  std::vector<std::vector<float>> bufs(n, std::vector<float>(numel, 1.0f));
  HostGroup g(n);
  Latch done_waiting;
  const auto errors = run_ranks(n, [&](int r) {
    host::HostDevice& dev = *g.devices[r];
    host::HostP2P p2p(g.group, r, dev, 10s);
    GpuExecutor ex(p2p, dev);
    std::vector<float>& buf = bufs[r];
    const auto first = spec_of(numel, 0);
    ex.wait(ex.run(ring_plan(n, r, numel), first, buf.data(), nullptr, 10s), first, 10s);
    if (r == 2) {
      done_waiting.wait();  // alive (not dead), just absent from collective #1
      return;
    }
    const auto second = spec_of(numel, 1);
    try {
      ex.wait(ex.run(ring_plan(n, r, numel), second, buf.data(), nullptr, 500ms), second, 500ms);
    } catch (...) {
      if (r == 0) done_waiting.open();
      throw;
    }
  });
  done_waiting.open();
  for (int r : {0, 1}) {
    EXPECT_TRUE(contains(errors[r], "rank 2 has not called all_reduce #1 (its last was #0)"))
        << "rank " << r << ": " << errors[r];
    EXPECT_TRUE(contains(errors[r], "timed out after")) << errors[r];
  }
  EXPECT_EQ("", errors[2]);
}

// A rank that leaves the group (its process ended) while the others wait for it: they fail
// with "rank 1 has died" long before their deadline, and the group is aborted for everyone.
TEST(HostGpuFaults, DeadRankIsNamed) {
  const int n = 3;
  const size_t numel = 3000;
  std::vector<std::vector<float>> bufs(n, std::vector<float>(numel, 1.0f));
  HostGroup g(n);
  const auto errors = run_ranks(n, [&](int r) {
    host::HostDevice& dev = *g.devices[r];
    host::HostP2P p2p(g.group, r, dev, 10s);
    if (r == 1) return;  // leaves: HostP2P's destructor marks it gone
    GpuExecutor ex(p2p, dev);
    std::vector<float>& buf = bufs[r];
    const auto spec = spec_of(numel);
    ex.wait(ex.run(ring_plan(n, r, numel), spec, buf.data(), nullptr, 60s), spec, 60s);
  });
  for (int r : {0, 2}) {
    EXPECT_TRUE(contains(errors[r], "rank 1 has died")) << "rank " << r << ": " << errors[r];
  }
}

// An abort by one rank fails the others' calls (in flight or later), naming the reason.
TEST(HostGpuFaults, AbortReachesEveryRank) {
  const int n = 2;
  const size_t numel = 3000;
  std::vector<std::vector<float>> bufs(n, std::vector<float>(numel, 1.0f));
  HostGroup g(n);
  Latch aborted;
  const auto errors = run_ranks(n, [&](int r) {
    host::HostDevice& dev = *g.devices[r];
    host::HostP2P p2p(g.group, r, dev, 10s);
    GpuExecutor ex(p2p, dev);
    std::vector<float>& buf = bufs[r];
    const auto spec = spec_of(numel);
    if (r == 1) {
      p2p.abort("stragg: rank 1: test abort");
      aborted.open();
      ex.run(ring_plan(n, r, numel), spec, buf.data(), nullptr, 10s);  // later calls fail too
      return;
    }
    aborted.wait();
    ex.wait(ex.run(ring_plan(n, r, numel), spec, buf.data(), nullptr, 10s), spec, 10s);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(contains(errors[r], "the process group was aborted earlier")) << errors[r];
    EXPECT_TRUE(contains(errors[r], "test abort")) << errors[r];
    EXPECT_TRUE(
        contains(errors[r], "stragg: rank " + std::to_string(r) + ": all_reduce #0 (gpu, host)"))
        << errors[r];
  }
}

// The collective is enqueued everywhere but never finishes on rank 0's device (its producer is
// stuck): rank 0's wait() times out and aborts the group; rank 1, whose stream waits for rank 0's
// data, fails with the abort instead of hanging.
TEST(HostGpuFaults, DeviceTimeoutInWaitAbortsThePeers) {
  const int n = 2;
  const size_t numel = 3000;
  std::vector<std::vector<float>> bufs(n, std::vector<float>(numel, 1.0f));
  Latch stuck;
  HostGroup g(n);
  const auto errors = run_ranks(n, [&](int r) {
    host::HostDevice& dev = *g.devices[r];
    host::HostP2P p2p(g.group, r, dev, 10s);
    GpuExecutor ex(p2p, dev);
    const Stream caller = dev.create_stream();
    std::vector<float>& buf = bufs[r];
    if (r == 0) dev.enqueue(caller, [&] { stuck.wait(); });
    const auto spec = spec_of(numel);
    const GpuCompletion done = ex.run(ring_plan(n, r, numel), spec, buf.data(), caller, 10s);
    ex.wait(done, spec, r == 0 ? 300ms : 20s);
  });
  stuck.open();
  EXPECT_TRUE(contains(errors[0], "timed out after 0.3 s waiting for the collective to finish"))
      << errors[0];
  EXPECT_TRUE(contains(errors[1], "aborted")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "stragg: rank 0: all_reduce #0")) << errors[1];
}

// Work on the caller's stream fails (a kernel fault): the collective's stream inherits the error,
// wait() raises it on that rank and aborts the group, so the peer fails too.
TEST(HostGpuFaults, DeviceErrorFailsTheCallAndAbortsThePeers) {
  const int n = 2;
  const size_t numel = 3000;
  std::vector<std::vector<float>> bufs(n, std::vector<float>(numel, 1.0f));
  HostGroup g(n);
  const auto errors = run_ranks(n, [&](int r) {
    host::HostDevice& dev = *g.devices[r];
    host::HostP2P p2p(g.group, r, dev, 10s);
    GpuExecutor ex(p2p, dev);
    const Stream caller = dev.create_stream();
    std::vector<float>& buf = bufs[r];
    if (r == 0) dev.enqueue(caller, [] { throw Error("injected kernel fault"); });
    const auto spec = spec_of(numel);
    const GpuCompletion done = ex.run(ring_plan(n, r, numel), spec, buf.data(), caller, 10s);
    ex.wait(done, spec, 20s);
  });
  EXPECT_TRUE(contains(errors[0], "injected kernel fault")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "stragg: rank 0: all_reduce #0 (gpu, host)")) << errors[0];
  EXPECT_TRUE(contains(errors[1], "aborted")) << errors[1];
  EXPECT_TRUE(contains(errors[1], "injected kernel fault")) << errors[1];
}

// Setup: a rank that never joins makes the others' setup time out naming it.
TEST(HostGpuFaults, SetupTimesOutNamingTheAbsentRank) {
  HostGroup g(3);
  const auto errors =
      run_ranks(2, [&](int r) { host::HostP2P p2p(g.group, r, *g.devices[r], 200ms); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(errors[r], "setup timed out after 0.2 s waiting for rank 2")) << errors[r];
  }
}

// Argument errors of the p2p layer and the kernels, raised at enqueue time like CUDA's.
TEST(HostGpuFaults, InvalidPeersAndKernelArgumentsThrowAtEnqueue) {
  HostGroup g(1);
  host::HostP2P p2p(g.group, 0, *g.devices[0], 1s);
  p2p.group_start();
  float x[4] = {};
  try {
    p2p.send(x, sizeof x, 0, nullptr);
    FAIL() << "send to self accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "stragg: rank 0: host p2p: send to invalid peer 0");
  }
  try {
    g.devices[0]->reduce_into(DType::Float32, ReduceOp::BXor, x, x + 2, 2, nullptr);
    FAIL() << "BXOR on float32 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "stragg: gpu reduce: op BXOR is not supported for dtype float32");
  }
}

}  // namespace
}  // namespace stragg::gpu
