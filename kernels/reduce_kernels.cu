// Element-wise reduction kernels on the GPU (see reduce_kernels.h for the semantics).
//
// Structure: one templated grid-stride kernel per (storage type, operator). The host splits the
// range into a scalar head (so that all pointers reach a 16-byte boundary together), a body of
// 16-byte vectors (uint4 loads/stores, two in flight per thread) and a scalar tail; when the
// pointers are not equally aligned modulo 16 the whole range runs scalar. Arithmetic uses the
// explicit round-to-nearest intrinsics (__fadd_rn, __fmul_rn, __fdiv_rn, ...), which nvcc never
// contracts into FMAs, so results do not depend on -fmad or on how the compiler schedules them.
#include "kernels/reduce_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda_check.h"
#include "runtime/error.h"
#include "runtime/reduce.h"

namespace stragg::gpu {
namespace {

constexpr int kThreads = 256;

// ------------------------------------------------------------------------------------------------
// Storage tags: what sits in memory, and how it widens to the compute type.

struct F16 {  // IEEE half, stored as its bits
  using S = uint16_t;
  static __device__ __forceinline__ float to(S v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ S from(float f) { return __half_as_ushort(__float2half_rn(f)); }
  // The CPU path returns a selected NaN quieted with its payload kept (half -> float -> half).
  static __device__ __forceinline__ S quiet(S v) { return static_cast<S>(v | 0x0200u); }
};

struct BF16 {  // bfloat16, stored as its bits
  using S = uint16_t;
  static __device__ __forceinline__ float to(S v) {
    return __uint_as_float(static_cast<uint32_t>(v) << 16);
  }
  static __device__ __forceinline__ S from(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
  static __device__ __forceinline__ S quiet(S v) { return static_cast<S>(v | 0x0040u); }
};

template <class T>
struct Wide {
  using type = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
};

__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double fadd(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double fmul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float fdiv(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double fdiv(double a, double b) { return __ddiv_rn(a, b); }

// Same predicates as OpMin/OpMax in csrc/runtime/reduce.cc: NaN in a wins, then NaN in b; equal
// values (signed zeros) are ordered by sign.
template <class F>
__device__ __forceinline__ bool take_a_min(F a, F b) {
  return a < b || a != a || (a == b && signbit(a));
}
template <class F>
__device__ __forceinline__ bool take_a_max(F a, F b) {
  return a > b || a != a || (a == b && !signbit(a));
}

// ------------------------------------------------------------------------------------------------
// Operators: static apply(a, b) on storage values.

template <class T>
struct OpSum {
  using S = T;
  static __device__ __forceinline__ T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = typename Wide<T>::type;
      return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
    } else {
      return fadd(a, b);
    }
  }
};

template <class T>
struct OpProd {
  using S = T;
  static __device__ __forceinline__ T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = typename Wide<T>::type;
      return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
    } else {
      return fmul(a, b);
    }
  }
};

template <class T>
struct OpMin {
  using S = T;
  static __device__ __forceinline__ T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? a : b;
    } else {
      return take_a_min(a, b) ? a : b;
    }
  }
};

template <class T>
struct OpMax {
  using S = T;
  static __device__ __forceinline__ T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a > b ? a : b;
    } else {
      return take_a_max(a, b) ? a : b;
    }
  }
};

template <class T>
struct OpBAnd {
  using S = T;
  static __device__ __forceinline__ T apply(T a, T b) { return static_cast<T>(a & b); }
};
template <class T>
struct OpBOr {
  using S = T;
  static __device__ __forceinline__ T apply(T a, T b) { return static_cast<T>(a | b); }
};
template <class T>
struct OpBXor {
  using S = T;
  static __device__ __forceinline__ T apply(T a, T b) { return static_cast<T>(a ^ b); }
};

