// Tests for the element-wise reduction kernels (csrc/runtime/reduce.cc) and dtype helpers.
//
// Every kernel is checked against a deliberately naive reference written here (16-bit float
// conversions are re-derived with double arithmetic, not bit tricks), on every ISA variant the CPU
// offers, and the variants are checked bit-for-bit against each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "runtime/dtype.h"
#include "runtime/reduce.h"

// Test hooks defined in csrc/runtime/reduce.cc. isa 0 = portable, 1 = AVX2+F16C (x86 only).
namespace stragg {
namespace detail {
bool kernel_isa_available(int isa);
int kernel_isa_selected();
void reduce_into_isa(int isa, DType t, ReduceOp op, void* dst, const void* src, size_t count);
void scale_inplace_isa(int isa, DType t, void* buf, size_t count, double factor);
void divide_inplace_isa(int isa, DType t, void* buf, size_t count, int64_t divisor);
void f16_to_f32_isa(int isa, DType t, const uint16_t* in, float* out, size_t count);
void f32_to_f16_isa(int isa, DType t, const float* in, uint16_t* out, size_t count);
}  // namespace detail
}  // namespace stragg

namespace {

using stragg::DType;
using stragg::ReduceOp;

const DType kAllDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                            DType::Int8,    DType::UInt8,   DType::Int16,   DType::Int32,
                            DType::Int64,   DType::Bool};
const ReduceOp kAllOps[] = {ReduceOp::Sum,  ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                            ReduceOp::BAnd, ReduceOp::BOr,  ReduceOp::BXor};

std::vector<int> available_isas() {
  std::vector<int> v;
  for (int isa = 0; isa < 2; ++isa) {
    if (stragg::detail::kernel_isa_available(isa)) v.push_back(isa);
  }
  return v;
}

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float ffrom(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint64_t dbits(double f) {
  uint64_t u;
  std::memcpy(&u, &f, 8);
  return u;
}

// ------------------------------------------------------------------------------------------------
// Reference 16-bit float conversions, written with double arithmetic.

// NaN convention of the kernels (and of F16C): quiet NaN, sign and top payload bits kept.
float ref_half_to_float(uint16_t h) {
  const bool neg = (h & 0x8000) != 0;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 0x1f) {
    if (m == 0) return neg ? -INFINITY : INFINITY;
    return ffrom((neg ? 0x80000000u : 0u) | 0x7fc00000u | (static_cast<uint32_t>(m) << 13));
  }
  double v = e == 0 ? std::ldexp(static_cast<double>(m), -24) : std::ldexp(1024.0 + m, e - 25);
  return static_cast<float>(neg ? -v : v);
}

uint16_t ref_float_to_half(float f) {
  const uint32_t x = fbits(f);
  const uint16_t sign = (x & 0x80000000u) ? 0x8000 : 0;
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00 | ((x >> 13) & 0x3ff));
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return sign | 0x7c00;
  int e = 0;
  std::frexp(a, &e);                         // a = m * 2^e, m in [0.5, 1)
  const int ex = std::max(e - 1, -14);        // exponent of the half binade (subnormals: -14)
  const double quantum = std::ldexp(1.0, ex - 10);
  const double r = std::nearbyint(a / quantum) * quantum;  // ties to even (default rounding)
  if (r >= 65536.0) return sign | 0x7c00;
  if (r < std::ldexp(1.0, -14)) return static_cast<uint16_t>(sign | static_cast<uint16_t>(r * 16777216.0));
  std::frexp(r, &e);
  const int E = e - 1;
  const int mant = static_cast<int>((std::ldexp(r, -E) - 1.0) * 1024.0);
  return static_cast<uint16_t>(sign | ((E + 15) << 10) | mant);
}

float ref_bf16_to_float(uint16_t b) {
  const bool neg = (b & 0x8000) != 0;
  const int e = (b >> 7) & 0xff;
  const int m = b & 0x7f;
  if (e == 0xff) {
    if (m == 0) return neg ? -INFINITY : INFINITY;
    return ffrom(static_cast<uint32_t>(b) << 16);  // bf16 -> float is a plain shift, even for NaN
  }
  double v = e == 0 ? std::ldexp(static_cast<double>(m), -133) : std::ldexp(128.0 + m, e - 134);
  return static_cast<float>(neg ? -v : v);
}

uint16_t ref_float_to_bf16(float f) {
  const uint32_t x = fbits(f);
  const uint16_t sign = (x & 0x80000000u) ? 0x8000 : 0;
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40);
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return sign | 0x7f80;
  int e = 0;
  std::frexp(a, &e);
  const int ex = std::max(e - 1, -126);
  const double quantum = std::ldexp(1.0, ex - 7);
  const double r = std::nearbyint(a / quantum) * quantum;
  if (r >= std::ldexp(1.0, 128)) return sign | 0x7f80;
  return static_cast<uint16_t>(sign | (fbits(static_cast<float>(r)) >> 16));
}

float ref_to_float(DType t, uint16_t v) {
  return t == DType::Float16 ? ref_half_to_float(v) : ref_bf16_to_float(v);
}
uint16_t ref_from_float(DType t, float f) {
  return t == DType::Float16 ? ref_float_to_half(f) : ref_float_to_bf16(f);
}

// ------------------------------------------------------------------------------------------------
// Reference reductions.

template <class F>
F ref_float_op(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::Sum: return a + b;
    case ReduceOp::Prod: return a * b;
    case ReduceOp::Min:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      if (a == b) return std::signbit(a) ? a : b;  // min(-0, +0) = -0 either way round
      return a < b ? a : b;
    case ReduceOp::Max:
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      if (a == b) return std::signbit(a) ? b : a;  // max(-0, +0) = +0 either way round
      return a > b ? a : b;
    default: ADD_FAILURE() << "bitwise op on float"; return a;
  }
}

template <class T>
T ref_int_op(ReduceOp op, T a, T b) {
  const uint64_t ua = static_cast<uint64_t>(static_cast<int64_t>(a));
  const uint64_t ub = static_cast<uint64_t>(static_cast<int64_t>(b));
  switch (op) {
    case ReduceOp::Sum: return static_cast<T>(ua + ub);
    case ReduceOp::Prod: return static_cast<T>(ua * ub);
    case ReduceOp::Min: return a < b ? a : b;
    case ReduceOp::Max: return a > b ? a : b;
    case ReduceOp::BAnd: return static_cast<T>(ua & ub);
    case ReduceOp::BOr: return static_cast<T>(ua | ub);
    case ReduceOp::BXor: return static_cast<T>(ua ^ ub);
  }
  return a;
}

uint8_t ref_bool_op(ReduceOp op, uint8_t a, uint8_t b) {
  const bool x = a != 0, y = b != 0;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
    case ReduceOp::BOr: return x || y;
    case ReduceOp::Prod:
    case ReduceOp::Min:
    case ReduceOp::BAnd: return x && y;
    case ReduceOp::BXor: return x != y;
  }
  return 0;
}

