// float16 / bfloat16 <-> float32 conversions, bit-exact, for host and device code (no torch; no
// CUDA when compiled by a host compiler).
//
// Conventions (the CPU reduction and the CUDA kernels share them, tests/cpp checks them):
//  * half -> float is exact; a signalling NaN comes out quiet (bit 22 set), as x86's VCVTPH2PS.
//  * float -> half rounds to nearest-even; overflow gives +-inf; NaN gives a quiet NaN keeping
//    the sign and the top 10 payload bits (as VCVTPS2PH).
//  * bfloat16 -> float is a shift; float -> bfloat16 rounds to nearest-even, NaN gives a quiet NaN
//    keeping the sign and the top 7 payload bits.
// The portable code below is branch-free integer code (loops over it vectorise) and exact whatever
// the floating-point environment (rounding mode, DAZ/FTZ). Device code (nvcc) converts half with
// the hardware instructions, which round the same way (IEEE nearest-even, subnormals kept), and
// applies the NaN rules above itself; see Float16Device.
//
// Also defines STRAGG_HD / STRAGG_HD_INLINE, the qualifiers of code shared by host and device:
// `__host__ __device__` under nvcc, nothing (plus always_inline) under a host compiler.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define STRAGG_HD __host__ __device__
#define STRAGG_HD_INLINE __host__ __device__ __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define STRAGG_HD
#define STRAGG_HD_INLINE inline __attribute__((always_inline))
#else
#define STRAGG_HD
#define STRAGG_HD_INLINE inline
#endif

namespace stragg::ops {

STRAGG_HD_INLINE uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

STRAGG_HD_INLINE float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Bitwise select. Used where an operand comes from floating-point arithmetic: a `?:` there lets
// GCC sink the FP op into a branch that it then cannot if-convert (-ftrapping-math), which stops
// loops over these conversions from vectorising.
STRAGG_HD_INLINE uint32_t select_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}

// ------------------------------------------------------------------------------------------------
// Portable conversions (the definition; what the CPU runs).

STRAGG_HD_INLINE float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;           // exponent and mantissa
  uint32_t r = (em << 13) + 0x38000000u;     // normal: rebias exponent 15 -> 127
  r = em >= 0x7c00u ? r + 0x38000000u : r;   // inf/NaN: exponent all ones
  r = em > 0x7c00u ? (r | 0x00400000u) : r;  // NaN: quiet it (like VCVTPH2PS)
  // Zero/subnormal: mantissa * 2^-24, exact, and a normal float (so DAZ/FTZ cannot touch it).
  const uint32_t sub = bits_of(static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f);
  r = select_bits(em < 0x0400u, sub, r);
  return float_of(r | sign);
}

// The quiet half NaN that float_to_half gives for the float NaN with bits x.
STRAGG_HD_INLINE uint16_t half_nan_of(uint32_t x) {
  return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x03ffu));
}

STRAGG_HD_INLINE uint16_t float_to_half(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int32_t ax = static_cast<int32_t>(x & 0x7fffffffu);
  // NaN: quiet, keep the top payload bits (like VCVTPS2PH).
  const int32_t nan_h = 0x7e00 | ((ax >> 13) & 0x03ff);
  // Normal half range [2^-14, 65520): rebias the exponent, round the 13 dropped bits to
  // nearest-even. (Wraps for smaller inputs, whose result is not selected.)
  const uint32_t uax = static_cast<uint32_t>(ax);
  const uint32_t norm_h = (uax - 0x38000000u + 0x0fffu + ((uax >> 13) & 1u)) >> 13;
  // Below 2^-14 the result counts units of 2^-24: value = m * 2^(e-150) = (m >> (126-e)) * 2^-24.
  // The shift is 14..24 for the inputs this branch is chosen for; clamping it to [14, 25] keeps it
  // defined for the others (25 gives 0, right for everything below 2^-25).
  int32_t shift = 126 - (ax >> 23);
  shift = shift < 14 ? 14 : shift;
  shift = shift > 25 ? 25 : shift;
  const uint32_t m = (uax & 0x007fffffu) | 0x00800000u;
  // Round to nearest-even while shifting: add half an output unit, minus one unless the
  // truncated result is odd.
  const uint32_t sub_h = (m + (1u << (shift - 1)) - 1u + ((m >> shift) & 1u)) >> shift;
  uint32_t h = ax >= 0x38800000 ? norm_h : sub_h;
  h = ax >= 0x477ff000 ? 0x7c00u : h;  // >= 65520 rounds to inf (65504 is odd)
  h = ax > 0x7f800000 ? static_cast<uint32_t>(nan_h) : h;
  return static_cast<uint16_t>(sign | h);
}

STRAGG_HD_INLINE float bf16_to_float(uint16_t b) {
  return float_of(static_cast<uint32_t>(b) << 16);
}

STRAGG_HD_INLINE uint16_t float_to_bf16(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t nan_bits = (x >> 16) | 0x0040u;                    // quiet NaN, keep sign/payload
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // nearest-even, overflow->inf
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan_bits : rounded);
}

// ------------------------------------------------------------------------------------------------
// Storage formats: how a stored element widens to its compute type and narrows back. The reduce
// operators (reduce_ops.h) run on compute values.

// float16: compute in float32.
struct Float16Format {
  using Storage = uint16_t;
  using Compute = float;
  STRAGG_HD_INLINE static float to(uint16_t h) {
#if defined(__CUDA_ARCH__)
    // The hardware widening is exact; NaNs get the portable rule (quiet, payload kept).
    const float f = __half2float(__ushort_as_half(h));
    return (h & 0x7fffu) > 0x7c00u ? half_to_float(h) : f;
#else
    return half_to_float(h);
#endif
  }
  STRAGG_HD_INLINE static uint16_t from(float f) {
#if defined(__CUDA_ARCH__)
    // cvt.rn.f16.f32: nearest-even, subnormals kept, overflow to inf, as float_to_half.
    return f != f ? half_nan_of(bits_of(f)) : __half_as_ushort(__float2half_rn(f));
#else
    return float_to_half(f);
#endif
  }
};

// bfloat16: compute in float32 (the portable code is a few integer operations everywhere).
struct BFloat16Format {
  using Storage = uint16_t;
  using Compute = float;
  STRAGG_HD_INLINE static float to(uint16_t b) { return bf16_to_float(b); }
  STRAGG_HD_INLINE static uint16_t from(float f) { return float_to_bf16(f); }
};

// Every other type computes in itself.
template <class T>
struct PlainFormat {
  using Storage = T;
  using Compute = T;
  STRAGG_HD_INLINE static T to(T v) { return v; }
  STRAGG_HD_INLINE static T from(T v) { return v; }
};

}  // namespace stragg::ops
