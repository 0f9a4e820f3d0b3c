// Element-wise reduction kernels (no torch, no CUDA).
//
// Structure:
//  * Dispatch on (dtype, op) happens once per call; each combination then runs a templated tight
//    loop over __restrict__ pointers that the compiler auto-vectorises at -O3.
//  * Everything is compiled twice: a portable variant (baseline ISA) and, on x86, an AVX2+F16C
//    variant picked at runtime with __builtin_cpu_supports. The generic loops are the same source
//    in both variants; only Float16/BFloat16 use hand-written intrinsics in the AVX2 variant.
//  * Both variants are bit-for-bit identical: every element is computed with one IEEE operation
//    (no FMA contraction is possible: the AVX2 variant does not enable FMA) and the 16-bit
//    conversions of the portable variant reproduce F16C exactly, NaNs included (tests check it).
//  * Misaligned pointers and dst == src go through aligned bounce buffers, so the kernels only
//    ever see element-aligned, non-aliasing pointers.
//
// 16-bit float conventions (shared by both variants):
//  * half -> float is exact; a signalling NaN comes out quiet (bit 22 set), as VCVTPH2PS does.
//  * float -> half rounds to nearest-even; overflow gives +-inf; NaN gives a quiet NaN keeping
//    the sign and the top 10 payload bits (as VCVTPS2PH does).
//  * bfloat16 -> float is a shift; float -> bfloat16 rounds to nearest-even, NaN gives a quiet
//    NaN keeping the sign and the top 7 payload bits.
#include "runtime/reduce.h"

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "runtime/error.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define STRAGG_X86_FAST 1
#include <immintrin.h>
#else
#define STRAGG_X86_FAST 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define STRAGG_INLINE inline __attribute__((always_inline))
#define STRAGG_RESTRICT __restrict__
#else
#define STRAGG_INLINE inline
#define STRAGG_RESTRICT
#endif

namespace stragg {

// Test hooks (declared by tests/cpp/test_reduce.cc). isa 0 = portable, 1 = AVX2+F16C.
namespace detail {
bool kernel_isa_available(int isa);
int kernel_isa_selected();
void reduce_into_isa(int isa, DType t, ReduceOp op, void* dst, const void* src, size_t count);
void scale_inplace_isa(int isa, DType t, void* buf, size_t count, double factor);
void divide_inplace_isa(int isa, DType t, void* buf, size_t count, int64_t divisor);
void f16_to_f32_isa(int isa, DType t, const uint16_t* in, float* out, size_t count);
void f32_to_f16_isa(int isa, DType t, const float* in, uint16_t* out, size_t count);
}  // namespace detail

namespace {

// ------------------------------------------------------------------------------------------------
// Scalar 16-bit float conversions (portable, bit-exact, independent of FP environment).

STRAGG_INLINE uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

STRAGG_INLINE float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Bitwise select. Used where an operand comes from floating-point arithmetic: a `?:` there lets
// GCC sink the FP op into a branch that it then cannot if-convert (-ftrapping-math), which stops
// loops over these conversions from vectorising.
STRAGG_INLINE uint32_t select_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}

STRAGG_INLINE float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;                  // exponent and mantissa
  uint32_t r = (em << 13) + 0x38000000u;            // normal: rebias exponent 15 -> 127
  r = em >= 0x7c00u ? r + 0x38000000u : r;          // inf/NaN: exponent all ones
  r = em > 0x7c00u ? (r | 0x00400000u) : r;         // NaN: quiet it (like VCVTPH2PS)
  // Zero/subnormal: mantissa * 2^-24, exact, and a normal float (so DAZ/FTZ cannot touch it).
  const uint32_t sub = bits_of(static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f);
  r = select_bits(em < 0x0400u, sub, r);
  return float_of(r | sign);
}