template <class T>
T load(const unsigned char* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void store(unsigned char* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

template <class T>
void ref_reduce_int(ReduceOp op, unsigned char* d, const unsigned char* s, size_t n) {
  for (size_t i = 0; i < n; ++i) store<T>(d, i, ref_int_op<T>(op, load<T>(d, i), load<T>(s, i)));
}

void ref_reduce(DType t, ReduceOp op, unsigned char* d, const unsigned char* s, size_t n) {
  switch (t) {
    case DType::Float32:
      for (size_t i = 0; i < n; ++i) store<float>(d, i, ref_float_op(op, load<float>(d, i), load<float>(s, i)));
      return;
    case DType::Float64:
      for (size_t i = 0; i < n; ++i) store<double>(d, i, ref_float_op(op, load<double>(d, i), load<double>(s, i)));
      return;
    case DType::Float16:
    case DType::BFloat16:
      for (size_t i = 0; i < n; ++i) {
        const float a = ref_to_float(t, load<uint16_t>(d, i));
        const float b = ref_to_float(t, load<uint16_t>(s, i));
        store<uint16_t>(d, i, ref_from_float(t, ref_float_op(op, a, b)));
      }
      return;
    case DType::Int8: ref_reduce_int<int8_t>(op, d, s, n); return;
    case DType::UInt8: ref_reduce_int<uint8_t>(op, d, s, n); return;
    case DType::Int16: ref_reduce_int<int16_t>(op, d, s, n); return;
    case DType::Int32: ref_reduce_int<int32_t>(op, d, s, n); return;
    case DType::Int64: ref_reduce_int<int64_t>(op, d, s, n); return;
    case DType::Bool:
      for (size_t i = 0; i < n; ++i) store<uint8_t>(d, i, ref_bool_op(op, load<uint8_t>(d, i), load<uint8_t>(s, i)));
      return;
  }
}

// Element equality: bitwise, except that any NaN equals any NaN (NaN payloads produced by
// arithmetic are the hardware's business; the ISA-vs-ISA test checks them bit-for-bit).
bool elem_equal(DType t, const unsigned char* a, const unsigned char* b, size_t i) {
  const size_t es = stragg::dtype_size(t);
  if (std::memcmp(a + i * es, b + i * es, es) == 0) return true;
  switch (t) {
    case DType::Float32: return std::isnan(load<float>(a, i)) && std::isnan(load<float>(b, i));
    case DType::Float64: return std::isnan(load<double>(a, i)) && std::isnan(load<double>(b, i));
    case DType::Float16:
    case DType::BFloat16:
      return std::isnan(ref_to_float(t, load<uint16_t>(a, i))) && std::isnan(ref_to_float(t, load<uint16_t>(b, i)));
    default: return false;
  }
}

bool is_nan_elem(DType t, const unsigned char* p, size_t i) {
  switch (t) {
    case DType::Float32: return std::isnan(load<float>(p, i));
    case DType::Float64: return std::isnan(load<double>(p, i));
    case DType::Float16:
    case DType::BFloat16: return std::isnan(ref_to_float(t, load<uint16_t>(p, i)));
    default: return false;
  }
}

std::string elem_hex(DType t, const unsigned char* p, size_t i) {
  const size_t es = stragg::dtype_size(t);
  std::string s = "0x";
  static const char* digits = "0123456789abcdef";
  for (size_t k = es; k-- > 0;) {
    s += digits[p[i * es + k] >> 4];
    s += digits[p[i * es + k] & 15];
  }
  return s;
}

// Random test data: integers use all bits, Bool is 0/1, 16-bit floats use all bit patterns
// (NaN/inf/subnormals included), float32/64 mix magnitudes, signed zeros, infinities and NaNs.
void fill_random(DType t, unsigned char* p, size_t n, std::mt19937_64& rng, bool allow_nan = true) {
  const size_t es = stragg::dtype_size(t);
  for (size_t i = 0; i < n * es; ++i) p[i] = static_cast<unsigned char>(rng());
  std::uniform_real_distribution<double> uni(-1000.0, 1000.0);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    const int kind = static_cast<int>(r % 64);
    switch (t) {
      case DType::Bool: store<uint8_t>(p, i, static_cast<uint8_t>(r & 1)); break;
      case DType::Float32:
      case DType::Float64: {
        double v;
        if (kind == 0) v = 0.0;
        else if (kind == 1) v = -0.0;
        else if (kind == 2) v = INFINITY;
        else if (kind == 3) v = -INFINITY;
        else if (kind == 4) v = allow_nan ? NAN : 1.0;
        else if (kind < 16) v = std::ldexp(uni(rng), static_cast<int>(r >> 32) % 200 - 100);
        else if (kind < 24) v = std::floor(uni(rng) / 10.0);
        else v = uni(rng);
        if (t == DType::Float32) store<float>(p, i, static_cast<float>(v));
        else store<double>(p, i, v);
        break;
      }
      case DType::Float16:
      case DType::BFloat16:
        if (!allow_nan) {
          uint16_t v = load<uint16_t>(p, i);
          if (std::isnan(ref_to_float(t, v))) store<uint16_t>(p, i, static_cast<uint16_t>(v & 0x8fff));
        }
        break;
      default: {
        // Make small values, extremes and equal pairs frequent for integers too.
        if (kind < 8) {
          std::memset(p + i * es, 0, es);
          p[i * es] = static_cast<unsigned char>(r >> 8 & 7);
        } else if (kind < 10) {
          std::memset(p + i * es, 0xff, es);
        } else if (kind < 12) {
          std::memset(p + i * es, 0x00, es);
          p[i * es + es - 1] = 0x80;  // INT_MIN
        } else if (kind < 14) {
          std::memset(p + i * es, 0xff, es);
          p[i * es + es - 1] = 0x7f;  // INT_MAX
        }
        break;
      }
    }
  }
}

// A 64-byte-aligned byte buffer that can be offset by any number of bytes.
struct Buf {
  explicit Buf(size_t bytes) : raw(bytes + 256) {}
  unsigned char* at(size_t offset) {
    uintptr_t p = reinterpret_cast<uintptr_t>(raw.data());
    p = (p + 63) & ~uintptr_t{63};
    return reinterpret_cast<unsigned char*>(p) + offset;
  }
  std::vector<unsigned char> raw;
};

const size_t kCounts[] = {0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 127, 129, 1000, 4099};

// ------------------------------------------------------------------------------------------------
// dtype helpers

TEST(DType, SizesAndNames) {
  EXPECT_EQ(stragg::dtype_size(DType::Float32), 4u);
  EXPECT_EQ(stragg::dtype_size(DType::Float64), 8u);
  EXPECT_EQ(stragg::dtype_size(DType::Float16), 2u);
  EXPECT_EQ(stragg::dtype_size(DType::BFloat16), 2u);
  EXPECT_EQ(stragg::dtype_size(DType::Int8), 1u);
  EXPECT_EQ(stragg::dtype_size(DType::UInt8), 1u);
  EXPECT_EQ(stragg::dtype_size(DType::Int16), 2u);
  EXPECT_EQ(stragg::dtype_size(DType::Int32), 4u);
  EXPECT_EQ(stragg::dtype_size(DType::Int64), 8u);
  EXPECT_EQ(stragg::dtype_size(DType::Bool), 1u);

  EXPECT_STREQ(stragg::dtype_name(DType::Float32), "float32");
  EXPECT_STREQ(stragg::dtype_name(DType::Float64), "float64");
  EXPECT_STREQ(stragg::dtype_name(DType::Float16), "float16");
  EXPECT_STREQ(stragg::dtype_name(DType::BFloat16), "bfloat16");
  EXPECT_STREQ(stragg::dtype_name(DType::Int8), "int8");
  EXPECT_STREQ(stragg::dtype_name(DType::UInt8), "uint8");
  EXPECT_STREQ(stragg::dtype_name(DType::Int16), "int16");
  EXPECT_STREQ(stragg::dtype_name(DType::Int32), "int32");
  EXPECT_STREQ(stragg::dtype_name(DType::Int64), "int64");
  EXPECT_STREQ(stragg::dtype_name(DType::Bool), "bool");

  EXPECT_STREQ(stragg::reduce_op_name(ReduceOp::Sum), "SUM");
  EXPECT_STREQ(stragg::reduce_op_name(ReduceOp::Prod), "PRODUCT");
  EXPECT_STREQ(stragg::reduce_op_name(ReduceOp::Min), "MIN");
  EXPECT_STREQ(stragg::reduce_op_name(ReduceOp::Max), "MAX");
  EXPECT_STREQ(stragg::reduce_op_name(ReduceOp::BAnd), "BAND");
  EXPECT_STREQ(stragg::reduce_op_name(ReduceOp::BOr), "BOR");
  EXPECT_STREQ(stragg::reduce_op_name(ReduceOp::BXor), "BXOR");

  for (DType t : kAllDTypes) {
    const bool fl = t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
    EXPECT_EQ(stragg::is_floating(t), fl) << stragg::dtype_name(t);
  }
}

TEST(DType, InvalidValues) {
  const DType bad = static_cast<DType>(200);
  EXPECT_THROW(stragg::dtype_size(bad), stragg::Error);
  EXPECT_STREQ(stragg::dtype_name(bad), "unknown");
  EXPECT_STREQ(stragg::reduce_op_name(static_cast<ReduceOp>(200)), "unknown");
  EXPECT_FALSE(stragg::is_floating(bad));
  EXPECT_FALSE(stragg::reduce_supported(bad, ReduceOp::Sum));
  EXPECT_FALSE(stragg::reduce_supported(DType::Int32, static_cast<ReduceOp>(200)));
  int32_t x = 1;
  EXPECT_THROW(stragg::reduce_into(bad, ReduceOp::Sum, &x, &x, 1), stragg::Error);
  EXPECT_THROW(stragg::reduce_into(DType::Int32, static_cast<ReduceOp>(200), &x, &x, 1), stragg::Error);
  EXPECT_THROW(stragg::scale_inplace(bad, &x, 1, 2.0), stragg::Error);
  EXPECT_THROW(stragg::divide_inplace(bad, &x, 1, 2), stragg::Error);
}

// ------------------------------------------------------------------------------------------------
// Support matrix and errors

TEST(Reduce, SupportMatrix) {
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      const bool bitwise = op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor;
      EXPECT_EQ(stragg::reduce_supported(t, op), !(bitwise && stragg::is_floating(t)))
          << stragg::dtype_name(t) << " " << stragg::reduce_op_name(op);
    }
  }
}

