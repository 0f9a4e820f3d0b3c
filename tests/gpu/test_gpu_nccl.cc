// NcclP2P and GpuExecutor with one rank (send/receive to itself), on GPU 0.
// Skipped at runtime without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../cpp/test_util.h"
#include "common/error.h"
#include "gpu_test_util.h"
#include "kernels/cuda_check.h"
#include "kernels/gpu_executor.h"
#include "kernels/nccl_p2p.h"

namespace stragg::gpu {
namespace {

using namespace std::chrono_literals;
using stragg::testing::InMemoryRendezvous;

#define SKIP_WITHOUT_GPU() STRAGG_SKIP_WITHOUT_GPU(testing::device_count() > 0)

TEST(NcclP2P, SetupTimesOutWithoutRankZero) {
  // Rank 1 of 2 waits for an id nobody publishes: TimeoutError naming rank 0, no CUDA needed.
  InMemoryRendezvous rdv;
  try {
    NcclP2P p2p(rdv, "lonely", 1, 2, 0, 200ms);
    FAIL() << "no error";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 did not publish"), std::string::npos) << e.what();
  }
}

TEST(NcclP2P, SelfSendReceive) {
  SKIP_WITHOUT_GPU();
  InMemoryRendezvous rdv;
  NcclP2P p2p(rdv, "self", 0, 1, 0, 60s);
  const size_t n = 1 << 20;
  std::vector<int32_t> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<int32_t>(i * 7);
  void *src, *dst;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&src, n * 4));
  ASSERT_EQ(cudaSuccess, cudaMalloc(&dst, n * 4));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(src, host.data(), n * 4, cudaMemcpyHostToDevice));
  cudaStream_t s;
  ASSERT_EQ(cudaSuccess, cudaStreamCreate(&s));
  p2p.group_start();
  p2p.send(src, n * 4, 0, s);
  p2p.recv(dst, n * 4, 0, s);
  p2p.group_end(60s);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  std::vector<int32_t> back(n);
  ASSERT_EQ(cudaSuccess, cudaMemcpy(back.data(), dst, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(host, back);
  EXPECT_FALSE(p2p.async_error().has_value());
  cudaStreamDestroy(s);
  cudaFree(src);
  cudaFree(dst);
}

// A hand-made one-rank plan that exercises the executor's scratch paths: step 0 reduces the first
// half into the second (receive lands in scratch, then the kernel), step 1 copies the second half
// over the first while sending the first half (staged overwrite), step 2 is empty.
TEST(GpuExecutorNccl, ScratchReduceAndStagedCopy) {
  SKIP_WITHOUT_GPU();
  InMemoryRendezvous rdv;
  NcclP2P p2p(rdv, "exec", 0, 1, 0, 60s);
  GpuExecutor ex(p2p);
  const size_t n = 2 * 100003;
  const size_t h = n / 2;
  LoweredSchedule plan;
  plan.tag = schedule_tag(Algorithm::Ring);
  LoweredStep s0;
  s0.id = 0;
  s0.sends.push_back(LoweredOp{0, 0, h, false, false, -1});
  s0.recvs.push_back(LoweredOp{0, h, h, true, false, -1});
  LoweredStep s1;
  s1.id = 1;
  s1.sends.push_back(LoweredOp{0, 0, h, false, false, -1});  // reads the first half...
  s1.sends.push_back(LoweredOp{0, h, h, false, false, -1});
  s1.recvs.push_back(LoweredOp{0, h, h, false, true, -1});  // ...received into the second: staged
  s1.recvs.push_back(LoweredOp{0, 0, h, false, false, 0});  // ...and over itself: follows send 0
  LoweredStep s2;
  s2.id = 2;
  plan.steps = {s0, s1, s2};

  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000);
  void* buf;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&buf, n * 4));
  cudaStream_t caller;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(buf, host.data(), n * 4, cudaMemcpyHostToDevice, caller));
  CollectiveSpec spec;
  spec.numel = n;
  const GpuCompletion done = ex.run(plan, spec, buf, caller, 60s);
  done.stream_wait(caller);
  ex.wait(done, spec, 60s);
  std::vector<float> out(n);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(out.data(), buf, n * 4, cudaMemcpyDeviceToHost, caller));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(caller));
  // After step 0: [a, b + a]. Step 1 swaps the halves (both read before either lands).
  for (size_t i = 0; i < h; ++i) {
    ASSERT_EQ(out[i], host[h + i] + host[i]) << i;
    ASSERT_EQ(out[h + i], host[i]) << i;
  }
  EXPECT_EQ(1u, ex.stats().reduce_kernels);

  // After an abort every call fails at once, naming the reason.
  p2p.abort("test abort");
  try {
    ex.run(plan, spec, buf, caller, 1s);
    FAIL() << "no error after abort";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
  }
  cudaStreamDestroy(caller);
  cudaFree(buf);
}

}  // namespace
}  // namespace stragg::gpu
