// The CUDA reduction kernels' element loop (kernels/reduce_loop.h: scalar head, 16-byte vector
// body, scalar tail, grid-stride threads) run on the host over the shared functors, bitwise
// against the CPU reduction (csrc/runtime/reduce.h), for every dtype x op, scale and divide, at
// aligned, equally misaligned and differently misaligned pointers, odd lengths and several grid
// sizes. NaNs included (the host computes both sides with the same IEEE hardware), except the
// payload of SUM / PROD of two NaNs, which depends on the operand order the compiler picked for
// the commutative instruction (either NaN is IEEE-correct).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/host/host_kernels.h"
#include "kernels/reduce_launch.h"
#include "runtime/dtype.h"
#include "runtime/reduce.h"

namespace stragg::gpu {
namespace {

const DType kDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                         DType::Int8,    DType::UInt8,   DType::Int16,   DType::Int32,
                         DType::Int64,   DType::Bool};
const ReduceOp kOps[] = {ReduceOp::Sum,  ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                         ReduceOp::BAnd, ReduceOp::BOr,  ReduceOp::BXor};
const size_t kCounts[] = {1, 2, 7, 15, 16, 17, 31, 33, 257, 1001};

// Grids: one thread, a few, one block, and the launch's own size for a small virtual GPU.
std::vector<host::VirtualGrid> grids() { return {{1, 1}, {1, 3}, {1, 256}, {2, 0}}; }

// Element patterns that matter: random bits (NaN payloads, infinities, subnormals), signed zeros,
// small integers (exact arithmetic), equal pairs; Bool bytes 0, 1 and a non-canonical 2.
void fill(DType t, unsigned char* p, size_t n, std::mt19937_64& rng) {
  const size_t es = dtype_size(t);
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits = rng();
    const int kind = static_cast<int>(rng() % 6);
    if (t == DType::Bool) {
      p[i] = static_cast<unsigned char>(bits % 3);
      continue;
    }
    if (is_floating(t) && kind == 1) {  // signed zero
      bits = (bits & 1) ? (uint64_t{1} << (8 * es - 1)) : 0;
    } else if (kind == 2) {  // small integer or small float
      if (t == DType::Float32) {
        const float f = static_cast<float>(static_cast<int>(bits % 9) - 4);
        std::memcpy(&bits, &f, 4);
      } else if (t == DType::Float64) {
        const double d = static_cast<double>(static_cast<int>(bits % 9) - 4);
        std::memcpy(&bits, &d, 8);
      } else if (t == DType::Float16) {
        bits = 0x3c00 | ((bits & 1) << 15);  // +-1
      } else if (t == DType::BFloat16) {
        bits = 0x4000 | ((bits & 1) << 15);  // +-2
      } else {
        bits = bits % 7;
      }
    }
    std::memcpy(p + i * es, &bits, es);
  }
}

bool is_nan(DType t, const unsigned char* p, size_t i) {
  switch (t) {
    case DType::Float32: {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      return f != f;
    }
    case DType::Float64: {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      return d != d;
    }
    case DType::Float16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return (h & 0x7fff) > 0x7c00;
    }
    case DType::BFloat16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return (h & 0x7fff) > 0x7f80;
    }
    default:
      return false;
  }
}

// Index of the first element where got differs from expect (-1: none), allowing only a NaN for
// a NaN where SUM / PROD combined two NaNs.
long first_mismatch(DType t, ReduceOp op, const unsigned char* expect, const unsigned char* got,
                    const unsigned char* a, const unsigned char* b, size_t count) {
  const size_t es = dtype_size(t);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(expect + i * es, got + i * es, es) == 0) continue;
    const bool two_nans = (op == ReduceOp::Sum || op == ReduceOp::Prod) && is_nan(t, a, i) &&
                          is_nan(t, b, i) && is_nan(t, expect, i) && is_nan(t, got, i);
    if (!two_nans) return static_cast<long>(i);
  }
  return -1;
}

std::string where(DType t, const char* op, size_t count, size_t off_d, size_t off_s,
                  const host::VirtualGrid& g) {
  return std::string(dtype_name(t)) + " " + op + " count " + std::to_string(count) +
         " offsets (elements) " + std::to_string(off_d) + "/" + std::to_string(off_s) +
         " grid threads " + std::to_string(g.threads) + " sms " + std::to_string(g.sm_count);
}