TEST(Reduce, UnsupportedThrowsNamingDtypeAndOp) {
  for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    for (ReduceOp op : {ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor}) {
      float d[4] = {1, 2, 3, 4}, s[4] = {1, 2, 3, 4};
      try {
        stragg::reduce_into(t, op, d, s, 2);
        ADD_FAILURE() << "no throw for " << stragg::dtype_name(t) << " " << stragg::reduce_op_name(op);
      } catch (const stragg::Error& e) {
        const std::string expect = std::string("stragg: reduce op ") + stragg::reduce_op_name(op) +
                                   " is not supported for dtype " + stragg::dtype_name(t);
        EXPECT_EQ(std::string(e.what()), expect);
      }
      EXPECT_EQ(d[0], 1.0f);  // untouched
      // Also with count 0 and null pointers: the combination itself is rejected.
      EXPECT_THROW(stragg::reduce_into(t, op, nullptr, nullptr, 0), stragg::Error);
    }
  }
  try {
    float d = 1, s = 1;
    stragg::reduce_into(DType::Float32, ReduceOp::BXor, &d, &s, 1);
    ADD_FAILURE() << "no throw";
  } catch (const stragg::Error& e) {
    EXPECT_STREQ(e.what(), "stragg: reduce op BXOR is not supported for dtype float32");
  }
}

TEST(Reduce, CountZeroIsNoOp) {
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllOps) {
      if (!stragg::reduce_supported(t, op)) continue;
      EXPECT_NO_THROW(stragg::reduce_into(t, op, nullptr, nullptr, 0));
    }
    if (stragg::is_floating(t)) {
      EXPECT_NO_THROW(stragg::scale_inplace(t, nullptr, 0, 0.5));
    }
    if (t != DType::Bool) {
      EXPECT_NO_THROW(stragg::divide_inplace(t, nullptr, 0, 3));
    }
  }
}

// reduce_into_swapped(dst, src) == op(src, dst), bit for bit what reduce_into computes with the
// operands exchanged, for every dtype and op, over more than one bounce buffer.
TEST(Reduce, SwappedEqualsReduceIntoWithOperandsExchanged) {
  std::mt19937 gen(7);
  const size_t count = 5003;
  for (DType t : kAllDTypes) {
    const size_t es = stragg::dtype_size(t);
    std::vector<unsigned char> a(count * es), b(count * es);
    for (auto& x : a) x = static_cast<unsigned char>(gen());
    for (auto& x : b) x = static_cast<unsigned char>(gen());
    if (t == DType::Bool) {
      for (auto& x : a) x &= 1;
      for (auto& x : b) x &= 1;
    }
    for (ReduceOp op : kAllOps) {
      if (!stragg::reduce_supported(t, op)) continue;
      std::vector<unsigned char> want = b, got = a;
      stragg::reduce_into(t, op, want.data(), a.data(), count);  // op(b, a)
      stragg::reduce_into_swapped(t, op, got.data(), b.data(), count);  // op(b, a) into a's copy
      ASSERT_EQ(want, got) << stragg::dtype_name(t) << " " << stragg::reduce_op_name(op);
    }
  }
}

TEST(Reduce, PartialOverlapThrows) {
  std::vector<int32_t> v(100, 1);
  EXPECT_THROW(stragg::reduce_into(DType::Int32, ReduceOp::Sum, v.data() + 1, v.data(), 10), stragg::Error);
  EXPECT_THROW(stragg::reduce_into(DType::Int32, ReduceOp::Sum, v.data(), v.data() + 9, 10), stragg::Error);
  EXPECT_NO_THROW(stragg::reduce_into(DType::Int32, ReduceOp::Sum, v.data(), v.data() + 10, 10));
  EXPECT_EQ(v[0], 2);
}

// ------------------------------------------------------------------------------------------------
// Every dtype x op against the reference, on every ISA variant, many counts and alignments.

void check_against_reference(int isa, DType t, ReduceOp op, size_t n, size_t doff, size_t soff,
                             std::mt19937_64& rng) {
  const size_t es = stragg::dtype_size(t);
  Buf d(n * es), s(n * es);
  // Guard bytes around dst catch out-of-bounds writes.
  unsigned char* dp = d.at(doff + 16);
  unsigned char* sp = s.at(soff + 16);
  std::memset(d.at(0), 0xA5, n * es + 96);
  fill_random(t, dp, n, rng);
  fill_random(t, sp, n, rng);
  // Make equal pairs common so Min/Max ties and x-x are exercised.
  for (size_t i = 0; i < n; i += 5) std::memcpy(sp + i * es, dp + i * es, es);
  std::vector<unsigned char> expect(dp, dp + n * es);
  const std::vector<unsigned char> src_copy(sp, sp + n * es);
  ref_reduce(t, op, expect.data(), sp, n);
  stragg::detail::reduce_into_isa(isa, t, op, dp, sp, n);
  size_t bad = 0;
  for (size_t i = 0; i < n && bad < 5; ++i) {
    if (!elem_equal(t, dp, expect.data(), i)) {
      ++bad;
      ADD_FAILURE() << "isa " << isa << " " << stragg::dtype_name(t) << " " << stragg::reduce_op_name(op)
                    << " n=" << n << " doff=" << doff << " soff=" << soff << " i=" << i
                    << " got " << elem_hex(t, dp, i) << " want " << elem_hex(t, expect.data(), i);
    }
  }
  EXPECT_TRUE(std::equal(src_copy.begin(), src_copy.end(), sp)) << "src modified";
  for (size_t k = 0; k < 16; ++k) {
    ASSERT_EQ(d.at(doff)[k], 0xA5) << "write before dst";
    ASSERT_EQ(dp[n * es + k], 0xA5) << "write past dst";
  }
}

