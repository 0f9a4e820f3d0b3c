// The GPU executor (kernels/gpu_executor.h) run on host devices: 2-4 in-process ranks, each with
// its own HostDevice (threads as streams, the CUDA kernels' element loop on the host) and the
// staged p2p protocol of CUDA IPC over in-process channels. Every planner algorithm, results
// bitwise equal to a float64 reference (inputs chosen so every summation order is exact) and
// bitwise identical on every rank; every dtype x op; the scratch paths of a hand-made plan.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "host_gpu_util.h"
#include "plan/planner.h"
#include "runtime/dtype_float16.h"
#include "runtime/reduce.h"

namespace stragg::gpu {
namespace {

using testing::HostGroup;
using testing::run_ranks;
using namespace std::chrono_literals;

// Small integers: every summation order is exact, so every schedule must give the same bits.
float input_value(int rank, size_t i) { return static_cast<float>((rank * 7 + i * 3) % 23); }

// One rank: `calls` all_reduce calls in a row on `in`, the last result returned.
std::vector<unsigned char> allreduce_on_rank(HostGroup& g, const Planner& planner, int r,
                                             const std::vector<unsigned char>& in, DType t,
                                             ReduceOp op, bool ordered, int calls = 2) {
  host::HostDevice& dev = *g.devices[r];
  host::HostP2P p2p(g.group, r, dev, 10s);
  GpuExecutor ex(p2p, dev);
  const Stream caller = dev.create_stream();
  const size_t bytes = in.size();
  const size_t numel = bytes / dtype_size(t);
  void* buf = dev.alloc_async(bytes, caller);
  std::vector<unsigned char> out(bytes), first;
  for (int seq = 0; seq < calls; ++seq) {
    dev.enqueue(caller, [&] { std::memcpy(buf, in.data(), bytes); });  // "H2D"
    CollectiveSpec spec;
    spec.seq = static_cast<uint64_t>(seq);
    spec.dtype = t;
    spec.op = op;
    spec.numel = numel;
    const PlanChoice choice = planner.choose(bytes, planner.straggler().rank);
    const GpuCompletion done =
        ex.run(*planner.lower(r, choice, numel, dtype_size(t), ordered), spec, buf, caller, 20s);
    done.stream_wait(caller);  // Work::wait(): the caller's stream waits
    ex.wait(done, spec, 20s);  // synchronize(): the host waits
    dev.enqueue(caller, [&] { std::memcpy(out.data(), buf, bytes); });  // "D2H"
    dev.synchronize(caller);
    if (seq == 0) first = out;
    EXPECT_EQ(first, out) << "rank " << r << ": call " << seq << " differs from call 0";
  }
  dev.free_async(buf, caller);
  dev.synchronize(caller);
  return out;
}

using Case = std::tuple<std::string, int, size_t, bool>;

class HostGpuAllreduce : public ::testing::TestWithParam<Case> {};

TEST_P(HostGpuAllreduce, ExactAgainstFloat64AndIdenticalOnEveryRank) {
  const auto& [algo, n, numel, ordered] = GetParam();
  HostGroup g(n, /*slot_bytes=*/4096, /*slots=*/2);  // messages go in many pieces
  PlannerConfig cfg;
  cfg.algo = *algorithm_from_name(algo);
  cfg.straggler = n > 2 ? Straggler::of_rank(1) : Straggler::none();  // not the generators' canonical n-1
  cfg.max_staging_bytes = 4096;    // forces segmentation where staging is needed
  Planner planner(n, cfg);
  std::vector<std::vector<unsigned char>> out(n);
  const auto errors = run_ranks(n, [&](int r) {
    std::vector<float> in(numel);
    for (size_t i = 0; i < numel; ++i) in[i] = input_value(r, i);
    std::vector<unsigned char> bytes(numel * sizeof(float));
    std::memcpy(bytes.data(), in.data(), bytes.size());
    out[r] = allreduce_on_rank(g, planner, r, bytes, DType::Float32, ReduceOp::Sum, ordered);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ("", errors[r]) << "rank " << r;
  for (size_t i = 0; i < numel; ++i) {
    double ref = 0;
    for (int r = 0; r < n; ++r) ref += input_value(r, i);
    float got;
    std::memcpy(&got, out[0].data() + i * sizeof(float), sizeof got);
    ASSERT_EQ(got, static_cast<float>(ref)) << algo << " n=" << n << " element " << i;
  }
  for (int r = 1; r < n; ++r) EXPECT_EQ(out[0], out[r]) << algo << ": rank " << r << " differs";
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::get<0>(info.param) + "_n" + std::to_string(std::get<1>(info.param)) + "_" +
         std::to_string(std::get<2>(info.param)) + (std::get<3>(info.param) ? "_ordered" : "");
}

INSTANTIATE_TEST_SUITE_P(EveryAlgorithm, HostGpuAllreduce,
                         ::testing::Combine(::testing::Values("auto", "ring", "rhd", "direct",
                                                              "bcast", "stragglar", "optcc",
                                                              "stragglar_direct"),
                                            ::testing::Values(2, 3, 4),
                                            ::testing::Values(size_t{1}, size_t{5003}),
                                            ::testing::Values(false)),
                         case_name);

// Receives that follow a send (ordered receives) instead of staged ones, and a large buffer
// (hundreds of staging pieces per message).
INSTANTIATE_TEST_SUITE_P(OrderedAndLarge, HostGpuAllreduce,
                         ::testing::Values(Case{"stragglar", 4, 5003, true},
                                           Case{"optcc", 3, 5003, true},
                                           Case{"ring", 4, 100003, false},
                                           Case{"stragglar", 4, 100003, false}),
                         case_name);

// ------------------------------------------------------------------------------------------------
// Every dtype x op: inputs whose reduction is exact in any order, reference in float64 / int64.

double float_input(ReduceOp op, int r, size_t i) {
  if (op == ReduceOp::Sum) return static_cast<double>(static_cast<int>((r * 5 + i * 3) % 9) - 4);
  if (op == ReduceOp::Prod) {
    const double v[] = {-2.0, -1.0, 1.0, 2.0, 0.5};
    return v[(r * 3 + i) % 5];
  }
  if ((r + i) % 11 == 0) return (r + i) % 2 ? -0.0 : 0.0;  // signed zeros for MIN/MAX
  return static_cast<double>(static_cast<int>((r * 131 + i * 17) % 61) - 30) / 4;
}

double float_ref(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::Sum:
      return a + b;
    case ReduceOp::Prod:
      return a * b;
    case ReduceOp::Min:
      return (a < b || (a == b && std::signbit(a))) ? a : b;
    default:
      return (a > b || (a == b && !std::signbit(a))) ? a : b;  // Max
  }
}

int64_t int_ref(DType t, ReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case ReduceOp::Sum:
      return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    case ReduceOp::Prod:
      return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    case ReduceOp::Min:
      return std::min(a, b);
    case ReduceOp::Max:
      return std::max(a, b);
    case ReduceOp::BAnd:
      return a & b;
    case ReduceOp::BOr:
      return a | b;
    case ReduceOp::BXor:
      return a ^ b;
  }
  (void)t;
  return 0;
}

void store_float(DType t, unsigned char* p, size_t i, double v) {
  switch (t) {
    case DType::Float32: {
      const float f = static_cast<float>(v);
      std::memcpy(p + 4 * i, &f, 4);
      return;
    }
    case DType::Float64:
      std::memcpy(p + 8 * i, &v, 8);
      return;
    case DType::Float16: {
      const uint16_t h = ops::float_to_half(static_cast<float>(v));
      std::memcpy(p + 2 * i, &h, 2);
      return;
    }
    default: {
      const uint16_t h = ops::float_to_bf16(static_cast<float>(v));
      std::memcpy(p + 2 * i, &h, 2);
      return;
    }
  }
}

// Stores v truncated to the dtype's width (two's complement), Bool as the byte itself.
void store_int(DType t, unsigned char* p, size_t i, int64_t v) {
  const size_t es = dtype_size(t);
  std::memcpy(p + i * es, &v, es);  // little-endian: the low bytes
}

int64_t load_int(DType t, const unsigned char* p, size_t i) {
  const size_t es = dtype_size(t);
  int64_t v = 0;
  std::memcpy(&v, p + i * es, es);
  const bool is_signed =
      t == DType::Int8 || t == DType::Int16 || t == DType::Int32 || t == DType::Int64;
  if (is_signed && es < 8 && (v >> (8 * es - 1)) & 1) v |= ~((int64_t{1} << (8 * es)) - 1);
  return v;
}

// Inputs of rank r and the float64 / int64 reference of all n ranks.
void make_case(DType t, ReduceOp op, int n, size_t numel, int r, std::vector<unsigned char>& in,
               std::vector<unsigned char>& ref) {
  const size_t es = dtype_size(t);
  in.assign(numel * es, 0);
  ref.assign(numel * es, 0);
  std::mt19937_64 rng(1234);
  for (size_t i = 0; i < numel; ++i) {
    if (is_floating(t)) {
      double acc = float_input(op, 0, i);
      for (int q = 1; q < n; ++q) acc = float_ref(op, acc, float_input(op, q, i));
      store_float(t, in.data(), i, float_input(op, r, i));
      store_float(t, ref.data(), i, acc);
    } else if (t == DType::Bool) {
      auto val = [&](int q) { return static_cast<int>((q * 7 + i * 5) % 3); };  // 2: a "true" byte
      int acc = val(0) != 0;
      for (int q = 1; q < n; ++q) {
        const int b = val(q) != 0;
        if (op == ReduceOp::Sum || op == ReduceOp::Max || op == ReduceOp::BOr)
          acc |= b;
        else if (op == ReduceOp::BXor)
          acc ^= b;
        else
          acc &= b;
      }
      in[i] = static_cast<unsigned char>(val(r));
      ref[i] = static_cast<unsigned char>(acc);
    } else {
      std::vector<int64_t> v(n);
      for (int q = 0; q < n; ++q) {
        store_int(t, in.data(), i, static_cast<int64_t>(std::mt19937_64(i * 31 + q)()));
        v[q] = load_int(t, in.data(), i);
      }
      int64_t acc = v[0];
      for (int q = 1; q < n; ++q) acc = int_ref(t, op, acc, v[q]);
      store_int(t, in.data(), i, v[r]);
      store_int(t, ref.data(), i, acc);
    }
  }
}

TEST(HostGpuDtypes, EveryDtypeAndOpExactOnEveryRank) {
  const DType dtypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                          DType::Int8,    DType::UInt8,   DType::Int16,   DType::Int32,
                          DType::Int64,   DType::Bool};
  const ReduceOp ops_[] = {ReduceOp::Sum,  ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                           ReduceOp::BAnd, ReduceOp::BOr,  ReduceOp::BXor};
  const size_t numel = 517;
  for (const auto& [algo, n] : {std::pair<std::string, int>{"stragglar", 4}, {"rhd", 3}}) {
    PlannerConfig cfg;
    cfg.algo = *algorithm_from_name(algo);
    cfg.straggler = n > 2 ? Straggler::of_rank(2) : Straggler::none();
    Planner planner(n, cfg);
    for (DType t : dtypes) {
      for (ReduceOp op : ops_) {
        if (!reduce_supported(t, op)) continue;
        HostGroup g(n, 256, 2);
        std::vector<std::vector<unsigned char>> out(n);
        std::vector<unsigned char> ref;
        const auto errors = run_ranks(n, [&](int r) {
          std::vector<unsigned char> in, my_ref;
          make_case(t, op, n, numel, r, in, my_ref);
          if (r == 0) ref = my_ref;
          out[r] = allreduce_on_rank(g, planner, r, in, t, op, false, 1);
        });
        const std::string what = algo + " " + dtype_name(t) + " " + reduce_op_name(op);
        for (int r = 0; r < n; ++r) ASSERT_EQ("", errors[r]) << what << " rank " << r;
        for (int r = 0; r < n; ++r) ASSERT_EQ(ref, out[r]) << what << ": rank " << r;
      }
    }
  }
}

// PREMUL_SUM and AVG as the backend runs them: scale before, divide after, same stream order.
TEST(HostGpuDtypes, PremulSumThenAverage) {
  const int n = 3;
  const size_t numel = 1001;
  HostGroup g(n);
  Planner planner(n, PlannerConfig{});
  std::vector<std::vector<float>> out(n, std::vector<float>(numel));
  const auto errors = run_ranks(n, [&](int r) {
    host::HostDevice& dev = *g.devices[r];
    host::HostP2P p2p(g.group, r, dev, 10s);
    GpuExecutor ex(p2p, dev);
    const Stream s = ex.stream();
    void* buf = dev.alloc_async(numel * 4, s);
    dev.enqueue(s, [&, buf] {
      for (size_t i = 0; i < numel; ++i) static_cast<float*>(buf)[i] = input_value(r, i);
    });
    CollectiveSpec spec;
    spec.numel = numel;
    dev.scale(DType::Float32, buf, numel, 0.5, s);
    ex.run(*planner.lower(r, planner.choose(numel * 4, -1), numel, 4), spec, buf, s, 10s);
    dev.divide(DType::Float32, buf, numel, n, s);
    dev.enqueue(s, [&, buf] { std::memcpy(out[r].data(), buf, numel * 4); });
    dev.synchronize(s);
    dev.free_async(buf, s);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ("", errors[r]) << "rank " << r;
  for (size_t i = 0; i < numel; ++i) {
    double sum = 0;
    for (int r = 0; r < n; ++r) sum += 0.5 * input_value(r, i);
    const float expect = static_cast<float>(sum) / static_cast<float>(n);  // divide_inplace's rule
    ASSERT_EQ(expect, out[0][i]) << "element " << i;
    for (int r = 1; r < n; ++r) ASSERT_EQ(out[0][i], out[r][i]) << "rank " << r;
  }
}

// A hand-made 2-rank plan through every scratch path: step 0 reduces the peer's first half into
// my second half (scratch + reduce kernel); step 1 swaps halves with the peer while sending the
// same ranges (a staged overwrite and one that follows a send); step 2 is empty.
TEST(HostGpuScratch, ReduceStagedAndFollowsSendPaths) {
  const size_t n = 2 * 1003, h = n / 2;
  HostGroup g(2, 512, 2);
  std::vector<std::vector<float>> out(2, std::vector<float>(n));
  std::vector<uint64_t> kernels(2);
  const auto errors = run_ranks(2, [&](int r) {
    const int p = 1 - r;
    LoweredSchedule plan;
    plan.tag = schedule_tag(Algorithm::Ring);
    LoweredStep s0, s1, s2;
    s0.id = 0;
    s0.sends.push_back(LoweredOp{p, 0, h, false, false, -1});
    s0.recvs.push_back(LoweredOp{p, h, h, true, false, -1});
    s1.id = 1;
    s1.sends.push_back(LoweredOp{p, 0, h, false, false, -1});
    s1.sends.push_back(LoweredOp{p, h, h, false, false, -1});
    s1.recvs.push_back(LoweredOp{p, h, h, false, true, -1});  // staged
    s1.recvs.push_back(LoweredOp{p, 0, h, false, false, 0});  // follows send 0
    s2.id = 2;
    plan.steps = {s0, s1, s2};
    host::HostDevice& dev = *g.devices[r];
    host::HostP2P p2p(g.group, r, dev, 10s);
    GpuExecutor ex(p2p, dev);
    std::vector<float> in(n);
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>((i + 100 * r) % 1000);
    CollectiveSpec spec;
    spec.numel = n;
    ex.wait(ex.run(plan, spec, in.data(), nullptr, 10s), spec, 10s);  // host memory is "device"
    out[r] = in;
    kernels[r] = ex.stats().reduce_kernels;
  });
  ASSERT_EQ("", errors[0]);
  ASSERT_EQ("", errors[1]);
  for (int r = 0; r < 2; ++r) {
    const int p = 1 - r;
    auto in = [&](int q, size_t i) { return static_cast<float>((i + 100 * q) % 1000); };
    // After step 0, rank q holds [a_q, b_q + a_p]. Step 1 swaps with the peer.
    for (size_t i = 0; i < h; ++i) {
      ASSERT_EQ(out[r][i], in(p, h + i) + in(r, i)) << "rank " << r << " element " << i;
      ASSERT_EQ(out[r][h + i], in(p, i)) << "rank " << r << " element " << h + i;
    }
    EXPECT_EQ(1u, kernels[r]);
  }
}

}  // namespace
}  // namespace stragg::gpu