// 16-bit floats: widen exactly, one float32 operation, round back to nearest-even.
template <class Fmt>
struct Op16Sum {
  using S = typename Fmt::S;
  static __device__ __forceinline__ S apply(S a, S b) {
    return Fmt::from(__fadd_rn(Fmt::to(a), Fmt::to(b)));
  }
};
template <class Fmt>
struct Op16Prod {
  using S = typename Fmt::S;
  static __device__ __forceinline__ S apply(S a, S b) {
    return Fmt::from(__fmul_rn(Fmt::to(a), Fmt::to(b)));
  }
};
// MIN/MAX select one operand; the widen/round-back of the CPU path is the identity except that it
// quiets a NaN, reproduced by Fmt::quiet.
template <class Fmt>
struct Op16Min {
  using S = typename Fmt::S;
  static __device__ __forceinline__ S apply(S a, S b) {
    const float fa = Fmt::to(a), fb = Fmt::to(b);
    const S r = take_a_min(fa, fb) ? a : b;
    return Fmt::to(r) != Fmt::to(r) ? Fmt::quiet(r) : r;
  }
};
template <class Fmt>
struct Op16Max {
  using S = typename Fmt::S;
  static __device__ __forceinline__ S apply(S a, S b) {
    const float fa = Fmt::to(a), fb = Fmt::to(b);
    const S r = take_a_max(fa, fb) ? a : b;
    return Fmt::to(r) != Fmt::to(r) ? Fmt::quiet(r) : r;
  }
};

// Bool bytes: results normalised to 0/1.
struct OpLogicalOr {
  using S = uint8_t;
  static __device__ __forceinline__ S apply(S a, S b) { return static_cast<S>((a | b) != 0); }
};
struct OpLogicalAnd {
  using S = uint8_t;
  static __device__ __forceinline__ S apply(S a, S b) { return static_cast<S>((a != 0) & (b != 0)); }
};
struct OpLogicalXor {
  using S = uint8_t;
  static __device__ __forceinline__ S apply(S a, S b) { return static_cast<S>((a != 0) ^ (b != 0)); }
};

// Unary in-place operators (scale / divide), carrying their parameter.
template <class T>
struct UScale {  // float / double: multiply in the type itself
  using S = T;
  T factor;
  __device__ __forceinline__ T operator()(T x) const { return fmul(x, factor); }
};
template <class Fmt>
struct UScale16 {
  using S = typename Fmt::S;
  float factor;
  __device__ __forceinline__ S operator()(S x) const { return Fmt::from(__fmul_rn(Fmt::to(x), factor)); }
};
template <class T>
struct UDivFloat {
  using S = T;
  T divisor;
  __device__ __forceinline__ T operator()(T x) const { return fdiv(x, divisor); }
};
template <class Fmt>
struct UDiv16 {
  using S = typename Fmt::S;
  float divisor;
  __device__ __forceinline__ S operator()(S x) const { return Fmt::from(__fdiv_rn(Fmt::to(x), divisor)); }
};
// Integer AVG: T(int64(x) / divisor), truncating toward zero; -1 is a wrapping negation (the one
// quotient that can overflow). Matches int_divide in csrc/runtime/reduce.cc for every divisor.
template <class T>
struct UDivInt {
  using S = T;
  int64_t divisor;
  __device__ __forceinline__ T operator()(T x) const {
    using W = typename Wide<T>::type;
    if (divisor == -1) return static_cast<T>(W{0} - static_cast<W>(x));
    return static_cast<T>(static_cast<int64_t>(x) / divisor);
  }
};

// ------------------------------------------------------------------------------------------------
// Kernels.

template <class S>
union Vec16 {
  uint4 v;
  S s[16 / sizeof(S)];
};