// Branch-free integer code (so loops over it vectorise where the ISA has per-lane shifts: AVX2,
// NEON) and exact whatever the FP environment (rounding mode, DAZ/FTZ).
STRAGG_INLINE uint16_t float_to_half(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t ax = static_cast<int32_t>(x & 0x7fffffffu);
  // NaN: quiet, keep the top payload bits (like VCVTPS2PH).
  const int32_t nan_h = 0x7e00 | ((ax >> 13) & 0x03ff);
  // Normal half range [2^-14, 65520): rebias the exponent, round the 13 dropped bits to nearest-even.
  // (Wraps for smaller inputs, whose result is not selected.)
  const uint32_t norm_h = (static_cast<uint32_t>(ax) - 0x38000000u + 0x0fffu + ((static_cast<uint32_t>(ax) >> 13) & 1u)) >> 13;
  // Below 2^-14 the result counts units of 2^-24: value = m * 2^(e-150) = (m >> (126-e)) * 2^-24.
  // The shift is 14..24 for the inputs this branch is chosen for; clamping it to [14, 25] keeps it
  // defined for the others (25 gives 0, right for everything below 2^-25).
  int32_t shift = 126 - (ax >> 23);
  shift = shift < 14 ? 14 : shift;
  shift = shift > 25 ? 25 : shift;
  const uint32_t m = (static_cast<uint32_t>(ax) & 0x007fffffu) | 0x00800000u;
  // Round to nearest-even while shifting: add half an output unit, minus one unless the
  // truncated result is odd.
  const uint32_t sub_h = (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
  uint32_t h = ax >= 0x38800000 ? norm_h : sub_h;
  h = ax >= 0x477ff000 ? 0x7c00u : h;                  // >= 65520 rounds to inf (65504 is odd)
  h = ax > 0x7f800000 ? static_cast<uint32_t>(nan_h) : h;
  return static_cast<uint16_t>(sign | h);
}

STRAGG_INLINE float bf16_to_float(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

STRAGG_INLINE uint16_t float_to_bf16(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t nan_bits = (x >> 16) | 0x0040u;                 // quiet NaN, keep sign/payload
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // nearest-even, overflow->inf
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan_bits : rounded);
}

struct HalfConv {
  static STRAGG_INLINE float to(uint16_t v) { return half_to_float(v); }
  static STRAGG_INLINE uint16_t from(float f) { return float_to_half(f); }
};

struct Bf16Conv {
  static STRAGG_INLINE float to(uint16_t v) { return bf16_to_float(v); }
  static STRAGG_INLINE uint16_t from(float f) { return float_to_bf16(f); }
};

// ------------------------------------------------------------------------------------------------
// Scalar operators. Integer arithmetic is done in an unsigned type at least as wide as `unsigned`
// (so 16-bit products cannot overflow a promoted int): wraparound without UB.

template <class T>
struct Wide {
  using type = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
};

struct OpSum {
  template <class T>
  static STRAGG_INLINE T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = typename Wide<T>::type;
      return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
    } else {
      return a + b;
    }
  }
};

struct OpProd {
  template <class T>
  static STRAGG_INLINE T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = typename Wide<T>::type;
      return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
    } else {
      return a * b;
    }
  }
};

// NaN-propagating like torch.minimum/maximum: if a is NaN the result is a, else if b is NaN it is b.
// Signed zeros are ordered (min(-0, +0) = -0, max(-0, +0) = +0) so that the result does not depend
// on the operand order: schedules where two ranks reduce the same pair from opposite sides
// (StragglAR's straggler exchange) must still end with bitwise identical data.
struct OpMin {
  template <class T>
  static STRAGG_INLINE T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? a : b;
    } else {
      return (a < b || a != a || (a == b && std::signbit(a))) ? a : b;
    }
  }
};

struct OpMax {
  template <class T>
  static STRAGG_INLINE T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a > b ? a : b;
    } else {
      return (a > b || a != a || (a == b && !std::signbit(a))) ? a : b;
    }
  }
};

struct OpBAnd {
  template <class T>
  static STRAGG_INLINE T apply(T a, T b) { return static_cast<T>(a & b); }
};
struct OpBOr {
  template <class T>
  static STRAGG_INLINE T apply(T a, T b) { return static_cast<T>(a | b); }
};
struct OpBXor {
  template <class T>
  static STRAGG_INLINE T apply(T a, T b) { return static_cast<T>(a ^ b); }
};

// Bool (one byte, 0 or 1). Results are normalised to 0/1 even if an input byte is another value.
struct OpLogicalOr {
  static STRAGG_INLINE uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a | b) != 0); }
};
struct OpLogicalAnd {
  static STRAGG_INLINE uint8_t apply(uint8_t a, uint8_t b) {
    return static_cast<uint8_t>((a != 0) & (b != 0));
  }
};
struct OpLogicalXor {
  static STRAGG_INLINE uint8_t apply(uint8_t a, uint8_t b) {
    return static_cast<uint8_t>((a != 0) ^ (b != 0));
  }
};

// ------------------------------------------------------------------------------------------------
// Generic loops (inlined into each ISA variant and auto-vectorised there).

template <class T, class Op>
STRAGG_INLINE void binary_loop(T* STRAGG_RESTRICT d, const T* STRAGG_RESTRICT s, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Op::apply(d[i], s[i]);
}