// Buffers with room for an offset of up to 16 bytes; offsets in elements.
struct Buffers {
  std::vector<unsigned char> d, s;
  explicit Buffers(size_t bytes) : d(bytes + 64), s(bytes + 64) {}
  unsigned char* dp(size_t byte_off) { return align16(d.data()) + byte_off; }
  unsigned char* sp(size_t byte_off) { return align16(s.data()) + byte_off; }
  static unsigned char* align16(unsigned char* p) {
    return p + ((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15);
  }
};

// Offsets (in elements) of dst and src: aligned, equally misaligned (scalar head), differently
// misaligned (all scalar).
std::vector<std::pair<size_t, size_t>> offsets(size_t es) {
  std::vector<std::pair<size_t, size_t>> v = {{0, 0}};
  if (es < 16) {
    v.push_back({1, 1});
    v.push_back({0, 1});
    v.push_back({16 / es - 1, 16 / es - 1});
  }
  return v;
}

TEST(KernelLoop, LayoutSplitsHeadBodyTail) {
  alignas(16) unsigned char buf[64];
  Layout l = layout_for(4, 100, {buf, buf + 16});
  EXPECT_EQ(l.head, 0u);
  EXPECT_EQ(l.nvec, 25u);
  l = layout_for(4, 100, {buf + 4, buf + 20});  // same misalignment: 3-element head
  EXPECT_EQ(l.head, 3u);
  EXPECT_EQ(l.nvec, 24u);
  l = layout_for(4, 100, {buf + 4, buf + 8});  // different: all scalar
  EXPECT_EQ(l.head, 0u);
  EXPECT_EQ(l.nvec, 0u);
  l = layout_for(2, 5, {buf + 2, buf + 2});  // head longer than the buffer
  EXPECT_EQ(l.head, 5u);
  EXPECT_EQ(l.nvec, 0u);
  // One thread per vector (or scalar element), at most 8 blocks per SM.
  EXPECT_EQ(grid_blocks(layout_for(4, 1000, {buf}), 1000, 4, 132), 1u);
  EXPECT_EQ(grid_blocks(layout_for(4, size_t{1} << 30, {buf}), size_t{1} << 30, 4, 132), 1056u);
}

TEST(KernelLoop, ReduceMatchesCpuBitwiseForEveryDtypeAndOp) {
  std::mt19937_64 rng(7);
  for (DType t : kDTypes) {
    const size_t es = dtype_size(t);
    for (ReduceOp op : kOps) {
      if (!reduce_supported(t, op)) continue;
      for (size_t count : kCounts) {
        for (auto [od, os] : offsets(es)) {
          for (const host::VirtualGrid& g : grids()) {
            Buffers b(count * es);
            unsigned char* d = b.dp(od * es);
            unsigned char* s = b.sp(os * es);
            fill(t, d, count, rng);
            fill(t, s, count, rng);
            const std::vector<unsigned char> in(d, d + count * es);
            std::vector<unsigned char> expect = in;
            reduce_into(t, op, expect.data(), s, count);
            host::reduce_into(t, op, d, s, count, g);
            ASSERT_EQ(-1, first_mismatch(t, op, expect.data(), d, in.data(), s, count))
                << where(t, reduce_op_name(op), count, od, os, g);
          }
        }
      }
    }
  }
}

// out = a op b with out distinct from both, and in place on b (the operand order stays a, b).
TEST(KernelLoop, OutOfPlaceAndInPlaceOnSecondOperand) {
  std::mt19937_64 rng(11);
  for (DType t : kDTypes) {
    const size_t es = dtype_size(t);
    for (ReduceOp op : kOps) {
      if (!reduce_supported(t, op)) continue;
      const size_t count = 203;
      std::vector<unsigned char> a(count * es), b(count * es), out(count * es);
      fill(t, a.data(), count, rng);
      fill(t, b.data(), count, rng);
      std::vector<unsigned char> expect = a;
      reduce_into(t, op, expect.data(), b.data(), count);
      host::reduce(t, op, out.data(), a.data(), b.data(), count);
      EXPECT_EQ(-1, first_mismatch(t, op, expect.data(), out.data(), a.data(), b.data(), count))
          << dtype_name(t) << " " << reduce_op_name(op) << " out of place";
      const std::vector<unsigned char> b_in = b;
      host::reduce(t, op, b.data(), a.data(), b.data(), count);
      EXPECT_EQ(-1, first_mismatch(t, op, expect.data(), b.data(), a.data(), b_in.data(), count))
          << dtype_name(t) << " " << reduce_op_name(op) << " out == b";
    }
  }
}

TEST(KernelLoop, ScaleMatchesCpuBitwise) {
  std::mt19937_64 rng(3);
  const double factors[] = {0.5, 1.0 / 3.0, -2.5, 1e-30, 3e38, 65504.0};
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    const size_t es = dtype_size(t);
    for (double f : factors) {
      for (size_t count : kCounts) {
        for (auto [od, os] : offsets(es)) {
          (void)os;
          for (const host::VirtualGrid& g : grids()) {
            Buffers b(count * es);
            unsigned char* d = b.dp(od * es);
            fill(t, d, count, rng);
            std::vector<unsigned char> expect(d, d + count * es);
            scale_inplace(t, expect.data(), count, f);
            host::scale(t, d, count, f, g);
            ASSERT_EQ(0, std::memcmp(expect.data(), d, count * es))
                << where(t, "scale", count, od, 0, g) << " factor " << f;
          }
        }
      }
    }
  }
}

