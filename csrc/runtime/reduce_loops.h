// Loops of the CPU reduction over the element functors of reduce_ops.h (private to reduce.cc;
// no torch, no CUDA).
//
// The loops are templated on the functor and run over element-aligned, non-aliasing pointers
// (reduce.cc bounces anything else through aligned buffers); the compiler auto-vectorises them at
// -O3 for the ISA of the function they are inlined into (reduce_loops_avx2.h instantiates them
// under AVX2). Integer AVG has a faster loop than IntDivide element by element (integer division
// does not vectorise); it computes exactly IntDivide::apply (tests/cpp/test_reduce.cc checks it
// against C division, tests/cpp/test_reduce_kernel_loop.cc against the functor itself).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "runtime/reduce_ops.h"

#if defined(__GNUC__) || defined(__clang__)
#define STRAGG_RESTRICT __restrict__
#else
#define STRAGG_RESTRICT
#endif

namespace stragg::cpu_reduce {

template <class Fn>
using StorageOf = typename Fn::Storage;

template <class Fn>
STRAGG_HOST_INLINE void binary_loop(StorageOf<Fn>* STRAGG_RESTRICT d,
                                    const StorageOf<Fn>* STRAGG_RESTRICT s, size_t n, Fn fn) {
  for (size_t i = 0; i < n; ++i) d[i] = fn(d[i], s[i]);
}

// Integer division truncating toward zero, as C's `/` on int64 then wrapped back to T:
// result = T(int64_t(x) / divisor). divisor != 0 (checked by the caller).
template <class T>
STRAGG_HOST_INLINE void int_divide_loop(T* STRAGG_RESTRICT b, size_t n, int64_t divisor) {
  using W = typename ops::Wide<T>::type;
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
    const uint64_t ad =
        divisor < 0 ? uint64_t{0} - static_cast<uint64_t>(divisor) : static_cast<uint64_t>(divisor);
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

template <class Fn>
struct IsIntDivide : std::false_type {};
template <class T>
struct IsIntDivide<ops::Unary<ops::PlainFormat<T>, ops::IntDivide<T>>> : std::true_type {};

template <class Fn>
STRAGG_HOST_INLINE void unary_loop(StorageOf<Fn>* STRAGG_RESTRICT b, size_t n, Fn fn) {
  if constexpr (IsIntDivide<Fn>::value) {
    int_divide_loop(b, n, fn.op.divisor);
  } else {
    for (size_t i = 0; i < n; ++i) b[i] = fn(b[i]);
  }
}

// One out-of-line function per functor for the baseline ISA (the AVX2 ones are in
// reduce_loops_avx2.h).
template <class Fn>
void portable_binary(void* d, const void* s, size_t n, Fn fn) {
  binary_loop(static_cast<StorageOf<Fn>*>(d), static_cast<const StorageOf<Fn>*>(s), n, fn);
}

template <class Fn>
void portable_unary(void* b, size_t n, Fn fn) {
  unary_loop(static_cast<StorageOf<Fn>*>(b), n, fn);
}

// Visitors for ops::visit_*: run the functor they are given over the buffers.
struct PortableBinary {
  void* d;
  const void* s;
  size_t n;
  template <class Fn>
  STRAGG_HOST_INLINE void operator()(Fn fn) const {
    portable_binary(d, s, n, fn);
  }
};

struct PortableUnary {
  void* b;
  size_t n;
  template <class Fn>
  STRAGG_HOST_INLINE void operator()(Fn fn) const {
    portable_unary(b, n, fn);
  }
};

}  // namespace stragg::cpu_reduce