TEST(Reduce, AllDtypesAllOpsMatchReference) {
  std::mt19937_64 rng(12345);
  for (int isa : available_isas()) {
    for (DType t : kAllDTypes) {
      const size_t es = stragg::dtype_size(t);
      for (ReduceOp op : kAllOps) {
        if (!stragg::reduce_supported(t, op)) continue;
        for (size_t n : kCounts) {
          check_against_reference(isa, t, op, n, 0, 0, rng);           // 64-byte aligned
          check_against_reference(isa, t, op, n, es, 3 * es, rng);     // element- but not vector-aligned
          if (es > 1) check_against_reference(isa, t, op, n, 1, es + 3, rng);  // misaligned elements
        }
        // Long enough to need several bounce-buffer chunks on the misaligned path.
        check_against_reference(isa, t, op, 20011, 1, 2, rng);
      }
    }
  }
}

TEST(Reduce, PublicApiUsesBestIsaAndMatchesReference) {
  std::mt19937_64 rng(777);
  const int best = stragg::detail::kernel_isa_selected();
  EXPECT_TRUE(stragg::detail::kernel_isa_available(best));
  EXPECT_TRUE(stragg::detail::kernel_isa_available(0));
  for (DType t : kAllDTypes) {
    const size_t es = stragg::dtype_size(t);
    for (ReduceOp op : kAllOps) {
      if (!stragg::reduce_supported(t, op)) continue;
      const size_t n = 1037;
      Buf d(n * es), s(n * es);
      fill_random(t, d.at(0), n, rng);
      fill_random(t, s.at(0), n, rng);
      std::vector<unsigned char> expect(d.at(0), d.at(0) + n * es);
      stragg::detail::reduce_into_isa(best, t, op, expect.data(), s.at(0), n);
      stragg::reduce_into(t, op, d.at(0), s.at(0), n);
      EXPECT_EQ(std::memcmp(d.at(0), expect.data(), n * es), 0)
          << stragg::dtype_name(t) << " " << stragg::reduce_op_name(op);
    }
  }
}

TEST(Reduce, DstEqualsSrc) {
  std::mt19937_64 rng(99);
  for (int isa : available_isas()) {
    for (DType t : kAllDTypes) {
      const size_t es = stragg::dtype_size(t);
      for (ReduceOp op : kAllOps) {
        if (!stragg::reduce_supported(t, op)) continue;
        for (size_t n : {size_t{1}, size_t{33}, size_t{5000}}) {
          Buf b(n * es);
          fill_random(t, b.at(0), n, rng);
          std::vector<unsigned char> copy(b.at(0), b.at(0) + n * es), expect = copy;
          ref_reduce(t, op, expect.data(), copy.data(), n);
          stragg::detail::reduce_into_isa(isa, t, op, b.at(0), b.at(0), n);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_TRUE(elem_equal(t, b.at(0), expect.data(), i))
                << "isa " << isa << " " << stragg::dtype_name(t) << " " << stragg::reduce_op_name(op) << " i=" << i;
          }
        }
      }
    }
  }
}

// Fast and portable variants must agree bit-for-bit on everything, NaN payloads included.
TEST(Reduce, IsaVariantsAreBitIdentical) {
  if (!stragg::detail::kernel_isa_available(1)) GTEST_SKIP() << "no AVX2+F16C on this CPU";
  std::mt19937_64 rng(4242);
  for (DType t : kAllDTypes) {
    const size_t es = stragg::dtype_size(t);
    for (ReduceOp op : kAllOps) {
      if (!stragg::reduce_supported(t, op)) continue;
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{31}, size_t{33},
                       size_t{100003}}) {
        Buf d0(n * es), d1(n * es), s(n * es);
        fill_random(t, d0.at(0), n, rng);
        fill_random(t, s.at(0), n, rng);
        std::memcpy(d1.at(0), d0.at(0), n * es);
        const std::vector<unsigned char> in(d0.at(0), d0.at(0) + n * es);
        stragg::detail::reduce_into_isa(0, t, op, d0.at(0), s.at(0), n);
        stragg::detail::reduce_into_isa(1, t, op, d1.at(0), s.at(0), n);
        for (size_t i = 0; i < n; ++i) {
          if (std::memcmp(d0.at(0) + i * es, d1.at(0) + i * es, es) == 0) continue;
          // The one allowed difference: NaN + NaN (or NaN * NaN) returns one of the two payloads,
          // and which one depends on the operand order the compiler picked for a commutative
          // IEEE op. Everything else (one NaN operand, inf - inf, ...) must match exactly.
          const bool both_nan_inputs = (op == ReduceOp::Sum || op == ReduceOp::Prod) &&
                                       is_nan_elem(t, in.data(), i) && is_nan_elem(t, s.at(0), i);
          ASSERT_TRUE(both_nan_inputs && is_nan_elem(t, d0.at(0), i) && is_nan_elem(t, d1.at(0), i))
              << stragg::dtype_name(t) << " " << stragg::reduce_op_name(op) << " n=" << n << " i=" << i
              << " portable " << elem_hex(t, d0.at(0), i) << " fast " << elem_hex(t, d1.at(0), i);
        }
      }
    }
    if (stragg::is_floating(t)) {
      for (double f : {0.5, 1.0 / 3.0, -7.25, 1e-30, 3e38, 0.0}) {
        const size_t n = 10007;
        Buf b0(n * es), b1(n * es);
        fill_random(t, b0.at(0), n, rng);
        std::memcpy(b1.at(0), b0.at(0), n * es);
        stragg::detail::scale_inplace_isa(0, t, b0.at(0), n, f);
        stragg::detail::scale_inplace_isa(1, t, b1.at(0), n, f);
        ASSERT_EQ(std::memcmp(b0.at(0), b1.at(0), n * es), 0) << stragg::dtype_name(t) << " scale " << f;
      }
    }
    if (t != DType::Bool) {
      for (int64_t dv : {int64_t{1}, int64_t{-1}, int64_t{2}, int64_t{3}, int64_t{-8}, int64_t{7},
                         int64_t{1} << 40, std::numeric_limits<int64_t>::min()}) {
        const size_t n = 10007;
        Buf b0(n * es), b1(n * es);
        fill_random(t, b0.at(0), n, rng);
        std::memcpy(b1.at(0), b0.at(0), n * es);
        stragg::detail::divide_inplace_isa(0, t, b0.at(0), n, dv);
        stragg::detail::divide_inplace_isa(1, t, b1.at(0), n, dv);
        ASSERT_EQ(std::memcmp(b0.at(0), b1.at(0), n * es), 0) << stragg::dtype_name(t) << " divide " << dv;
      }
    }
  }
}