// Elements [0, head) and [head + nvec*V, n) scalar, [head, head + nvec*V) as 16-byte vectors.
template <class Op>
__global__ void __launch_bounds__(kThreads)
    binary_kernel(typename Op::S* out, const typename Op::S* a, const typename Op::S* b,
                  size_t head, size_t nvec, size_t n) {
  using S = typename Op::S;
  constexpr int V = 16 / sizeof(S);
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const uint4* av = reinterpret_cast<const uint4*>(a + head);
  const uint4* bv = reinterpret_cast<const uint4*>(b + head);
  uint4* ov = reinterpret_cast<uint4*>(out + head);
  size_t i = tid;
  // Two independent vectors per iteration keep more loads in flight.
  for (; i + stride < nvec; i += 2 * stride) {
    Vec16<S> x0, y0, x1, y1;
    x0.v = av[i];
    y0.v = bv[i];
    x1.v = av[i + stride];
    y1.v = bv[i + stride];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      x0.s[k] = Op::apply(x0.s[k], y0.s[k]);
      x1.s[k] = Op::apply(x1.s[k], y1.s[k]);
    }
    ov[i] = x0.v;
    ov[i + stride] = x1.v;
  }
  if (i < nvec) {
    Vec16<S> x, y;
    x.v = av[i];
    y.v = bv[i];
#pragma unroll
    for (int k = 0; k < V; ++k) x.s[k] = Op::apply(x.s[k], y.s[k]);
    ov[i] = x.v;
  }
  const size_t body_end = head + nvec * V;
  const size_t scalar = head + (n - body_end);
  for (size_t j = tid; j < scalar; j += stride) {
    const size_t e = j < head ? j : body_end + (j - head);
    out[e] = Op::apply(a[e], b[e]);
  }
}

template <class U>
__global__ void __launch_bounds__(kThreads)
    unary_kernel(typename U::S* buf, U u, size_t head, size_t nvec, size_t n) {
  using S = typename U::S;
  constexpr int V = 16 / sizeof(S);
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  uint4* bv = reinterpret_cast<uint4*>(buf + head);
  for (size_t i = tid; i < nvec; i += stride) {
    Vec16<S> x;
    x.v = bv[i];
#pragma unroll
    for (int k = 0; k < V; ++k) x.s[k] = u(x.s[k]);
    bv[i] = x.v;
  }
  const size_t body_end = head + nvec * V;
  const size_t scalar = head + (n - body_end);
  for (size_t j = tid; j < scalar; j += stride) {
    const size_t e = j < head ? j : body_end + (j - head);
    buf[e] = u(buf[e]);
  }
}

// ------------------------------------------------------------------------------------------------
// Host side: layout and launch.

struct Layout {
  size_t head = 0;  // scalar elements before the vector body
  size_t nvec = 0;  // 16-byte vectors in the body
};

// The vector body needs every pointer at the same address modulo 16.
Layout layout_for(size_t elem, size_t count, std::initializer_list<const void*> ptrs) {
  Layout l;
  const uintptr_t first = reinterpret_cast<uintptr_t>(*ptrs.begin()) & 15u;
  for (const void* p : ptrs) {
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != first) return l;  // all scalar
  }
  const size_t head = first == 0 ? 0 : (16 - first) / elem;
  if (head >= count) {
    l.head = count;
    return l;
  }
  l.head = head;
  l.nvec = (count - head) * elem / 16;
  return l;
}

int sm_count() {
  // Per device; a device's SM count never changes.
  static std::mutex mu;
  static int cached[64] = {0};
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "stragg: gpu reduce: cudaGetDevice");
  if (dev < 0 || dev >= 64) dev = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (cached[dev] == 0) {
    int n = 0;
    cuda_check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
               "stragg: gpu reduce: cudaDeviceGetAttribute");
    cached[dev] = n > 0 ? n : 1;
  }
  return cached[dev];
}

unsigned blocks_for(const Layout& l, size_t count, size_t elem) {
  const size_t body = l.nvec * 16 / elem;
  const size_t work = std::max(l.nvec, count - body);  // threads with something to do
  const size_t want = (work + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(sm_count()) * 8;  // 2048 threads per SM
  return static_cast<unsigned>(std::max<size_t>(1, std::min(want, cap)));
}

std::string what(const char* fn, DType t, const char* op, size_t count) {
  return std::string("stragg: gpu ") + fn + " " + op + " " + dtype_name(t) + " (" +
         std::to_string(count) + " elements)";
}

void check_aligned(const char* fn, DType t, const char* op, size_t count, const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(t) != 0) {
    throw Error(what(fn, t, op, count) + ": pointer " + std::to_string(reinterpret_cast<uintptr_t>(p)) +
                " is not aligned to the element size");
  }
}