template <class T>
STRAGG_INLINE void reduce_typed(ReduceOp op, void* dv, const void* sv, size_t n) {
  T* d = static_cast<T*>(dv);
  const T* s = static_cast<const T*>(sv);
  switch (op) {
    case ReduceOp::Sum: binary_loop<T, OpSum>(d, s, n); return;
    case ReduceOp::Prod: binary_loop<T, OpProd>(d, s, n); return;
    case ReduceOp::Min: binary_loop<T, OpMin>(d, s, n); return;
    case ReduceOp::Max: binary_loop<T, OpMax>(d, s, n); return;
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::BAnd) binary_loop<T, OpBAnd>(d, s, n);
        else if (op == ReduceOp::BOr) binary_loop<T, OpBOr>(d, s, n);
        else binary_loop<T, OpBXor>(d, s, n);
      }
      return;  // floating: rejected by reduce_supported before we get here
  }
}

STRAGG_INLINE void reduce_bool(ReduceOp op, void* dv, const void* sv, size_t n) {
  uint8_t* d = static_cast<uint8_t*>(dv);
  const uint8_t* s = static_cast<const uint8_t*>(sv);
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
    case ReduceOp::BOr:
      binary_loop<uint8_t, OpLogicalOr>(d, s, n);
      return;
    case ReduceOp::Prod:
    case ReduceOp::Min:
    case ReduceOp::BAnd:
      binary_loop<uint8_t, OpLogicalAnd>(d, s, n);
      return;
    case ReduceOp::BXor:
      binary_loop<uint8_t, OpLogicalXor>(d, s, n);
      return;
  }
}

template <class T, class C>
STRAGG_INLINE void mul_loop(T* STRAGG_RESTRICT b, size_t n, C factor) {
  for (size_t i = 0; i < n; ++i) b[i] = b[i] * factor;
}

template <class T, class C>
STRAGG_INLINE void div_loop(T* STRAGG_RESTRICT b, size_t n, C divisor) {
  for (size_t i = 0; i < n; ++i) b[i] = b[i] / divisor;
}

// Integer division truncating toward zero, as C's `/` on int64 then wrapped back to T:
// result = T(int64_t(x) / divisor). divisor != 0 (checked by the caller).
template <class T>
STRAGG_INLINE void int_divide(T* STRAGG_RESTRICT b, size_t n, int64_t divisor) {
  using W = typename Wide<T>::type;
  if (divisor == 1) return;
  if (divisor == -1) {  // wrapping negation (INT_MIN / -1 wraps to INT_MIN)
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<T>(W{0} - static_cast<W>(b[i]));
    return;
  }
  if constexpr (sizeof(T) <= 4) {
    // Divide in floating point, which vectorises (integer division does not). With |x| <= L,
    // 2 <= |divisor| <= L and a p-bit significand, the quotient q fits in int32 and fl(x/divisor)
    // truncates to the exact integer quotient when L < 2^p: the rounding error, at most
    // |q| * 2^-p <= (L / |divisor|) * 2^-p, is below the distance 1/|divisor| from a non-integer
    // quotient to the nearest integer. 8/16-bit types: float, L = 2^16. 32-bit: double, L = 2^32.
    // For |divisor| > L every quotient truncates to 0.
    using F = std::conditional_t<(sizeof(T) <= 2), float, double>;
    const int64_t lim = int64_t{1} << (sizeof(T) <= 2 ? 16 : 32);
    if (divisor > lim || divisor < -lim) {
      for (size_t i = 0; i < n; ++i) b[i] = T{0};
      return;
    }
    const F fd = static_cast<F>(divisor);
    for (size_t i = 0; i < n; ++i) {
      b[i] = static_cast<T>(static_cast<int32_t>(static_cast<F>(b[i]) / fd));
    }
  } else {
    const uint64_t ad = divisor < 0 ? uint64_t{0} - static_cast<uint64_t>(divisor)
                                    : static_cast<uint64_t>(divisor);
    if ((ad & (ad - 1)) == 0) {  // power of two (common: world sizes): shift with bias
      int k = 0;
      while ((uint64_t{1} << k) != ad) ++k;
      const int64_t mask = static_cast<int64_t>(ad - 1);
      if (divisor > 0) {
        for (size_t i = 0; i < n; ++i) {
          const int64_t x = b[i];
          b[i] = static_cast<T>((x + ((x >> 63) & mask)) >> k);
        }
      } else {
        for (size_t i = 0; i < n; ++i) {
          const int64_t x = b[i];
          b[i] = static_cast<T>(-((x + ((x >> 63) & mask)) >> k));
        }
      }
      return;
    }
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<T>(b[i] / divisor);
  }
}

// ------------------------------------------------------------------------------------------------
// Portable 16-bit float kernels.

template <class Conv, class Op>
STRAGG_INLINE void f16_binary_loop(uint16_t* STRAGG_RESTRICT d, const uint16_t* STRAGG_RESTRICT s,
                                   size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = Conv::from(Op::apply(Conv::to(d[i]), Conv::to(s[i])));
}

