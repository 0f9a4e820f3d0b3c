// GPU reduction kernels vs the CPU kernels (csrc/runtime/reduce.h), every dtype and op.
// Skipped at runtime without a CUDA device (argument checks run everywhere).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "gpu_test_util.h"
#include "kernels/reduce_kernels.h"
#include "runtime/dtype.h"
#include "runtime/reduce.h"

namespace stragg::gpu {
namespace {

using testing::device_count;
using testing::Tally;

#define SKIP_WITHOUT_GPU() STRAGG_SKIP_WITHOUT_GPU(device_count() > 0)

const DType kDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                         DType::Int8,    DType::UInt8,   DType::Int16,   DType::Int32,
                         DType::Int64,   DType::Bool};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                         ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor};

float f16_to_float(DType t, uint16_t h) {
  if (t == DType::BFloat16) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return m ? NAN : (h & 0x8000 ? -INFINITY : INFINITY);
  return (h & 0x8000 ? -1.0f : 1.0f) * (e ? std::ldexp(1.0f + m / 1024.0f, static_cast<int>(e) - 15)
                                          : std::ldexp(m / 1024.0f, -14));
}

bool is_nan(DType t, const uint8_t* p, size_t i) {
  switch (t) {
    case DType::Float32: {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return std::isnan(v);
    }
    case DType::Float64: {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      return std::isnan(v);
    }
    case DType::Float16:
    case DType::BFloat16: {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      return std::isnan(f16_to_float(t, v));
    }
    default:
      return false;
  }
}

// Random elements with the interesting cases mixed in: random bit patterns (NaN payloads, infs,
// subnormals), signed zeros, small integers (exact sums), +-inf, quiet NaN.
void fill(DType t, std::vector<uint8_t>& v, std::mt19937_64& rng) {
  const size_t es = dtype_size(t);
  const size_t n = v.size() / es;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    const int kind = static_cast<int>(r % 8);
    uint64_t bits = rng();
    if (t == DType::Bool) {
      v[i] = static_cast<uint8_t>(bits % 3);  // 2: a non-canonical true
      continue;
    }
    if (is_floating(t)) {
      double x = 0;
      bool use_bits = kind >= 5;
      if (kind == 0) x = 0.0;
      else if (kind == 1) x = -0.0;
      else if (kind == 2) x = static_cast<double>(static_cast<int>(r >> 8) % 64 - 32);
      else if (kind == 3) x = (r >> 8) % 2 ? INFINITY : -INFINITY;
      else if (kind == 4) x = (r >> 8) % 4 ? 1.5 * static_cast<double>((r >> 16) % 100) : NAN;
      if (!use_bits) {
        if (t == DType::Float32) {
          const float f = static_cast<float>(x);
          std::memcpy(&v[i * 4], &f, 4);
        } else if (t == DType::Float64) {
          std::memcpy(&v[i * 8], &x, 8);
        } else {
          // Through float32: exact for these values in both 16-bit formats.
          const float f = static_cast<float>(x);
          uint32_t u;
          std::memcpy(&u, &f, 4);
          uint16_t h;
          if (t == DType::BFloat16) {
            h = static_cast<uint16_t>(u >> 16);
          } else if (std::isnan(f)) {
            h = 0x7e00;
          } else if (std::isinf(f)) {
            h = f > 0 ? 0x7c00 : 0xfc00;
          } else if (f == 0) {
            h = std::signbit(f) ? 0x8000 : 0;
          } else {
            const int ex = std::ilogb(f);
            const uint32_t mant = static_cast<uint32_t>(std::ldexp(std::fabs(f), 10 - ex)) & 0x3ff;
            h = static_cast<uint16_t>((f < 0 ? 0x8000 : 0) | ((ex + 15) << 10) | mant);
          }
          std::memcpy(&v[i * 2], &h, 2);
        }
        continue;
      }
    }
    std::memcpy(&v[i * es], &bits, es);
  }
}

struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(size_t bytes) {
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) throw Error("cudaMalloc failed");
  }
  ~DeviceBuf() { cudaFree(p); }
  uint8_t* at(size_t byte_offset) const { return static_cast<uint8_t*>(p) + byte_offset; }
};

void h2d(void* d, const void* h, size_t n) {
  ASSERT_EQ(cudaSuccess, cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
}
void d2h(void* h, const void* d, size_t n) {
  ASSERT_EQ(cudaSuccess, cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
}

// Bitwise, except that a NaN produced by arithmetic (SUM/PROD/scale/divide) only needs to be NaN.
// Every mismatch is counted, the first 5 of a comparison are reported.
void expect_same(DType t, const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu,
                 bool arithmetic, const std::string& what) {
  const size_t es = dtype_size(t);
  const size_t n = cpu.size() / es;
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&cpu[i * es], &gpu[i * es], es) == 0) continue;
    if (arithmetic && is_nan(t, cpu.data(), i) && is_nan(t, gpu.data(), i)) continue;
    if (++bad > 5) continue;
    uint64_t c = 0, g = 0;
    std::memcpy(&c, &cpu[i * es], es);
    std::memcpy(&g, &gpu[i * es], es);
    ADD_FAILURE() << what << ": element " << i << " cpu 0x" << std::hex << c << " gpu 0x" << g;
  }
  if (bad > 5) ADD_FAILURE() << what << ": " << bad << " of " << n << " elements differ";
  Tally::add("elements_compared", n);
  Tally::add("bitwise_mismatches", bad);
}

