// AVX2 + F16C variant of the CPU reduction loops (x86 only; private to reduce.cc).
//
// Every functor gets one out-of-line function compiled for AVX2+F16C (avx2_binary / avx2_unary),
// into which the generic loops of reduce_loops.h are inlined and auto-vectorised. float16 and
// bfloat16 are the exception: GCC cannot vectorise the portable conversions into F16C, so their
// loops move 16 elements at a time between memory and float32 vectors with the codecs below, and
// apply the functor's compute operator (the same reduce_ops.h operator) to the float32 lanes.
// The codecs reproduce dtype_float16.h's conversions bit for bit, NaNs included (no FMA is
// enabled, so every lane is the same single IEEE operation); tests/cpp/test_reduce.cc checks that
// this variant and the portable one agree bitwise.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "runtime/dtype.h"
#include "runtime/reduce_loops.h"
#include "runtime/reduce_ops.h"

#define STRAGG_AVX2 __attribute__((target("avx2,f16c")))
#define STRAGG_AVX2_INLINE inline __attribute__((always_inline, target("avx2,f16c")))

namespace stragg::cpu_reduce {

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
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v.a, _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8),
                     _mm256_cvtps_ph(v.b, _MM_FROUND_TO_NEAREST_INT));
  }
};

// Same arithmetic as bf16_to_float/float_to_bf16. Widening interleaves zeros below each element
// (unpacklo/hi within 128-bit lanes: a = elements 0-3, 8-11; b = 4-7, 12-15), and packus of
// (a, b) restores the memory order, so no cross-lane shuffle is needed.
struct Bf16CodecAvx2 {
  static STRAGG_AVX2_INLINE F32x16 load16(const uint16_t* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i z = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v))};
  }
  // Rounded bf16 bits in the low half of each 32-bit lane (high half zero).
  static STRAGG_AVX2_INLINE __m256i round8(__m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan_bits = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(rounded, nan_bits, is_nan);
  }
  static STRAGG_AVX2_INLINE void store16(uint16_t* p, F32x16 v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_packus_epi32(round8(v.a), round8(v.b)));
  }
};

template <class Fmt>
using CodecFor =
    std::conditional_t<std::is_same_v<Fmt, ops::Float16Format>, HalfCodecF16C, Bf16CodecAvx2>;

template <class Fmt>
constexpr bool kIs16BitFloat =
    std::is_same_v<Fmt, ops::Float16Format> || std::is_same_v<Fmt, ops::BFloat16Format>;

// The functor's compute operator on 16 float32 lanes (auto-vectorised: plain loops over arrays).
template <class Fn>
STRAGG_AVX2_INLINE F32x16 apply_lanes(const Fn& fn, F32x16 x, F32x16 y) {
  alignas(32) float a[16], b[16];
  _mm256_store_ps(a, x.a);
  _mm256_store_ps(a + 8, x.b);
  _mm256_store_ps(b, y.a);
  _mm256_store_ps(b + 8, y.b);
  (void)fn;
  for (int k = 0; k < 16; ++k) a[k] = Fn::Operator::apply(a[k], b[k]);
  return {_mm256_load_ps(a), _mm256_load_ps(a + 8)};
}

template <class Fn>
STRAGG_AVX2_INLINE F32x16 apply_lanes(const Fn& fn, F32x16 x) {
  alignas(32) float a[16];
  _mm256_store_ps(a, x.a);
  _mm256_store_ps(a + 8, x.b);
  for (int k = 0; k < 16; ++k) a[k] = fn.op.apply(a[k]);
  return {_mm256_load_ps(a), _mm256_load_ps(a + 8)};
}

// 16-bit floats: blocks of 32 and 16 elements, then a tail padded to a full block so that it is
// computed by the very same instructions.
template <class Fn>
STRAGG_AVX2_INLINE void f16_binary_avx2(uint16_t* d, const uint16_t* s, size_t n, const Fn& fn) {
  using Codec = CodecFor<typename Fn::Format>;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const F32x16 a0 = Codec::load16(d + i), a1 = Codec::load16(d + i + 16);
    const F32x16 b0 = Codec::load16(s + i), b1 = Codec::load16(s + i + 16);
    Codec::store16(d + i, apply_lanes(fn, a0, b0));
    Codec::store16(d + i + 16, apply_lanes(fn, a1, b1));
  }
  if (i + 16 <= n) {
    Codec::store16(d + i, apply_lanes(fn, Codec::load16(d + i), Codec::load16(s + i)));
    i += 16;
  }
  if (i < n) {
    uint16_t ta[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    uint16_t tb[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(ta, d + i, (n - i) * sizeof(uint16_t));
    std::memcpy(tb, s + i, (n - i) * sizeof(uint16_t));
    Codec::store16(ta, apply_lanes(fn, Codec::load16(ta), Codec::load16(tb)));
    std::memcpy(d + i, ta, (n - i) * sizeof(uint16_t));
  }
}

template <class Fn>
STRAGG_AVX2_INLINE void f16_unary_avx2(uint16_t* b, size_t n, const Fn& fn) {
  using Codec = CodecFor<typename Fn::Format>;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const F32x16 a0 = Codec::load16(b + i), a1 = Codec::load16(b + i + 16);
    Codec::store16(b + i, apply_lanes(fn, a0));
    Codec::store16(b + i + 16, apply_lanes(fn, a1));
  }
  if (i + 16 <= n) {
    Codec::store16(b + i, apply_lanes(fn, Codec::load16(b + i)));
    i += 16;
  }
  if (i < n) {
    uint16_t t[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(t, b + i, (n - i) * sizeof(uint16_t));
    Codec::store16(t, apply_lanes(fn, Codec::load16(t)));
    std::memcpy(b + i, t, (n - i) * sizeof(uint16_t));
  }
}

template <class Fn>
STRAGG_AVX2 void avx2_binary(void* d, const void* s, size_t n, Fn fn) {
  using S = StorageOf<Fn>;
  if constexpr (kIs16BitFloat<typename Fn::Format>) {
    f16_binary_avx2(static_cast<uint16_t*>(d), static_cast<const uint16_t*>(s), n, fn);
  } else {
    binary_loop(static_cast<S*>(d), static_cast<const S*>(s), n, fn);
  }
}

template <class Fn>
STRAGG_AVX2 void avx2_unary(void* b, size_t n, Fn fn) {
  if constexpr (kIs16BitFloat<typename Fn::Format>) {
    f16_unary_avx2(static_cast<uint16_t*>(b), n, fn);
  } else {
    unary_loop(static_cast<StorageOf<Fn>*>(b), n, fn);
  }
}

struct Avx2Binary {
  void* d;
  const void* s;
  size_t n;
  template <class Fn>
  STRAGG_HOST_INLINE void operator()(Fn fn) const {
    avx2_binary(d, s, n, fn);
  }
};

struct Avx2Unary {
  void* b;
  size_t n;
  template <class Fn>
  STRAGG_HOST_INLINE void operator()(Fn fn) const {
    avx2_unary(b, n, fn);
  }
};

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

}  // namespace stragg::cpu_reduce

#endif  // x86