template <class Conv>
STRAGG_INLINE void f16_reduce_portable(ReduceOp op, void* dv, const void* sv, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dv);
  const uint16_t* s = static_cast<const uint16_t*>(sv);
  switch (op) {
    case ReduceOp::Sum: f16_binary_loop<Conv, OpSum>(d, s, n); return;
    case ReduceOp::Prod: f16_binary_loop<Conv, OpProd>(d, s, n); return;
    case ReduceOp::Min: f16_binary_loop<Conv, OpMin>(d, s, n); return;
    case ReduceOp::Max: f16_binary_loop<Conv, OpMax>(d, s, n); return;
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      return;  // rejected by reduce_supported
  }
}

struct PortableImpl {
  static STRAGG_INLINE void half_reduce(ReduceOp op, void* d, const void* s, size_t n) {
    f16_reduce_portable<HalfConv>(op, d, s, n);
  }
  static STRAGG_INLINE void bf16_reduce(ReduceOp op, void* d, const void* s, size_t n) {
    f16_reduce_portable<Bf16Conv>(op, d, s, n);
  }
  template <class Conv>
  static STRAGG_INLINE void f16_scale(void* bv, size_t n, float factor) {
    uint16_t* STRAGG_RESTRICT b = static_cast<uint16_t*>(bv);
    for (size_t i = 0; i < n; ++i) b[i] = Conv::from(Conv::to(b[i]) * factor);
  }
  template <class Conv>
  static STRAGG_INLINE void f16_divide(void* bv, size_t n, float divisor) {
    uint16_t* STRAGG_RESTRICT b = static_cast<uint16_t*>(bv);
    for (size_t i = 0; i < n; ++i) b[i] = Conv::from(Conv::to(b[i]) / divisor);
  }
  static STRAGG_INLINE void half_scale(void* b, size_t n, float f) { f16_scale<HalfConv>(b, n, f); }
  static STRAGG_INLINE void bf16_scale(void* b, size_t n, float f) { f16_scale<Bf16Conv>(b, n, f); }
  static STRAGG_INLINE void half_divide(void* b, size_t n, float d) { f16_divide<HalfConv>(b, n, d); }
  static STRAGG_INLINE void bf16_divide(void* b, size_t n, float d) { f16_divide<Bf16Conv>(b, n, d); }

  static void to_f32(DType t, const uint16_t* STRAGG_RESTRICT in, float* STRAGG_RESTRICT out,
                     size_t n) {
    if (t == DType::Float16) {
      for (size_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
    }
  }
  static void from_f32(DType t, const float* STRAGG_RESTRICT in, uint16_t* STRAGG_RESTRICT out,
                       size_t n) {
    if (t == DType::Float16) {
      for (size_t i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
    }
  }
};

// ------------------------------------------------------------------------------------------------
// AVX2 + F16C 16-bit float kernels (x86 only).

#if STRAGG_X86_FAST
#define STRAGG_AVX2 __attribute__((target("avx2,f16c")))
#define STRAGG_AVX2_INLINE inline __attribute__((always_inline, target("avx2,f16c")))

// Codecs move 16 elements between memory and two float vectors. The lane order inside the pair is
// the codec's business (only element-wise ops run in between); store16 undoes what load16 did.
struct F32x16 {
  __m256 a, b;
};

struct HalfCodecF16C {
  static STRAGG_AVX2_INLINE F32x16 load16(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  static STRAGG_AVX2_INLINE void store16(uint16_t* p, F32x16 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v.a, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(v.b, _MM_FROUND_TO_NEAREST_INT));
  }
};

// Same arithmetic as bf16_to_float/float_to_bf16. Widening interleaves zeros below each element
// (unpacklo/hi within 128-bit lanes: a = elements 0-3, 8-11; b = 4-7, 12-15), and packus of
// (a, b) restores the memory order, so no cross-lane shuffle is needed.
struct Bf16CodecAvx2 {
  static STRAGG_AVX2_INLINE F32x16 load16(const uint16_t* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i z = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v))};
  }
  // Rounded bf16 bits in the low half of each 32-bit lane (high half zero).
  static STRAGG_AVX2_INLINE __m256i round8(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan_bits = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, nan_bits, is_nan);
  }
  static STRAGG_AVX2_INLINE void store16(uint16_t* p, F32x16 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(round8(v.a), round8(v.b)));
  }
};