TEST(GpuReduce, ArgumentErrorsThrowWithoutTouchingTheDevice) {
  float* fake = reinterpret_cast<float*>(uintptr_t{1} << 20);
  EXPECT_THROW(reduce_into(DType::Float32, ReduceOp::BAnd, fake, fake + 64, 16, nullptr), Error);
  EXPECT_THROW(reduce_into(DType::Float32, ReduceOp::Sum, fake, fake + 1, 16, nullptr), Error);
  EXPECT_THROW(reduce(DType::Int32, ReduceOp::Sum, fake, fake + 64, fake + 8, 16, nullptr), Error);
  EXPECT_THROW(scale(DType::Int32, fake, 16, 0.5, nullptr), Error);
  EXPECT_THROW(divide(DType::Bool, fake, 16, 2, nullptr), Error);
  EXPECT_THROW(divide(DType::Int32, fake, 16, 0, nullptr), Error);
  // Misaligned for the element size.
  EXPECT_THROW(reduce_into(DType::Float32, ReduceOp::Sum, reinterpret_cast<uint8_t*>(fake) + 2,
                           fake + 64, 16, nullptr),
               Error);
  // Zero elements: nothing to do, nothing enqueued.
  EXPECT_NO_THROW(reduce_into(DType::Float32, ReduceOp::Sum, fake, fake + 64, 0, nullptr));
}

TEST(GpuReduce, MatchesCpuForEveryDtypeAndOp) {
  SKIP_WITHOUT_GPU();
  Tally tally({"elements_compared", "bitwise_mismatches"});
  std::mt19937_64 rng(1234);
  const size_t counts[] = {1, 7, 33, 1000, 4099, (size_t{1} << 18) + 5};
  for (DType t : kDTypes) {
    const size_t es = dtype_size(t);
    for (ReduceOp op : kOps) {
      if (!stragg::reduce_supported(t, op)) {
        EXPECT_THROW(gpu::reduce_into(t, op, nullptr, nullptr, 1, nullptr), Error);
        continue;
      }
      const bool arith = op == ReduceOp::Sum || op == ReduceOp::Prod;
      // A (dtype, op) that differs is reported at its first differing comparison; the others
      // still run, so one run shows every (dtype, op) that differs.
      const size_t mismatches_before = tally.get("bitwise_mismatches");
      bool differs = false;
      for (size_t count : counts) {
        if (differs) break;
        // (dst offset, src offset) in elements: co-aligned (vector body) and not (scalar only).
        for (auto [od, os] : {std::pair<size_t, size_t>{0, 0}, {1, 1}, {3, 3}, {0, 1}, {2, 5}}) {
          const std::string what = std::string(dtype_name(t)) + " " + reduce_op_name(op) +
                                   " count " + std::to_string(count) + " offsets " +
                                   std::to_string(od) + "/" + std::to_string(os);
          std::vector<uint8_t> a(count * es), b(count * es);
          fill(t, a, rng);
          fill(t, b, rng);
          std::vector<uint8_t> ref = a;
          stragg::reduce_into(t, op, ref.data(), b.data(), count);  // the CPU path
          DeviceBuf da((count + 8) * es), db((count + 8) * es), dout((count + 8) * es);
          h2d(da.at(od * es), a.data(), a.size());
          h2d(db.at(os * es), b.data(), b.size());
          // In place.
          gpu::reduce_into(t, op, da.at(od * es), db.at(os * es), count, nullptr);
          ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize()) << what;
          std::vector<uint8_t> got(a.size());
          d2h(got.data(), da.at(od * es), got.size());
          expect_same(t, ref, got, arith, what + " in place");
          // Out of place (a restored first), output at yet another alignment.
          h2d(da.at(od * es), a.data(), a.size());
          gpu::reduce(t, op, dout.at(((od + os) % 4) * es), da.at(od * es), db.at(os * es), count,
                      nullptr);
          ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize()) << what;
          d2h(got.data(), dout.at(((od + os) % 4) * es), got.size());
          expect_same(t, ref, got, arith, what + " out of place");
          std::vector<uint8_t> a_after(a.size());
          d2h(a_after.data(), da.at(od * es), a_after.size());
          ASSERT_EQ(0, std::memcmp(a.data(), a_after.data(), a.size())) << what << ": input changed";
          if (::testing::Test::HasFatalFailure()) return;  // a CUDA call failed: stop
          if (tally.get("bitwise_mismatches") != mismatches_before) {
            differs = true;
            break;
          }
        }
      }
    }
  }
}