template <class Op>
void launch_binary(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count,
                   cudaStream_t stream) {
  using S = typename Op::S;
  const Layout l = layout_for(sizeof(S), count, {out, a, b});
  binary_kernel<Op><<<blocks_for(l, count, sizeof(S)), kThreads, 0, stream>>>(
      static_cast<S*>(out), static_cast<const S*>(a), static_cast<const S*>(b), l.head, l.nvec,
      count);
  cuda_check(cudaGetLastError(), what("reduce", t, reduce_op_name(op), count) + ": kernel launch");
}

template <class U>
void launch_unary(const char* fn, DType t, void* buf, size_t count, U u, cudaStream_t stream) {
  using S = typename U::S;
  const Layout l = layout_for(sizeof(S), count, {buf});
  unary_kernel<U><<<blocks_for(l, count, sizeof(S)), kThreads, 0, stream>>>(static_cast<S*>(buf), u,
                                                                             l.head, l.nvec, count);
  cuda_check(cudaGetLastError(), what(fn, t, "", count) + ": kernel launch");
}

template <class T>
void binary_typed(DType t, ReduceOp op, void* o, const void* a, const void* b, size_t n,
                  cudaStream_t s) {
  switch (op) {
    case ReduceOp::Sum: return launch_binary<OpSum<T>>(t, op, o, a, b, n, s);
    case ReduceOp::Prod: return launch_binary<OpProd<T>>(t, op, o, a, b, n, s);
    case ReduceOp::Min: return launch_binary<OpMin<T>>(t, op, o, a, b, n, s);
    case ReduceOp::Max: return launch_binary<OpMax<T>>(t, op, o, a, b, n, s);
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::BAnd) return launch_binary<OpBAnd<T>>(t, op, o, a, b, n, s);
        if (op == ReduceOp::BOr) return launch_binary<OpBOr<T>>(t, op, o, a, b, n, s);
        return launch_binary<OpBXor<T>>(t, op, o, a, b, n, s);
      }
      return;  // floating: rejected by reduce_supported before
  }
}

template <class Fmt>
void binary_16(DType t, ReduceOp op, void* o, const void* a, const void* b, size_t n,
               cudaStream_t s) {
  switch (op) {
    case ReduceOp::Sum: return launch_binary<Op16Sum<Fmt>>(t, op, o, a, b, n, s);
    case ReduceOp::Prod: return launch_binary<Op16Prod<Fmt>>(t, op, o, a, b, n, s);
    case ReduceOp::Min: return launch_binary<Op16Min<Fmt>>(t, op, o, a, b, n, s);
    case ReduceOp::Max: return launch_binary<Op16Max<Fmt>>(t, op, o, a, b, n, s);
    default: return;  // bitwise ops: rejected before
  }
}

void binary_bool(DType t, ReduceOp op, void* o, const void* a, const void* b, size_t n,
                 cudaStream_t s) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
    case ReduceOp::BOr:
      return launch_binary<OpLogicalOr>(t, op, o, a, b, n, s);
    case ReduceOp::Prod:
    case ReduceOp::Min:
    case ReduceOp::BAnd:
      return launch_binary<OpLogicalAnd>(t, op, o, a, b, n, s);
    case ReduceOp::BXor:
      return launch_binary<OpLogicalXor>(t, op, o, a, b, n, s);
  }
}

bool overlap_partially(const void* x, const void* y, size_t bytes) {
  const auto* a = static_cast<const unsigned char*>(x);
  const auto* b = static_cast<const unsigned char*>(y);
  return a != b && a < b + bytes && b < a + bytes;
}

bool valid_dtype(DType t) { return static_cast<unsigned>(t) <= static_cast<unsigned>(DType::Bool); }

}  // namespace