struct VSum {
  STRAGG_AVX2_INLINE __m256 operator()(__m256 a, __m256 b) const { return _mm256_add_ps(a, b); }
};
struct VProd {
  STRAGG_AVX2_INLINE __m256 operator()(__m256 a, __m256 b) const { return _mm256_mul_ps(a, b); }
};
// All-ones lanes where a's sign bit is set.
STRAGG_AVX2_INLINE __m256 sign_mask(__m256 a) {
  return _mm256_castsi256_ps(_mm256_srai_epi32(_mm256_castps_si256(a), 31));
}
struct VMin {  // (a < b || isnan(a) || (a == b && signbit(a))) ? a : b, exactly as OpMin
  STRAGG_AVX2_INLINE __m256 operator()(__m256 a, __m256 b) const {
    const __m256 eq_neg = _mm256_and_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ), sign_mask(a));
    const __m256 take_a = _mm256_or_ps(
        _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q)), eq_neg);
    return _mm256_blendv_ps(b, a, take_a);
  }
};
struct VMax {  // (a > b || isnan(a) || (a == b && !signbit(a))) ? a : b, exactly as OpMax
  STRAGG_AVX2_INLINE __m256 operator()(__m256 a, __m256 b) const {
    const __m256 eq_pos = _mm256_andnot_ps(sign_mask(a), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    const __m256 take_a = _mm256_or_ps(
        _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q)), eq_pos);
    return _mm256_blendv_ps(b, a, take_a);
  }
};
struct VScale {
  __m256 f;
  STRAGG_AVX2_INLINE __m256 operator()(__m256 a) const { return _mm256_mul_ps(a, f); }
};
struct VDivide {
  __m256 d;
  STRAGG_AVX2_INLINE __m256 operator()(__m256 a) const { return _mm256_div_ps(a, d); }
};

template <class VOp>
STRAGG_AVX2_INLINE F32x16 apply2(VOp op, F32x16 x, F32x16 y) {
  return {op(x.a, y.a), op(x.b, y.b)};
}

template <class VOp>
STRAGG_AVX2_INLINE F32x16 apply1(VOp op, F32x16 x) {
  return {op(x.a), op(x.b)};
}

template <class Codec, class VOp>
STRAGG_AVX2_INLINE void f16_binary_avx2(uint16_t* d, const uint16_t* s, size_t n, VOp op) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const F32x16 a0 = Codec::load16(d + i), a1 = Codec::load16(d + i + 16);
    const F32x16 b0 = Codec::load16(s + i), b1 = Codec::load16(s + i + 16);
    Codec::store16(d + i, apply2(op, a0, b0));
    Codec::store16(d + i + 16, apply2(op, a1, b1));
  }
  if (i + 16 <= n) {
    Codec::store16(d + i, apply2(op, Codec::load16(d + i), Codec::load16(s + i)));
    i += 16;
  }
  if (i < n) {  // tail: pad to a full block so it is computed by the very same instructions
    uint16_t ta[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    uint16_t tb[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(ta, d + i, (n - i) * sizeof(uint16_t));
    std::memcpy(tb, s + i, (n - i) * sizeof(uint16_t));
    Codec::store16(ta, apply2(op, Codec::load16(ta), Codec::load16(tb)));
    std::memcpy(d + i, ta, (n - i) * sizeof(uint16_t));
  }
}

template <class Codec, class VOp>
STRAGG_AVX2_INLINE void f16_unary_avx2(uint16_t* b, size_t n, VOp op) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const F32x16 a0 = Codec::load16(b + i), a1 = Codec::load16(b + i + 16);
    Codec::store16(b + i, apply1(op, a0));
    Codec::store16(b + i + 16, apply1(op, a1));
  }
  if (i + 16 <= n) {
    Codec::store16(b + i, apply1(op, Codec::load16(b + i)));
    i += 16;
  }
  if (i < n) {
    uint16_t t[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(t, b + i, (n - i) * sizeof(uint16_t));
    Codec::store16(t, apply1(op, Codec::load16(t)));
    std::memcpy(b + i, t, (n - i) * sizeof(uint16_t));
  }
}

template <class Codec>
STRAGG_AVX2 void f16_reduce_avx2(ReduceOp op, void* dv, const void* sv, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dv);
  const uint16_t* s = static_cast<const uint16_t*>(sv);
  switch (op) {
    case ReduceOp::Sum: f16_binary_avx2<Codec>(d, s, n, VSum{}); return;
    case ReduceOp::Prod: f16_binary_avx2<Codec>(d, s, n, VProd{}); return;
    case ReduceOp::Min: f16_binary_avx2<Codec>(d, s, n, VMin{}); return;
    case ReduceOp::Max: f16_binary_avx2<Codec>(d, s, n, VMax{}); return;
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      return;  // rejected by reduce_supported
  }
}

template <class Codec>
STRAGG_AVX2 void f16_scale_avx2(void* b, size_t n, float factor) {
  f16_unary_avx2<Codec>(static_cast<uint16_t*>(b), n, VScale{_mm256_set1_ps(factor)});
}

template <class Codec>
STRAGG_AVX2 void f16_divide_avx2(void* b, size_t n, float divisor) {
  f16_unary_avx2<Codec>(static_cast<uint16_t*>(b), n, VDivide{_mm256_set1_ps(divisor)});
}