TEST(GpuReduce, ScaleAndDivideMatchCpu) {
  SKIP_WITHOUT_GPU();
  Tally tally({"elements_compared", "bitwise_mismatches"});
  std::mt19937_64 rng(99);
  const size_t count = 100003;
  for (DType t : kDTypes) {
    const size_t es = dtype_size(t);
    std::vector<uint8_t> a(count * es);
    fill(t, a, rng);
    DeviceBuf d((count + 4) * es);
    std::vector<uint8_t> got(a.size());
    if (is_floating(t)) {
      for (double factor : {0.5, 3.0, 1.0 / 3.0, -1e-3}) {
        std::vector<uint8_t> ref = a;
        stragg::scale_inplace(t, ref.data(), count, factor);
        h2d(d.at(es), a.data(), a.size());
        scale(t, d.at(es), count, factor, nullptr);
        ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
        d2h(got.data(), d.at(es), got.size());
        expect_same(t, ref, got, true, std::string(dtype_name(t)) + " scale " + std::to_string(factor));
      }
    } else {
      EXPECT_THROW(scale(t, d.p, count, 2.0, nullptr), Error);
    }
    if (t == DType::Bool) {
      EXPECT_THROW(divide(t, d.p, count, 2, nullptr), Error);
      continue;
    }
    for (int64_t divisor : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{-1},
                            int64_t{-4}, int64_t{1} << 20, int64_t{1} << 40}) {
      std::vector<uint8_t> ref = a;
      stragg::divide_inplace(t, ref.data(), count, divisor);
      h2d(d.p, a.data(), a.size());
      divide(t, d.p, count, divisor, nullptr);
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      d2h(got.data(), d.p, got.size());
      expect_same(t, ref, got, true, std::string(dtype_name(t)) + " divide " + std::to_string(divisor));
    }
  }
}

// MIN/MAX must not depend on operand order (ranks may reduce a pair from opposite sides), signed
// zeros and a NaN against a number included.
TEST(GpuReduce, MinMaxIndependentOfOperandOrder) {
  SKIP_WITHOUT_GPU();
  Tally tally({"elements_compared", "bitwise_mismatches"});
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    const size_t es = dtype_size(t);
    // Pairs: (+0, -0), (-0, +0), (NaN, 1), (1, NaN), (-inf, +inf), (x, x).
    std::vector<double> xs = {0.0, -0.0, NAN, 1.0, -INFINITY, 2.5};
    std::vector<double> ys = {-0.0, 0.0, 1.0, NAN, INFINITY, 2.5};
    auto encode = [&](const std::vector<double>& v) {
      std::vector<uint8_t> out(v.size() * es);
      for (size_t i = 0; i < v.size(); ++i) {
        const float f = static_cast<float>(v[i]);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if (t == DType::Float32) std::memcpy(&out[i * 4], &f, 4);
        else if (t == DType::Float64) std::memcpy(&out[i * 8], &v[i], 8);
        else {
          uint16_t h = t == DType::BFloat16 ? static_cast<uint16_t>(u >> 16) : 0;
          if (t == DType::Float16) {
            if (std::isnan(f)) h = 0x7e00;
            else if (std::isinf(f)) h = f > 0 ? 0x7c00 : 0xfc00;
            else if (f == 0) h = std::signbit(f) ? 0x8000 : 0;
            else h = f == 1.0f ? 0x3c00 : 0x4100;  // 1.0, 2.5
          }
          std::memcpy(&out[i * 2], &h, 2);
        }
      }
      return out;
    };
    const auto x = encode(xs), y = encode(ys);
    DeviceBuf dx(x.size()), dy(y.size()), o1(x.size()), o2(x.size());
    h2d(dx.p, x.data(), x.size());
    h2d(dy.p, y.data(), y.size());
    for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
      reduce(t, op, o1.p, dx.p, dy.p, xs.size(), nullptr);
      reduce(t, op, o2.p, dy.p, dx.p, xs.size(), nullptr);
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      std::vector<uint8_t> r1(x.size()), r2(x.size());
      d2h(r1.data(), o1.p, r1.size());
      d2h(r2.data(), o2.p, r2.size());
      EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size()))
          << dtype_name(t) << " " << reduce_op_name(op);
      std::vector<uint8_t> ref = x;
      stragg::reduce_into(t, op, ref.data(), y.data(), xs.size());
      expect_same(t, ref, r1, false, std::string(dtype_name(t)) + " " + reduce_op_name(op));
    }
  }
}

}  // namespace
}  // namespace stragg::gpu