TEST(KernelLoop, DivideMatchesCpuBitwise) {
  std::mt19937_64 rng(5);
  const int64_t divisors[] = {
      1, -1, 2, 3, -7, 4, -8, 65536, 65537, int64_t{1} << 33, -(int64_t{1} << 40)};
  for (DType t : kDTypes) {
    if (t == DType::Bool) continue;
    const size_t es = dtype_size(t);
    for (int64_t dv : divisors) {
      for (size_t count : kCounts) {
        for (auto [od, os] : offsets(es)) {
          (void)os;
          Buffers b(count * es);
          unsigned char* d = b.dp(od * es);
          fill(t, d, count, rng);
          std::vector<unsigned char> expect(d, d + count * es);
          divide_inplace(t, expect.data(), count, dv);
          host::divide(t, d, count, dv);
          ASSERT_EQ(0, std::memcmp(expect.data(), d, count * es))
              << where(t, "divide", count, od, 0, host::VirtualGrid{}) << " divisor " << dv;
        }
      }
    }
  }
  // Floats divide by zero like the CPU (infinities and NaNs).
  std::vector<float> f = {1.0f, -2.0f, 0.0f}, g = f;
  divide_inplace(DType::Float32, f.data(), f.size(), 0);
  host::divide(DType::Float32, g.data(), g.size(), 0);
  EXPECT_EQ(0, std::memcmp(f.data(), g.data(), f.size() * sizeof(float)));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The argument checks the CUDA launches make (shared code), with their messages.
TEST(KernelLoop, ArgumentErrorsNameTheCallOpAndDtype) {
  alignas(16) float buf[64] = {};
  EXPECT_EQ(error_of([&] { host::reduce_into(DType::Float32, ReduceOp::BAnd, buf, buf + 32, 16); }),
            "stragg: gpu reduce: op BAND is not supported for dtype float32");
  EXPECT_EQ(error_of([&] { host::reduce_into(DType::Float32, ReduceOp::Sum, buf, buf + 1, 16); }),
            "stragg: gpu reduce SUM float32 (16 elements): output and input overlap partially");
  const std::string misaligned = error_of([&] {
    host::reduce_into(DType::Float32, ReduceOp::Sum, reinterpret_cast<char*>(buf) + 2, buf + 32, 4);
  });
  EXPECT_NE(misaligned.find("stragg: gpu reduce SUM float32 (4 elements): pointer "),
            std::string::npos)
      << misaligned;
  EXPECT_NE(misaligned.find("is not aligned to the element size"), std::string::npos);
  EXPECT_EQ(error_of([&] { host::scale(DType::Int32, buf, 16, 0.5); }),
            "stragg: gpu scale (PREMUL_SUM) is not supported for dtype int32");
  EXPECT_EQ(error_of([&] { host::divide(DType::Bool, buf, 16, 2); }),
            "stragg: gpu divide (AVG) is not supported for dtype bool");
  EXPECT_EQ(error_of([&] { host::divide(DType::Int32, buf, 16, 0); }),
            "stragg: gpu divide (AVG): integer division by zero for dtype int32");
  // Zero elements: nothing to check but the (dtype, op) pair, nothing done.
  EXPECT_EQ(error_of([&] { host::reduce_into(DType::Int8, ReduceOp::Sum, nullptr, nullptr, 0); }),
            "");
}

}  // namespace
}  // namespace stragg::gpu