// Bulk conversions (test hooks): the same load16/store16 code the kernels run, with the codec's
// lane order (half: in order; bf16: interleaved within 128-bit lanes) undone in scalar code.
template <class Codec>
STRAGG_AVX2 void f16_to_f32_avx2(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const size_t m = n - i < 16 ? n - i : 16;
    uint16_t t[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(t, in + i, m * sizeof(uint16_t));
    const F32x16 v = Codec::load16(t);
    alignas(32) float fa[8], fb[8], o[16];
    _mm256_store_ps(fa, v.a);
    _mm256_store_ps(fb, v.b);
    if (std::is_same<Codec, HalfCodecF16C>::value) {
      for (int k = 0; k < 8; ++k) o[k] = fa[k], o[8 + k] = fb[k];
    } else {
      for (int k = 0; k < 4; ++k) {
        o[k] = fa[k], o[4 + k] = fb[k], o[8 + k] = fa[4 + k], o[12 + k] = fb[4 + k];
      }
    }
    std::memcpy(out + i, o, m * sizeof(float));
  }
}

template <class Codec>
STRAGG_AVX2 void f32_to_f16_avx2(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const size_t m = n - i < 16 ? n - i : 16;
    alignas(32) float o[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(o, in + i, m * sizeof(float));
    alignas(32) float fa[8], fb[8];
    if (std::is_same<Codec, HalfCodecF16C>::value) {
      for (int k = 0; k < 8; ++k) fa[k] = o[k], fb[k] = o[8 + k];
    } else {
      for (int k = 0; k < 4; ++k) {
        fa[k] = o[k], fb[k] = o[4 + k], fa[4 + k] = o[8 + k], fb[4 + k] = o[12 + k];
      }
    }
    uint16_t t[16];
    Codec::store16(t, F32x16{_mm256_load_ps(fa), _mm256_load_ps(fb)});
    std::memcpy(out + i, t, m * sizeof(uint16_t));
  }
}

struct Avx2Impl {
  static void half_reduce(ReduceOp op, void* d, const void* s, size_t n) {
    f16_reduce_avx2<HalfCodecF16C>(op, d, s, n);
  }
  static void bf16_reduce(ReduceOp op, void* d, const void* s, size_t n) {
    f16_reduce_avx2<Bf16CodecAvx2>(op, d, s, n);
  }
  static void half_scale(void* b, size_t n, float f) { f16_scale_avx2<HalfCodecF16C>(b, n, f); }
  static void bf16_scale(void* b, size_t n, float f) { f16_scale_avx2<Bf16CodecAvx2>(b, n, f); }
  static void half_divide(void* b, size_t n, float d) { f16_divide_avx2<HalfCodecF16C>(b, n, d); }
  static void bf16_divide(void* b, size_t n, float d) { f16_divide_avx2<Bf16CodecAvx2>(b, n, d); }
  static void to_f32(DType t, const uint16_t* in, float* out, size_t n) {
    if (t == DType::Float16) f16_to_f32_avx2<HalfCodecF16C>(in, out, n);
    else f16_to_f32_avx2<Bf16CodecAvx2>(in, out, n);
  }
  static void from_f32(DType t, const float* in, uint16_t* out, size_t n) {
    if (t == DType::Float16) f32_to_f16_avx2<HalfCodecF16C>(in, out, n);
    else f32_to_f16_avx2<Bf16CodecAvx2>(in, out, n);
  }
};
#endif  // STRAGG_X86_FAST

// ------------------------------------------------------------------------------------------------
// Per-call dispatch, instantiated once per ISA variant. Arguments are already validated.

template <class Impl>
STRAGG_INLINE void reduce_all(DType t, ReduceOp op, void* d, const void* s, size_t n) {
  switch (t) {
    case DType::Float32: reduce_typed<float>(op, d, s, n); return;
    case DType::Float64: reduce_typed<double>(op, d, s, n); return;
    case DType::Float16: Impl::half_reduce(op, d, s, n); return;
    case DType::BFloat16: Impl::bf16_reduce(op, d, s, n); return;
    case DType::Int8: reduce_typed<int8_t>(op, d, s, n); return;
    case DType::UInt8: reduce_typed<uint8_t>(op, d, s, n); return;
    case DType::Int16: reduce_typed<int16_t>(op, d, s, n); return;
    case DType::Int32: reduce_typed<int32_t>(op, d, s, n); return;
    case DType::Int64: reduce_typed<int64_t>(op, d, s, n); return;
    case DType::Bool: reduce_bool(op, d, s, n); return;
  }
}