TEST(Reduce, Deterministic) {
  std::mt19937_64 rng(5);
  for (DType t : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64}) {
    const size_t es = stragg::dtype_size(t);
    const size_t n = 4099;
    Buf d(n * es), s(n * es);
    fill_random(t, d.at(0), n, rng);
    fill_random(t, s.at(0), n, rng);
    std::vector<unsigned char> a(d.at(0), d.at(0) + n * es), b = a;
    stragg::reduce_into(t, ReduceOp::Sum, a.data(), s.at(0), n);
    stragg::reduce_into(t, ReduceOp::Sum, b.data(), s.at(0), n);
    EXPECT_EQ(a, b);
  }
}

// ------------------------------------------------------------------------------------------------
// Specific semantics

// Two ranks may reduce the same pair from opposite sides (StragglAR's straggler exchange):
// min/max must not depend on the operand order, signed zeros included.
TEST(Reduce, FloatMinMaxAreCommutativeOnSignedZeros) {
  for (int isa : available_isas()) {
    for (DType t : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
      for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
        // 17 lanes so the vector body and the scalar tail both see the case.
        const size_t n = 17;
        const size_t es = dtype_size(t);
        std::vector<uint8_t> neg(n * es), pos(n * es);
        for (size_t i = 0; i < n; ++i) {
          if (t == DType::Float32) {
            float a = -0.0f, b = 0.0f;
            std::memcpy(&neg[i * es], &a, es);
            std::memcpy(&pos[i * es], &b, es);
          } else if (t == DType::Float64) {
            double a = -0.0, b = 0.0;
            std::memcpy(&neg[i * es], &a, es);
            std::memcpy(&pos[i * es], &b, es);
          } else {
            uint16_t a = 0x8000, b = 0x0000;
            std::memcpy(&neg[i * es], &a, es);
            std::memcpy(&pos[i * es], &b, es);
          }
        }
        std::vector<uint8_t> r1 = neg, r2 = pos;
        stragg::detail::reduce_into_isa(isa, t, op, r1.data(), pos.data(), n);
        stragg::detail::reduce_into_isa(isa, t, op, r2.data(), neg.data(), n);
        EXPECT_EQ(r1, r2) << dtype_name(t) << " " << reduce_op_name(op) << " isa " << isa;
        // min(-0, +0) = -0 and max(-0, +0) = +0.
        EXPECT_EQ(r1, op == ReduceOp::Min ? neg : pos) << dtype_name(t) << " isa " << isa;
      }
    }
  }
}

TEST(Reduce, FloatMinMaxPropagateNaN) {
  for (int isa : available_isas()) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> d = {nan, 1.0f, nan, 2.0f, -0.0f, 3.0f, 5.0f, nan, 1.0f};
    std::vector<float> s = {1.0f, nan, nan, 1.0f, 0.0f, 3.0f, -INFINITY, 4.0f, INFINITY};
    for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
      std::vector<float> r = d;
      stragg::detail::reduce_into_isa(isa, DType::Float32, op, r.data(), s.data(), r.size());
      EXPECT_TRUE(std::isnan(r[0]));
      EXPECT_TRUE(std::isnan(r[1]));
      EXPECT_TRUE(std::isnan(r[2]));
      EXPECT_TRUE(std::isnan(r[7]));
      EXPECT_EQ(r[3], op == ReduceOp::Min ? 1.0f : 2.0f);
      EXPECT_EQ(r[5], 3.0f);
      EXPECT_EQ(r[6], op == ReduceOp::Min ? -INFINITY : 5.0f);
      EXPECT_EQ(r[8], op == ReduceOp::Min ? 1.0f : INFINITY);
    }
    std::vector<double> dd = {NAN, 1.0, 7.0}, ds = {1.0, NAN, 8.0};
    for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
      std::vector<double> r = dd;
      stragg::detail::reduce_into_isa(isa, DType::Float64, op, r.data(), ds.data(), r.size());
      EXPECT_TRUE(std::isnan(r[0]));
      EXPECT_TRUE(std::isnan(r[1]));
      EXPECT_EQ(r[2], op == ReduceOp::Min ? 7.0 : 8.0);
    }
    for (DType t : {DType::Float16, DType::BFloat16}) {
      const uint16_t qnan = t == DType::Float16 ? 0x7e00 : 0x7fc0;
      const uint16_t one = t == DType::Float16 ? 0x3c00 : 0x3f80;
      const uint16_t two = t == DType::Float16 ? 0x4000 : 0x4000;
      for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max}) {
        // 17 elements: covers vector body and tail.
        std::vector<uint16_t> d16(17, one), s16(17, two);
        d16[0] = qnan;
        s16[9] = qnan;
        s16[16] = qnan;
        stragg::detail::reduce_into_isa(isa, t, op, d16.data(), s16.data(), d16.size());
        for (size_t i = 0; i < d16.size(); ++i) {
          const bool want_nan = i == 0 || i == 9 || i == 16;
          EXPECT_EQ(std::isnan(ref_to_float(t, d16[i])), want_nan) << i;
          if (!want_nan) {
            EXPECT_EQ(d16[i], op == ReduceOp::Min ? one : two);
          }
        }
      }
    }
  }
}

TEST(Reduce, IntegerWraparound) {
  for (int isa : available_isas()) {
    {
      int8_t d[3] = {127, -128, 100}, s[3] = {1, -1, 100};
      stragg::detail::reduce_into_isa(isa, DType::Int8, ReduceOp::Sum, d, s, 3);
      EXPECT_EQ(d[0], -128);
      EXPECT_EQ(d[1], 127);
      EXPECT_EQ(d[2], -56);
    }
    {
      uint8_t d[2] = {255, 16}, s[2] = {1, 16};
      stragg::detail::reduce_into_isa(isa, DType::UInt8, ReduceOp::Sum, d, s, 2);
      EXPECT_EQ(d[0], 0);
      EXPECT_EQ(d[1], 32);
      uint8_t p[2] = {16, 255}, q[2] = {16, 255};
      stragg::detail::reduce_into_isa(isa, DType::UInt8, ReduceOp::Prod, p, q, 2);
      EXPECT_EQ(p[0], 0);
      EXPECT_EQ(p[1], 1);
    }
    {
      int16_t d[2] = {-32768, 300}, s[2] = {-32768, 300};
      stragg::detail::reduce_into_isa(isa, DType::Int16, ReduceOp::Prod, d, s, 2);
      EXPECT_EQ(d[0], 0);
      EXPECT_EQ(d[1], static_cast<int16_t>(90000 - 65536));
      int16_t e[1] = {-1}, f[1] = {-1};  // 0xffff * 0xffff would overflow a promoted int
      stragg::detail::reduce_into_isa(isa, DType::Int16, ReduceOp::Prod, e, f, 1);
      EXPECT_EQ(e[0], 1);
    }
    {
      int32_t d[2] = {std::numeric_limits<int32_t>::max(), 65536}, s[2] = {1, 65536};
      stragg::detail::reduce_into_isa(isa, DType::Int32, ReduceOp::Sum, d, s, 1);
      EXPECT_EQ(d[0], std::numeric_limits<int32_t>::min());
      stragg::detail::reduce_into_isa(isa, DType::Int32, ReduceOp::Prod, d + 1, s + 1, 1);
      EXPECT_EQ(d[1], 0);
    }
    {
      int64_t d[2] = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
      int64_t s[2] = {1, -1};
      stragg::detail::reduce_into_isa(isa, DType::Int64, ReduceOp::Sum, d, s, 2);
      EXPECT_EQ(d[0], std::numeric_limits<int64_t>::min());
      EXPECT_EQ(d[1], std::numeric_limits<int64_t>::max());
      int64_t p[1] = {int64_t{1} << 62}, q[1] = {4};
      stragg::detail::reduce_into_isa(isa, DType::Int64, ReduceOp::Prod, p, q, 1);
      EXPECT_EQ(p[0], 0);
    }
  }
}

