// The element loop of the reduction kernels, one thread's share of it, for host and device code
// (no torch; no CUDA when compiled by a host compiler).
//
// kernels/reduce_kernels.cu runs these bodies as CUDA kernels (thread id and stride from the
// grid); kernels/host/host_kernels.cc runs the very same bodies on the host for every thread of
// a virtual grid, which is how CI (no GPU) checks them bitwise against the CPU reduction
// (tests/cpp/test_reduce_kernel_loop.cc) and runs the GPU executor (tests/cpp/test_host_gpu_*).
//
// The range [0, n) is split by the host (reduce_launch.h) into a scalar head (so that every
// pointer reaches a kVecBytes boundary together), a body of kVecBytes vectors (two in flight per
// thread) and a scalar tail; when the pointers are not equally aligned modulo kVecBytes the whole
// range runs scalar. Thread `tid` of `stride` threads takes vectors tid, tid + stride, ... and
// scalar elements likewise; every element is read and written by exactly one thread, so the
// threads may run in any order or concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "runtime/dtype_float16.h"

namespace stragg::gpu {

constexpr size_t kVecBytes = 16;       // one 128-bit load/store per vector on the GPU
constexpr int kThreadsPerBlock = 256;  // of the CUDA kernels

// Where the vector body starts and how long it is (set up by reduce_launch.h's layout_for).
struct Layout {
  size_t head = 0;  // scalar elements before the vector body
  size_t nvec = 0;  // vectors in the body
};

// The raw vector moved by one load or store.
template <size_t kBytes>
struct alignas(kBytes) RawVec {
  uint32_t w[kBytes / 4];
};
#if defined(__CUDACC__)
template <>
struct RawVec<16> {
  uint4 v;
};
#endif

template <class S, size_t kBytes>
union Vec {
  RawVec<kBytes> raw;
  S s[kBytes / sizeof(S)];
};

// Vector i of the body starting at p (kBytes-aligned). Host code copies bytes (no aliasing of
// element storage through another type); device code does one wide access.
template <class S, size_t kBytes>
STRAGG_HD_INLINE Vec<S, kBytes> load_vec(const S* p, size_t i) {
  Vec<S, kBytes> v;
#if defined(__CUDA_ARCH__)
  v.raw = reinterpret_cast<const RawVec<kBytes>*>(p)[i];
#else
  std::memcpy(v.s, reinterpret_cast<const unsigned char*>(p) + i * kBytes, kBytes);
#endif
  return v;
}

template <class S, size_t kBytes>
STRAGG_HD_INLINE void store_vec(S* p, size_t i, const Vec<S, kBytes>& v) {
#if defined(__CUDA_ARCH__)
  reinterpret_cast<RawVec<kBytes>*>(p)[i] = v.raw;
#else
  std::memcpy(reinterpret_cast<unsigned char*>(p) + i * kBytes, v.s, kBytes);
#endif
}

// Element index of the j-th scalar element (head first, then tail).
STRAGG_HD_INLINE size_t scalar_element(size_t j, size_t head, size_t body_end) {
  return j < head ? j : body_end + (j - head);
}

// out[e] = fn(a[e], b[e]) for this thread's elements. out may equal a or b (in place).
template <class Fn, size_t kBytes = kVecBytes>
STRAGG_HD_INLINE void binary_thread(size_t tid, size_t stride, Fn fn, typename Fn::Storage* out,
                                    const typename Fn::Storage* a, const typename Fn::Storage* b,
                                    Layout l, size_t n) {
  using S = typename Fn::Storage;
  constexpr int V = static_cast<int>(kBytes / sizeof(S));
  const S* av = a + l.head;
  const S* bv = b + l.head;
  S* ov = out + l.head;
  size_t i = tid;
  // Two independent vectors per iteration keep more loads in flight.
  for (; i + stride < l.nvec; i += 2 * stride) {
    Vec<S, kBytes> x0 = load_vec<S, kBytes>(av, i), y0 = load_vec<S, kBytes>(bv, i);
    Vec<S, kBytes> x1 = load_vec<S, kBytes>(av, i + stride);
    const Vec<S, kBytes> y1 = load_vec<S, kBytes>(bv, i + stride);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < V; ++k) {
      x0.s[k] = fn(x0.s[k], y0.s[k]);
      x1.s[k] = fn(x1.s[k], y1.s[k]);
    }
    store_vec<S, kBytes>(ov, i, x0);
    store_vec<S, kBytes>(ov, i + stride, x1);
  }
  if (i < l.nvec) {
    Vec<S, kBytes> x = load_vec<S, kBytes>(av, i);
    const Vec<S, kBytes> y = load_vec<S, kBytes>(bv, i);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < V; ++k) x.s[k] = fn(x.s[k], y.s[k]);
    store_vec<S, kBytes>(ov, i, x);
  }
  const size_t body_end = l.head + l.nvec * V;
  const size_t scalar = l.head + (n - body_end);
  for (size_t j = tid; j < scalar; j += stride) {
    const size_t e = scalar_element(j, l.head, body_end);
    out[e] = fn(a[e], b[e]);
  }
}

// buf[e] = fn(buf[e]) for this thread's elements.
template <class Fn, size_t kBytes = kVecBytes>
STRAGG_HD_INLINE void unary_thread(size_t tid, size_t stride, Fn fn, typename Fn::Storage* buf,
                                   Layout l, size_t n) {
  using S = typename Fn::Storage;
  constexpr int V = static_cast<int>(kBytes / sizeof(S));
  S* bv = buf + l.head;
  for (size_t i = tid; i < l.nvec; i += stride) {
    Vec<S, kBytes> x = load_vec<S, kBytes>(bv, i);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < V; ++k) x.s[k] = fn(x.s[k]);
    store_vec<S, kBytes>(bv, i, x);
  }
  const size_t body_end = l.head + l.nvec * V;
  const size_t scalar = l.head + (n - body_end);
  for (size_t j = tid; j < scalar; j += stride) {
    const size_t e = scalar_element(j, l.head, body_end);
    buf[e] = fn(buf[e]);
  }
}

}  // namespace stragg::gpu