template <class Impl>
STRAGG_INLINE void scale_all(DType t, void* b, size_t n, double factor) {
  switch (t) {
    case DType::Float32: mul_loop(static_cast<float*>(b), n, static_cast<float>(factor)); return;
    case DType::Float64: mul_loop(static_cast<double*>(b), n, factor); return;
    case DType::Float16: Impl::half_scale(b, n, static_cast<float>(factor)); return;
    case DType::BFloat16: Impl::bf16_scale(b, n, static_cast<float>(factor)); return;
    default: return;  // rejected before
  }
}

template <class Impl>
STRAGG_INLINE void divide_all(DType t, void* b, size_t n, int64_t divisor) {
  switch (t) {
    case DType::Float32: div_loop(static_cast<float*>(b), n, static_cast<float>(divisor)); return;
    case DType::Float64: div_loop(static_cast<double*>(b), n, static_cast<double>(divisor)); return;
    case DType::Float16: Impl::half_divide(b, n, static_cast<float>(divisor)); return;
    case DType::BFloat16: Impl::bf16_divide(b, n, static_cast<float>(divisor)); return;
    case DType::Int8: int_divide(static_cast<int8_t*>(b), n, divisor); return;
    case DType::UInt8: int_divide(static_cast<uint8_t*>(b), n, divisor); return;
    case DType::Int16: int_divide(static_cast<int16_t*>(b), n, divisor); return;
    case DType::Int32: int_divide(static_cast<int32_t*>(b), n, divisor); return;
    case DType::Int64: int_divide(static_cast<int64_t*>(b), n, divisor); return;
    case DType::Bool: return;  // rejected before
  }
}

using ReduceFn = void (*)(DType, ReduceOp, void*, const void*, size_t);
using ScaleFn = void (*)(DType, void*, size_t, double);
using DivideFn = void (*)(DType, void*, size_t, int64_t);
using ToF32Fn = void (*)(DType, const uint16_t*, float*, size_t);
using FromF32Fn = void (*)(DType, const float*, uint16_t*, size_t);

struct Kernels {
  ReduceFn reduce;
  ScaleFn scale;
  DivideFn divide;
  ToF32Fn to_f32;
  FromF32Fn from_f32;
};

void reduce_portable(DType t, ReduceOp op, void* d, const void* s, size_t n) {
  reduce_all<PortableImpl>(t, op, d, s, n);
}
void scale_portable(DType t, void* b, size_t n, double f) { scale_all<PortableImpl>(t, b, n, f); }
void divide_portable(DType t, void* b, size_t n, int64_t d) { divide_all<PortableImpl>(t, b, n, d); }

constexpr Kernels kPortable{reduce_portable, scale_portable, divide_portable, PortableImpl::to_f32,
                            PortableImpl::from_f32};

#if STRAGG_X86_FAST
STRAGG_AVX2 void reduce_avx2(DType t, ReduceOp op, void* d, const void* s, size_t n) {
  reduce_all<Avx2Impl>(t, op, d, s, n);
}
STRAGG_AVX2 void scale_avx2(DType t, void* b, size_t n, double f) { scale_all<Avx2Impl>(t, b, n, f); }
STRAGG_AVX2 void divide_avx2(DType t, void* b, size_t n, int64_t d) { divide_all<Avx2Impl>(t, b, n, d); }

constexpr Kernels kAvx2{reduce_avx2, scale_avx2, divide_avx2, Avx2Impl::to_f32, Avx2Impl::from_f32};

bool cpu_has_avx2_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}
#endif

bool isa_available(int isa) {
  if (isa == 0) return true;
#if STRAGG_X86_FAST
  if (isa == 1) {
    static const bool ok = cpu_has_avx2_f16c();
    return ok;
  }
#endif
  return false;
}

const Kernels& kernels_for(int isa) {
  if (!isa_available(isa)) {
    throw Error("stragg: reduce kernel variant " + std::to_string(isa) + " is not available on this CPU");
  }
#if STRAGG_X86_FAST
  if (isa == 1) return kAvx2;
#endif
  return kPortable;
}

int best_isa() {
  static const int isa = isa_available(1) ? 1 : 0;
  return isa;
}

// ------------------------------------------------------------------------------------------------
// Validation and the aligned/non-aliasing bounce path.

[[noreturn]] void throw_unsupported(DType t, ReduceOp op) {
  throw Error(std::string("stragg: reduce op ") + reduce_op_name(op) + " is not supported for dtype " +
              dtype_name(t));
}

bool is_valid(DType t) { return static_cast<unsigned>(t) <= static_cast<unsigned>(DType::Bool); }

bool misaligned(const void* p, size_t align) {
  return (reinterpret_cast<uintptr_t>(p) & (align - 1)) != 0;
}

constexpr size_t kBounceBytes = 8192;