TEST(Reduce, BoolSemantics) {
  for (int isa : available_isas()) {
    const uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1};
    struct Case {
      ReduceOp op;
      uint8_t want[4];
    } cases[] = {
        {ReduceOp::Sum, {0, 1, 1, 1}},  {ReduceOp::Max, {0, 1, 1, 1}}, {ReduceOp::BOr, {0, 1, 1, 1}},
        {ReduceOp::Prod, {0, 0, 0, 1}}, {ReduceOp::Min, {0, 0, 0, 1}}, {ReduceOp::BAnd, {0, 0, 0, 1}},
        {ReduceOp::BXor, {0, 1, 1, 0}},
    };
    for (const Case& c : cases) {
      uint8_t d[4];
      std::memcpy(d, a, 4);
      stragg::detail::reduce_into_isa(isa, DType::Bool, c.op, d, b, 4);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(d[i], c.want[i]) << stragg::reduce_op_name(c.op) << " " << i;
    }
  }
}

TEST(Reduce, HalfSumRoundsToNearestEven) {
  for (int isa : available_isas()) {
    // 2048 + 1 is a tie between 2048 and 2050 in half: even mantissa wins (2048).
    uint16_t d[3] = {0x6800 /*2048*/, 0x6801 /*2050*/, 0x7bff /*65504*/};
    uint16_t s[3] = {0x3c00 /*1*/, 0x3c00 /*1*/, 0x4c00 /*16*/};
    stragg::detail::reduce_into_isa(isa, DType::Float16, ReduceOp::Sum, d, s, 3);
    EXPECT_EQ(d[0], 0x6800);
    EXPECT_EQ(d[1], 0x6802);  // 2051 -> tie -> 2052
    EXPECT_EQ(d[2], 0x7c00);  // 65520 -> +inf
    // bf16: 256 + 1 ties to 256; 258 + 1 ties to 260.
    uint16_t e[2] = {0x4380 /*256*/, 0x4381 /*258*/};
    uint16_t f[2] = {0x3f80 /*1*/, 0x3f80};
    stragg::detail::reduce_into_isa(isa, DType::BFloat16, ReduceOp::Sum, e, f, 2);
    EXPECT_EQ(e[0], 0x4380);
    EXPECT_EQ(e[1], 0x4382);
  }
}

// ------------------------------------------------------------------------------------------------
// 16-bit float conversions

TEST(Convert, AllHalfAndBf16PatternsWidenExactlyAndRoundTrip) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (DType t : {DType::Float16, DType::BFloat16}) {
    std::vector<std::vector<float>> widened;
    std::vector<std::vector<uint16_t>> back;
    for (int isa : available_isas()) {
      std::vector<float> f(65536);
      std::vector<uint16_t> h(65536);
      stragg::detail::f16_to_f32_isa(isa, t, all.data(), f.data(), all.size());
      stragg::detail::f32_to_f16_isa(isa, t, f.data(), h.data(), f.size());
      for (uint32_t i = 0; i < 65536; ++i) {
        const float ref = ref_to_float(t, all[i]);
        ASSERT_EQ(fbits(f[i]), fbits(ref)) << "isa " << isa << " " << stragg::dtype_name(t) << " widen 0x"
                                           << std::hex << i;
        if (std::isnan(ref)) {
          const uint16_t quiet = t == DType::Float16 ? 0x0200 : 0x0040;
          ASSERT_EQ(h[i], all[i] | quiet) << "NaN round trip 0x" << std::hex << i;
        } else {
          ASSERT_EQ(h[i], all[i]) << "isa " << isa << " " << stragg::dtype_name(t) << " round trip 0x"
                                  << std::hex << i;
        }
      }
      widened.push_back(f);
      back.push_back(h);
    }
    for (size_t k = 1; k < widened.size(); ++k) {
      EXPECT_EQ(std::memcmp(widened[0].data(), widened[k].data(), 65536 * 4), 0);
      EXPECT_EQ(back[0], back[k]);
    }
  }
}

// Compares the narrowing of `in` on every ISA against the reference.
void check_narrowing(DType t, const std::vector<float>& in) {
  for (int isa : available_isas()) {
    std::vector<uint16_t> out(in.size());
    stragg::detail::f32_to_f16_isa(isa, t, in.data(), out.data(), in.size());
    size_t bad = 0;
    for (size_t i = 0; i < in.size() && bad < 10; ++i) {
      const uint16_t want = ref_from_float(t, in[i]);
      if (out[i] != want) {
        ++bad;
        ADD_FAILURE() << "isa " << isa << " " << stragg::dtype_name(t) << " narrow 0x" << std::hex
                      << fbits(in[i]) << " (" << in[i] << ") got 0x" << out[i] << " want 0x" << want;
      }
    }
  }
}

std::vector<float> narrowing_edge_cases(DType t) {
  std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(), ffrom(0x7f800001u) /*sNaN*/,
                          ffrom(0xff800001u), ffrom(0x7fffffffu), ffrom(0x7f801fffu), ffrom(0x7f802000u),
                          ffrom(0x7fa00000u), std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::lowest(), std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(), ffrom(0x007fffffu), 1.0f, -1.0f};
  if (t == DType::Float16) {
    const float more[] = {65504.0f, 65519.0f, 65519.996f, 65520.0f, 65536.0f, 1e5f, -65520.0f,
                          std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25),
                          std::nextafter(std::ldexp(1.0f, -25), 1.0f), std::ldexp(1.0f, -26),
                          std::ldexp(3.0f, -25) /*1.5 ulp: tie -> 2*/, std::ldexp(5.0f, -26) /*1.25 ulp*/,
                          std::ldexp(1023.5f, -24) /*tie at top of subnormals -> min normal*/,
                          2049.0f /*tie -> 2048*/, 2051.0f /*tie -> 2052*/, 2049.0001f, 0.1f, 1.0f / 3.0f};
    v.insert(v.end(), std::begin(more), std::end(more));
  } else {
    const float more[] = {257.0f /*tie -> 256*/, 259.0f /*tie -> 260*/, 257.0001f, ffrom(0x7f7f8000u) /*tie -> inf*/,
                          ffrom(0x7f7f7fffu), ffrom(0x00008000u) /*subnormal tie*/, ffrom(0x00018000u),
                          ffrom(0x80008001u), 0.1f, 1.0f / 3.0f};
    v.insert(v.end(), std::begin(more), std::end(more));
  }
  return v;
}

