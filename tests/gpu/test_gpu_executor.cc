// GpuExecutor end to end: forked ranks run planner schedules on device buffers.
//   * CUDA IPC, 2 and 4 ranks sharing GPU 0 (Ring, RHD, direct, StragglAR), small staging so
//     messages go in many pieces; results exact and bitwise identical on every rank;
//   * a late rank makes the others raise TimeoutError, and then sees the abort itself;
//   * NCCL over 2..4 GPUs when the machine has them (NCCL refuses two ranks on one GPU).
// This process never initialises CUDA (children do), so it may fork; skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/rendezvous.h"
#include "gpu_test_util.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_ipc_p2p.h"
#include "kernels/gpu_executor.h"
#include "plan/planner.h"
#if STRAGG_TEST_NCCL
#include "kernels/nccl_p2p.h"
#endif

namespace stragg::gpu {
namespace {

using testing::device_count_without_init;
using testing::FileRendezvous;
using testing::fork_ranks;
using testing::make_temp_dir;
using testing::Tally;
using namespace std::chrono_literals;

// Small integers: every summation order is exact, so every schedule must give the same bits.
float input_value(int rank, size_t i) { return static_cast<float>((rank * 7 + i * 3) % 23); }

std::unique_ptr<GpuP2P> make_p2p(const std::string& kind, Rendezvous& rdv, int rank, int n,
                                 int device) {
  if (kind == "ipc") {
    CudaIpcOptions opt;
    opt.slot_bytes = 64 << 10;  // many pieces per message
    opt.slots = 2;
    return std::make_unique<CudaIpcP2P>(rdv, "test", rank, n, device, 60s, opt);
  }
#if STRAGG_TEST_NCCL
  if (kind == "nccl") return std::make_unique<NcclP2P>(rdv, "test", rank, n, device, 60s);
#endif
  throw Error("unknown p2p kind " + kind);
}

// One rank: three all_reduce calls in a row (issue order), result checked and saved for the
// cross-rank bitwise comparison.
int allreduce_rank(const std::string& dir, const std::string& kind, const std::string& algo,
                   int rank, int n, int device, size_t numel) {
  FileRendezvous rdv(dir);
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  auto p2p = make_p2p(kind, rdv, rank, n, device);
  GpuExecutor ex(*p2p);
  PlannerConfig cfg;
  cfg.algo = *algorithm_from_name(algo);
  cfg.straggler = n > 2 ? Straggler::of_rank(1) : Straggler::none();
  cfg.max_staging_bytes = 64 << 10;
  Planner planner(n, cfg);

  std::vector<float> input(numel), out(numel);
  for (size_t i = 0; i < numel; ++i) input[i] = input_value(rank, i);
  void* dbuf = nullptr;
  cuda_check(cudaMalloc(&dbuf, numel * sizeof(float)), "cudaMalloc");
  cudaStream_t caller;
  cuda_check(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), "cudaStreamCreate");
  for (uint64_t seq = 0; seq < 3; ++seq) {
    cuda_check(cudaMemcpyAsync(dbuf, input.data(), numel * sizeof(float), cudaMemcpyHostToDevice,
                               caller),
               "H2D");
    CollectiveSpec spec;
    spec.seq = seq;
    spec.numel = numel;
    const PlanChoice choice = planner.choose(numel * sizeof(float), planner.straggler().rank);
    const GpuCompletion done =
        ex.run(*planner.lower(rank, choice, numel, sizeof(float), false), spec, dbuf, caller, 60s);
    done.stream_wait(caller);  // Work::wait() on CUDA: the caller's stream waits, not the host
    ex.wait(done, spec, 60s);  // host wait with timeout (synchronize())
    cuda_check(cudaMemcpyAsync(out.data(), dbuf, numel * sizeof(float), cudaMemcpyDeviceToHost,
                               caller),
               "D2H");
    cuda_check(cudaStreamSynchronize(caller), "cudaStreamSynchronize");
    for (size_t i = 0; i < numel; ++i) {
      float ref = 0;
      for (int r = 0; r < n; ++r) ref += input_value(r, i);
      if (out[i] != ref) {
        std::fprintf(stderr, "rank %d %s/%s call %d: element %zu is %g, expected %g\n", rank,
                     kind.c_str(), algo.c_str(), static_cast<int>(seq), i, out[i], ref);
        return 1;
      }
    }
  }
  std::ofstream(dir + "/result." + std::to_string(rank), std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), numel * sizeof(float));
  // Nobody tears down its staging while a peer may still copy into it.
  exchange_all(rdv, "end", rank, n, "1", 60s, "end of test");
  cudaStreamDestroy(caller);
  cudaFree(dbuf);
  return 0;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void run_case(const std::string& kind, const std::string& algo, int n, bool one_gpu,
              size_t numel) {
  const std::string dir = make_temp_dir();
  const std::string failures = fork_ranks(n, [&](int r) {
    return allreduce_rank(dir, kind, algo, r, n, one_gpu ? 0 : r, numel);
  });
  ASSERT_EQ("", failures) << kind << " " << algo << " n=" << n;
  const auto first = read_file(dir + "/result.0");
  ASSERT_EQ(first.size(), numel * sizeof(float));
  for (int r = 1; r < n; ++r) {
    const bool same = first == read_file(dir + "/result." + std::to_string(r));
    Tally::add("rank_results_compared", 1);
    Tally::add("rank_results_differing", same ? 0 : 1);
    EXPECT_TRUE(same) << kind << " " << algo << ": rank " << r << " differs from rank 0";
  }
}

using Case = std::tuple<std::string, int>;
class CudaIpcAllreduce : public ::testing::TestWithParam<Case> {};

TEST_P(CudaIpcAllreduce, ExactAndBitwiseIdenticalOnOneGpu) {
  STRAGG_SKIP_WITHOUT_GPU(device_count_without_init() > 0);
  Tally tally({"rank_results_compared", "rank_results_differing"});
  const auto& [algo, n] = GetParam();
  run_case("ipc", algo, n, /*one_gpu=*/true, 100003);  // odd size: uneven chunks, scalar tails
}

INSTANTIATE_TEST_SUITE_P(Algorithms, CudaIpcAllreduce,
                         ::testing::Values(Case{"ring", 2}, Case{"rhd", 2}, Case{"ring", 4},
                                           Case{"rhd", 4}, Case{"direct", 4},
                                           Case{"stragglar", 4}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Rank 1 is late beyond rank 0's timeout: rank 0 raises TimeoutError (no hang) and aborts the
// group; rank 1 then finds the group aborted.
TEST(CudaIpcFaults, LateRankTimesOutAndAbortPropagates) {
  STRAGG_SKIP_WITHOUT_GPU(device_count_without_init() > 0);
  const std::string dir = make_temp_dir();
  const size_t numel = 1 << 16;
  const std::string failures = fork_ranks(2, [&](int rank) {
    FileRendezvous rdv(dir);
    cuda_check(cudaSetDevice(0), "cudaSetDevice");
    auto p2p = make_p2p("ipc", rdv, rank, 2, 0);
    GpuExecutor ex(*p2p);
    Planner planner(2, PlannerConfig{});
    void* dbuf = nullptr;
    cuda_check(cudaMalloc(&dbuf, numel * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemset(dbuf, 0, numel * sizeof(float)), "cudaMemset");
    CollectiveSpec spec;
    spec.numel = numel;
    const auto plan = *planner.lower(rank, planner.choose(numel * 4, -1), numel, 4);
    if (rank == 1) std::this_thread::sleep_for(3s);
    try {
      const GpuCompletion done = ex.run(plan, spec, dbuf, nullptr, rank == 0 ? 1000ms : 60000ms);
      ex.wait(done, spec, 5s);
    } catch (const TimeoutError& e) {
      if (rank != 0) return 10;
      if (std::string(e.what()).find("rank 1") == std::string::npos) return 11;
      return 0;
    } catch (const Error& e) {
      if (rank != 1) return 12;
      if (std::string(e.what()).find("aborted") == std::string::npos) return 13;
      return 0;
    }
    return 14;  // no error at all
  });
  EXPECT_EQ("", failures);
}

#if STRAGG_TEST_NCCL
TEST(NcclAllreduce, RingAndStragglarAcrossGpus) {
  const int devices = device_count_without_init();
  if (devices < 2) GTEST_SKIP() << "needs at least 2 CUDA devices (found " << devices << ")";
  Tally tally({"rank_results_compared", "rank_results_differing"});
  const int n = devices >= 4 ? 4 : 2;
  run_case("nccl", "ring", n, /*one_gpu=*/false, 100003);
  if (n >= 3) run_case("nccl", "stragglar", n, false, 100003);
}
#endif

}  // namespace
}  // namespace stragg::gpu