void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count,
            cudaStream_t stream) {
  if (!reduce_supported(t, op)) {
    throw Error(std::string("stragg: gpu reduce: op ") + reduce_op_name(op) +
                " is not supported for dtype " + dtype_name(t));
  }
  if (count == 0) return;
  const size_t bytes = count * dtype_size(t);
  if (overlap_partially(out, a, bytes) || overlap_partially(out, b, bytes)) {
    throw Error(what("reduce", t, reduce_op_name(op), count) +
                ": output and input overlap partially");
  }
  for (const void* p : {static_cast<const void*>(out), a, b}) {
    check_aligned("reduce", t, reduce_op_name(op), count, p);
  }
  switch (t) {
    case DType::Float32: return binary_typed<float>(t, op, out, a, b, count, stream);
    case DType::Float64: return binary_typed<double>(t, op, out, a, b, count, stream);
    case DType::Float16: return binary_16<F16>(t, op, out, a, b, count, stream);
    case DType::BFloat16: return binary_16<BF16>(t, op, out, a, b, count, stream);
    case DType::Int8: return binary_typed<int8_t>(t, op, out, a, b, count, stream);
    case DType::UInt8: return binary_typed<uint8_t>(t, op, out, a, b, count, stream);
    case DType::Int16: return binary_typed<int16_t>(t, op, out, a, b, count, stream);
    case DType::Int32: return binary_typed<int32_t>(t, op, out, a, b, count, stream);
    case DType::Int64: return binary_typed<int64_t>(t, op, out, a, b, count, stream);
    case DType::Bool: return binary_bool(t, op, out, a, b, count, stream);
  }
}

void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count,
                 cudaStream_t stream) {
  reduce(t, op, dst, dst, src, count, stream);
}

void scale(DType t, void* buf, size_t count, double factor, cudaStream_t stream) {
  if (!valid_dtype(t) || !is_floating(t)) {
    throw Error(std::string("stragg: gpu scale (PREMUL_SUM) is not supported for dtype ") +
                dtype_name(t));
  }
  if (count == 0) return;
  check_aligned("scale", t, "", count, buf);
  const float f = static_cast<float>(factor);
  switch (t) {
    case DType::Float32: return launch_unary("scale", t, buf, count, UScale<float>{f}, stream);
    case DType::Float64: return launch_unary("scale", t, buf, count, UScale<double>{factor}, stream);
    case DType::Float16: return launch_unary("scale", t, buf, count, UScale16<F16>{f}, stream);
    case DType::BFloat16: return launch_unary("scale", t, buf, count, UScale16<BF16>{f}, stream);
    default: return;
  }
}

void divide(DType t, void* buf, size_t count, int64_t divisor, cudaStream_t stream) {
  if (!valid_dtype(t) || t == DType::Bool) {
    throw Error(std::string("stragg: gpu divide (AVG) is not supported for dtype ") + dtype_name(t));
  }
  if (divisor == 0 && !is_floating(t)) {
    throw Error(std::string("stragg: gpu divide (AVG): integer division by zero for dtype ") +
                dtype_name(t));
  }
  if (count == 0) return;
  check_aligned("divide", t, "", count, buf);
  const char* fn = "divide";
  const float fd = static_cast<float>(divisor);
  switch (t) {
    case DType::Float32: return launch_unary(fn, t, buf, count, UDivFloat<float>{fd}, stream);
    case DType::Float64:
      return launch_unary(fn, t, buf, count, UDivFloat<double>{static_cast<double>(divisor)}, stream);
    case DType::Float16: return launch_unary(fn, t, buf, count, UDiv16<F16>{fd}, stream);
    case DType::BFloat16: return launch_unary(fn, t, buf, count, UDiv16<BF16>{fd}, stream);
    case DType::Int8: return launch_unary(fn, t, buf, count, UDivInt<int8_t>{divisor}, stream);
    case DType::UInt8: return launch_unary(fn, t, buf, count, UDivInt<uint8_t>{divisor}, stream);
    case DType::Int16: return launch_unary(fn, t, buf, count, UDivInt<int16_t>{divisor}, stream);
    case DType::Int32: return launch_unary(fn, t, buf, count, UDivInt<int32_t>{divisor}, stream);
    case DType::Int64: return launch_unary(fn, t, buf, count, UDivInt<int64_t>{divisor}, stream);
    case DType::Bool: return;
  }
}

}  // namespace stragg::gpu