TEST(Convert, NarrowingEdgeCases) {
  for (DType t : {DType::Float16, DType::BFloat16}) {
    const std::vector<float> v = narrowing_edge_cases(t);
    check_narrowing(t, v);
  }
  // Spot checks of the reference itself (so the reference cannot silently agree with a bug).
  EXPECT_EQ(ref_float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(ref_float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(ref_float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(ref_float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(ref_float_to_half(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(ref_float_to_half(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(ref_float_to_half(std::ldexp(1023.5f, -24)), 0x0400);
  EXPECT_EQ(ref_float_to_half(-2049.0f), 0xe800);
  EXPECT_EQ(ref_float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(ref_float_to_half(ffrom(0x7f800001u)), 0x7e00);
  EXPECT_EQ(ref_float_to_bf16(257.0f), 0x4380);
  EXPECT_EQ(ref_float_to_bf16(259.0f), 0x4382);
  EXPECT_EQ(ref_float_to_bf16(ffrom(0x7f7f8000u)), 0x7f80);
  EXPECT_EQ(ref_float_to_bf16(ffrom(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(ref_float_to_bf16(ffrom(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(ref_float_to_bf16(1.0f), 0x3f80);
}

TEST(Convert, NarrowingStructuredSweep) {
  // Every float whose low bits sit at or around a rounding boundary, across all exponents.
  for (DType t : {DType::Float16, DType::BFloat16}) {
    std::vector<float> v;
    const uint32_t lows_half[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff};
    const uint32_t lows_bf16[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    if (t == DType::Float16) {
      // All 2^19 upper patterns (sign + exponent + top 10 mantissa bits) x boundary low bits.
      for (uint32_t hi = 0; hi < (1u << 19); ++hi) {
        for (uint32_t lo : lows_half) v.push_back(ffrom((hi << 13) | lo));
      }
      // Subnormal-range inputs where the rounding point moves: every value with few low bits.
      for (uint32_t e = 100; e <= 113; ++e) {
        for (uint32_t m = 0; m < (1u << 23); m += 997) v.push_back(ffrom((e << 23) | m));
      }
    } else {
      for (uint32_t hi = 0; hi < (1u << 16); ++hi) {
        for (uint32_t lo : lows_bf16) v.push_back(ffrom((hi << 16) | lo));
      }
    }
    check_narrowing(t, v);
  }
}

TEST(Convert, NarrowingRandom) {
  std::mt19937_64 rng(2024);
  for (DType t : {DType::Float16, DType::BFloat16}) {
    std::vector<float> v(2000000);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint32_t r = static_cast<uint32_t>(rng());
      if (i % 2 == 0) {
        v[i] = ffrom(r);  // any bit pattern (NaNs included)
      } else {
        // Concentrate on the target type's range: exponents around the representable window.
        const int lo = t == DType::Float16 ? 100 : 0;
        const int hi = t == DType::Float16 ? 145 : 255;
        const uint32_t e = static_cast<uint32_t>(lo + static_cast<int>((r >> 8) % static_cast<uint32_t>(hi - lo + 1)));
        v[i] = ffrom((r & 0x807fffffu) | (e << 23));
      }
    }
    check_narrowing(t, v);
  }
}

// ------------------------------------------------------------------------------------------------
// scale_inplace / divide_inplace

TEST(Scale, FloatingTypes) {
  std::mt19937_64 rng(31);
  for (int isa : available_isas()) {
    for (double factor : {0.25, 1.0 / 3.0, -2.0, 1e-3}) {
      const size_t n = 1031;
      {
        std::vector<float> v(n), w;
        for (auto& x : v) x = static_cast<float>(std::uniform_real_distribution<double>(-100, 100)(rng));
        w = v;
        stragg::detail::scale_inplace_isa(isa, DType::Float32, v.data(), n, factor);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(fbits(v[i]), fbits(w[i] * static_cast<float>(factor)));
      }
      {
        std::vector<double> v(n), w;
        for (auto& x : v) x = std::uniform_real_distribution<double>(-100, 100)(rng);
        w = v;
        stragg::detail::scale_inplace_isa(isa, DType::Float64, v.data(), n, factor);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(dbits(v[i]), dbits(w[i] * factor));
      }
      for (DType t : {DType::Float16, DType::BFloat16}) {
        std::vector<uint16_t> v(n), w;
        for (auto& x : v) x = static_cast<uint16_t>(rng());
        w = v;
        stragg::detail::scale_inplace_isa(isa, t, v.data(), n, factor);
        for (size_t i = 0; i < n; ++i) {
          const uint16_t want = ref_from_float(t, ref_to_float(t, w[i]) * static_cast<float>(factor));
          if (std::isnan(ref_to_float(t, want))) ASSERT_TRUE(std::isnan(ref_to_float(t, v[i])));
          else ASSERT_EQ(v[i], want) << stragg::dtype_name(t) << " i=" << i;
        }
      }
    }
  }
}

TEST(Scale, NonFloatingThrows) {
  for (DType t : {DType::Int8, DType::UInt8, DType::Int16, DType::Int32, DType::Int64, DType::Bool}) {
    int64_t x = 3;
    EXPECT_THROW(stragg::scale_inplace(t, &x, 1, 2.0), stragg::Error) << stragg::dtype_name(t);
    EXPECT_EQ(x, 3);
  }
}

TEST(Scale, Unaligned) {
  Buf b(4 * 100);
  float* p = reinterpret_cast<float*>(b.at(1));
  for (int i = 0; i < 100; ++i) {
    const float v = static_cast<float>(i);
    std::memcpy(b.at(1 + 4 * i), &v, 4);
  }
  stragg::scale_inplace(DType::Float32, p, 100, 0.5);
  for (int i = 0; i < 100; ++i) {
    float v;
    std::memcpy(&v, b.at(1 + 4 * i), 4);
    EXPECT_EQ(v, static_cast<float>(i) * 0.5f);
  }
}

TEST(Divide, IntegerTruncatesTowardZero) {
  for (int isa : available_isas()) {
    int32_t v[6] = {-7, 7, -8, 8, std::numeric_limits<int32_t>::min(), 1};
    stragg::detail::divide_inplace_isa(isa, DType::Int32, v, 6, 2);
    EXPECT_EQ(v[0], -3);
    EXPECT_EQ(v[1], 3);
    EXPECT_EQ(v[2], -4);
    EXPECT_EQ(v[3], 4);
    EXPECT_EQ(v[4], std::numeric_limits<int32_t>::min() / 2);
    EXPECT_EQ(v[5], 0);
    int32_t w[2] = {7, -7};
    stragg::detail::divide_inplace_isa(isa, DType::Int32, w, 2, -2);
    EXPECT_EQ(w[0], -3);
    EXPECT_EQ(w[1], 3);
    int32_t m[1] = {std::numeric_limits<int32_t>::min()};
    stragg::detail::divide_inplace_isa(isa, DType::Int32, m, 1, -1);
    EXPECT_EQ(m[0], std::numeric_limits<int32_t>::min());  // wraps, no UB
    int64_t l[3] = {std::numeric_limits<int64_t>::min(), -7, 7};
    stragg::detail::divide_inplace_isa(isa, DType::Int64, l, 3, -1);
    EXPECT_EQ(l[0], std::numeric_limits<int64_t>::min());
    EXPECT_EQ(l[1], 7);
    EXPECT_EQ(l[2], -7);
    int8_t b[2] = {-128, -7};
    stragg::detail::divide_inplace_isa(isa, DType::Int8, b, 2, 2);
    EXPECT_EQ(b[0], -64);
    EXPECT_EQ(b[1], -3);
  }
}

template <class T>
void check_int_divide_random(int isa, DType t, std::mt19937_64& rng) {
  const int64_t divisors[] = {1, -1, 2, -2, 3, -3, 4, 7, 8, -8, 16, 100, 127, 128, 255, 256, 1000, 65536,
                              (int64_t{1} << 31) - 1, int64_t{1} << 31, -(int64_t{1} << 31), int64_t{1} << 32,
                              (int64_t{1} << 32) + 1, -(int64_t{1} << 32) - 1, int64_t{1} << 62,
                              std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  for (int64_t dv : divisors) {
    const size_t n = 777;
    Buf b(n * sizeof(T));
    fill_random(t, b.at(0), n, rng);
    std::vector<T> in(n);
    std::memcpy(in.data(), b.at(0), n * sizeof(T));
    stragg::detail::divide_inplace_isa(isa, t, b.at(0), n, dv);
    for (size_t i = 0; i < n; ++i) {
      const int64_t x = static_cast<int64_t>(in[i]);
      const T want = (x == std::numeric_limits<int64_t>::min() && dv == -1) ? in[i] : static_cast<T>(x / dv);
      ASSERT_EQ(load<T>(b.at(0), i), want) << stragg::dtype_name(t) << " " << x << " / " << dv;
    }
  }
}

TEST(Divide, IntegerMatchesCDivisionForAllTypes) {
  std::mt19937_64 rng(8);
  for (int isa : available_isas()) {
    check_int_divide_random<int8_t>(isa, DType::Int8, rng);
    check_int_divide_random<uint8_t>(isa, DType::UInt8, rng);
    check_int_divide_random<int16_t>(isa, DType::Int16, rng);
    check_int_divide_random<int32_t>(isa, DType::Int32, rng);
    check_int_divide_random<int64_t>(isa, DType::Int64, rng);
  }
}

// 8/16-bit integers divide through float and 32-bit through double internally: check every 8- and
// 16-bit value against C division for many divisors, and int32 extremes.
template <class T>
void check_int_divide_exhaustive(int isa, DType t, const std::vector<int64_t>& divisors) {
  const size_t n = size_t{1} << (8 * sizeof(T));
  std::vector<T> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = static_cast<T>(i);
  for (int64_t dv : divisors) {
    std::vector<T> v = all;
    stragg::detail::divide_inplace_isa(isa, t, v.data(), n, dv);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(v[i], static_cast<T>(static_cast<int64_t>(all[i]) / dv))
          << stragg::dtype_name(t) << " " << static_cast<int64_t>(all[i]) << " / " << dv;
    }
  }
}

TEST(Divide, SmallIntegersExhaustive) {
  std::vector<int64_t> divisors;
  for (int64_t d = -300; d <= 300; ++d) {
    if (d != 0) divisors.push_back(d);
  }
  for (int64_t d : {32767, 32768, 32769, 65535, 65536, 65537, 1 << 20}) {
    divisors.push_back(d);
    divisors.push_back(-d);
  }
  std::vector<int64_t> few = {2, 3, 5, 7, 10, 100, 255, 256, 257, 1000, 32767, 32768, 65535, 65536, 65537};
  for (size_t k = 0, m = few.size(); k < m; ++k) few.push_back(-few[k]);
  for (int isa : available_isas()) {
    check_int_divide_exhaustive<int8_t>(isa, DType::Int8, divisors);
    check_int_divide_exhaustive<uint8_t>(isa, DType::UInt8, divisors);
    check_int_divide_exhaustive<int16_t>(isa, DType::Int16, few);
    std::vector<int32_t> v = {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::min() + 1,
                              std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::max() - 1,
                              -1, 0, 1, 1 << 30, -(1 << 30), 2147483, -2147483};
    for (int64_t dv : {int64_t{2}, int64_t{3}, int64_t{7}, int64_t{65536}, int64_t{2147483647}, int64_t{2147483648},
                       int64_t{-2147483648}, int64_t{-2147483647}, int64_t{4294967295}, int64_t{4294967296},
                       int64_t{4294967297}, int64_t{-4294967296}}) {
      std::vector<int32_t> w = v;
      stragg::detail::divide_inplace_isa(isa, DType::Int32, w.data(), w.size(), dv);
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(w[i], static_cast<int32_t>(static_cast<int64_t>(v[i]) / dv)) << v[i] << " / " << dv;
      }
    }
  }
}

TEST(Divide, FloatsDivideInComputeType) {
  std::mt19937_64 rng(9);
  for (int isa : available_isas()) {
    for (int64_t dv : {int64_t{3}, int64_t{7}, int64_t{-6}, int64_t{1000003}}) {
      const size_t n = 513;
      std::vector<float> f(n), f0;
      for (auto& x : f) x = static_cast<float>(std::uniform_real_distribution<double>(-1e4, 1e4)(rng));
      f0 = f;
      stragg::detail::divide_inplace_isa(isa, DType::Float32, f.data(), n, dv);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(fbits(f[i]), fbits(f0[i] / static_cast<float>(dv)));
      std::vector<double> d(n), d0;
      for (auto& x : d) x = std::uniform_real_distribution<double>(-1e4, 1e4)(rng);
      d0 = d;
      stragg::detail::divide_inplace_isa(isa, DType::Float64, d.data(), n, dv);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(dbits(d[i]), dbits(d0[i] / static_cast<double>(dv)));
      for (DType t : {DType::Float16, DType::BFloat16}) {
        std::vector<uint16_t> h(n), h0;
        for (auto& x : h) x = static_cast<uint16_t>(rng());
        h0 = h;
        stragg::detail::divide_inplace_isa(isa, t, h.data(), n, dv);
        for (size_t i = 0; i < n; ++i) {
          const uint16_t want = ref_from_float(t, ref_to_float(t, h0[i]) / static_cast<float>(dv));
          if (std::isnan(ref_to_float(t, want))) ASSERT_TRUE(std::isnan(ref_to_float(t, h[i])));
          else ASSERT_EQ(h[i], want) << stragg::dtype_name(t) << " i=" << i;
        }
      }
    }
    // Float division by zero is IEEE (no throw).
    float z[3] = {1.0f, -1.0f, 0.0f};
    stragg::detail::divide_inplace_isa(isa, DType::Float32, z, 3, 0);
    EXPECT_EQ(z[0], INFINITY);
    EXPECT_EQ(z[1], -INFINITY);
    EXPECT_TRUE(std::isnan(z[2]));
  }
  // AVG of a half sum: 3 / 2 = 1.5 exactly.
  uint16_t h[1] = {0x4200};
  stragg::divide_inplace(DType::Float16, h, 1, 2);
  EXPECT_EQ(h[0], 0x3e00);
}

TEST(Divide, BoolAndIntegerZeroThrow) {
  uint8_t b[1] = {1};
  EXPECT_THROW(stragg::divide_inplace(DType::Bool, b, 1, 2), stragg::Error);
  int32_t x[1] = {5};
  EXPECT_THROW(stragg::divide_inplace(DType::Int32, x, 1, 0), stragg::Error);
  EXPECT_EQ(x[0], 5);
}

TEST(Divide, Unaligned) {
  Buf b(8 * 50);
  for (int i = 0; i < 50; ++i) {
    const int64_t v = -1000 + 37 * i;
    std::memcpy(b.at(3 + 8 * i), &v, 8);
  }
  stragg::divide_inplace(DType::Int64, b.at(3), 50, 6);
  for (int i = 0; i < 50; ++i) {
    int64_t v;
    std::memcpy(&v, b.at(3 + 8 * i), 8);
    EXPECT_EQ(v, (-1000 + 37 * i) / 6);
  }
}

}  // namespace