void reduce_checked(const Kernels& k, DType t, ReduceOp op, void* dst, const void* src, size_t count) {
  if (!reduce_supported(t, op)) throw_unsupported(t, op);
  if (count == 0) return;
  const size_t es = dtype_size(t);
  unsigned char* d = static_cast<unsigned char*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  const size_t bytes = count * es;
  if (d != s && d < s + bytes && s < d + bytes) {
    throw Error("stragg: reduce_into: dst and src overlap partially (dtype " + std::string(dtype_name(t)) +
                ", count " + std::to_string(count) + ")");
  }
  if (d != s && !misaligned(d, es) && !misaligned(s, es)) {
    k.reduce(t, op, d, s, count);
    return;
  }
  // dst == src, or a pointer not aligned to the element size: go through aligned buffers.
  alignas(64) unsigned char a[kBounceBytes];
  alignas(64) unsigned char b[kBounceBytes];
  const size_t per = kBounceBytes / es;
  for (size_t off = 0; off < count; off += per) {
    const size_t m = count - off < per ? count - off : per;
    std::memcpy(a, d + off * es, m * es);
    std::memcpy(b, s + off * es, m * es);
    k.reduce(t, op, a, b, m);
    std::memcpy(d + off * es, a, m * es);
  }
}

// Runs fn(aligned_ptr, n) over buf, bouncing through an aligned buffer if buf is misaligned.
template <class Fn>
void inplace_checked(DType t, void* buf, size_t count, Fn fn) {
  if (count == 0) return;
  const size_t es = dtype_size(t);
  unsigned char* p = static_cast<unsigned char*>(buf);
  if (!misaligned(p, es)) {
    fn(p, count);
    return;
  }
  alignas(64) unsigned char a[kBounceBytes];
  const size_t per = kBounceBytes / es;
  for (size_t off = 0; off < count; off += per) {
    const size_t m = count - off < per ? count - off : per;
    std::memcpy(a, p + off * es, m * es);
    fn(a, m);
    std::memcpy(p + off * es, a, m * es);
  }
}

void scale_checked(const Kernels& k, DType t, void* buf, size_t count, double factor) {
  if (!is_valid(t) || !is_floating(t)) {
    throw Error(std::string("stragg: scale_inplace (PREMUL_SUM) is not supported for dtype ") +
                dtype_name(t));
  }
  inplace_checked(t, buf, count, [&](void* p, size_t n) { k.scale(t, p, n, factor); });
}

void divide_checked(const Kernels& k, DType t, void* buf, size_t count, int64_t divisor) {
  if (!is_valid(t) || t == DType::Bool) {
    throw Error(std::string("stragg: divide_inplace (AVG) is not supported for dtype ") + dtype_name(t));
  }
  if (divisor == 0 && !is_floating(t)) {
    throw Error(std::string("stragg: divide_inplace (AVG): integer division by zero for dtype ") +
                dtype_name(t));
  }
  inplace_checked(t, buf, count, [&](void* p, size_t n) { k.divide(t, p, n, divisor); });
}

void check_16bit_float(DType t) {
  if (t != DType::Float16 && t != DType::BFloat16) {
    throw Error(std::string("stragg: 16-bit float conversion requested for dtype ") + dtype_name(t));
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Public API.

bool reduce_supported(DType t, ReduceOp op) {
  if (!is_valid(t)) return false;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Prod:
    case ReduceOp::Min:
    case ReduceOp::Max:
      return true;
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      return !is_floating(t);
  }
  return false;
}

void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count) {
  reduce_checked(kernels_for(best_isa()), t, op, dst, src, count);
}

void scale_inplace(DType t, void* buf, size_t count, double factor) {
  scale_checked(kernels_for(best_isa()), t, buf, count, factor);
}

void divide_inplace(DType t, void* buf, size_t count, int64_t divisor) {
  divide_checked(kernels_for(best_isa()), t, buf, count, divisor);
}

namespace detail {

bool kernel_isa_available(int isa) { return isa_available(isa); }

int kernel_isa_selected() { return best_isa(); }

void reduce_into_isa(int isa, DType t, ReduceOp op, void* dst, const void* src, size_t count) {
  reduce_checked(kernels_for(isa), t, op, dst, src, count);
}

void scale_inplace_isa(int isa, DType t, void* buf, size_t count, double factor) {
  scale_checked(kernels_for(isa), t, buf, count, factor);
}

void divide_inplace_isa(int isa, DType t, void* buf, size_t count, int64_t divisor) {
  divide_checked(kernels_for(isa), t, buf, count, divisor);
}

void f16_to_f32_isa(int isa, DType t, const uint16_t* in, float* out, size_t count) {
  check_16bit_float(t);
  kernels_for(isa).to_f32(t, in, out, count);
}

void f32_to_f16_isa(int isa, DType t, const float* in, uint16_t* out, size_t count) {
  check_16bit_float(t);
  kernels_for(isa).from_f32(t, in, out, count);
}

}  // namespace detail
}  // namespace stragg
