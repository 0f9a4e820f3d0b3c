// The one definition of every reduce operator, for host and device code (no torch; no CUDA when
// compiled by a host compiler). The CPU reduction (reduce.cc) and the CUDA kernels
// (kernels/reduce_kernels.cu) instantiate these functors; tests/cpp/test_reduce_kernel_loop.cc
// runs the kernels' element loop over them on the host and compares it bitwise with reduce.cc.
//
// Semantics:
//  * Every element is one IEEE operation in the compute type: float32 for float16 / bfloat16
//    (widened exactly, rounded back to nearest-even, dtype_float16.h), the type itself otherwise.
//    Device code uses the explicit round-to-nearest intrinsics (never contracted into FMAs).
//  * Integer SUM / PRODUCT wrap (computed in an unsigned type at least as wide as `unsigned`, so
//    16-bit products cannot overflow a promoted int).
//  * MIN / MAX propagate NaN like torch.minimum / maximum (a NaN in a wins, then a NaN in b) and
//    order signed zeros (min(-0, +0) = -0, max(-0, +0) = +0), so the result does not depend on
//    operand order: schedules where two ranks reduce the same pair from opposite sides
//    (StragglAR's straggler exchange) must still end with bitwise identical data.
//  * Bool (one byte): SUM / MAX / BOR = OR, PRODUCT / MIN / BAND = AND, BXOR = XOR; results are
//    0/1 whatever the input bytes.
//  * PREMUL_SUM scales by float(factor) in float32 (16-bit floats, float32) or by factor in double.
//  * AVG divides floats in their compute type; integers truncate toward zero (like ncclAvg):
//    T(int64(x) / divisor), divisor -1 being a wrapping negation. Bool has no AVG.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime/dtype.h"
#include "runtime/dtype_float16.h"

#if defined(__CUDACC__)
#define STRAGG_HOST_INLINE __host__ __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define STRAGG_HOST_INLINE inline __attribute__((always_inline))
#else
#define STRAGG_HOST_INLINE inline
#endif

namespace stragg::ops {

// ------------------------------------------------------------------------------------------------
// Arithmetic primitives: one correctly rounded IEEE operation each.

STRAGG_HD_INLINE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRAGG_HD_INLINE double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
STRAGG_HD_INLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRAGG_HD_INLINE double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
STRAGG_HD_INLINE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
STRAGG_HD_INLINE double div_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// The sign bit as an integer operation (host compilers vectorise it, std::signbit on double
// they do not).
STRAGG_HD_INLINE bool sign_bit(float x) { return (bits_of(x) >> 31) != 0; }
STRAGG_HD_INLINE bool sign_bit(double x) {
#if defined(__CUDA_ARCH__)
  return (static_cast<uint64_t>(__double_as_longlong(x)) >> 63) != 0;
#else
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u >> 63) != 0;
#endif
}

// Unsigned type for wrapping integer arithmetic on T.
template <class T>
struct Wide {
  using type =
      std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
};

// ------------------------------------------------------------------------------------------------
// Binary operators on compute values: static apply(a, b); a is the accumulator (dst), b the
// incoming value.

struct Sum {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = typename Wide<T>::type;
      return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
    } else {
      return add_rn(a, b);
    }
  }
};

struct Prod {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using W = typename Wide<T>::type;
      return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
    } else {
      return mul_rn(a, b);
    }
  }
};

struct Min {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? a : b;
    } else {
      // `|` and `&`, not `||` and `&&`: no branches, so that loops over it vectorise.
      const bool take_a = (a < b) | (a != a) | ((a == b) & sign_bit(a));
      return take_a ? a : b;
    }
  }
};

struct Max {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a > b ? a : b;
    } else {
      const bool take_a = (a > b) | (a != a) | ((a == b) & !sign_bit(a));
      return take_a ? a : b;
    }
  }
};

struct BAnd {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    return static_cast<T>(a & b);
  }
};
struct BOr {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    return static_cast<T>(a | b);
  }
};
struct BXor {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    return static_cast<T>(a ^ b);
  }
};

// Bool bytes.
struct LogicalOr {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    return static_cast<T>((a | b) != 0);
  }
};
struct LogicalAnd {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    return static_cast<T>((a != 0) & (b != 0));
  }
};
struct LogicalXor {
  template <class T>
  STRAGG_HD_INLINE static T apply(T a, T b) {
    return static_cast<T>((a != 0) ^ (b != 0));
  }
};

// ------------------------------------------------------------------------------------------------
// Unary operators on compute values, carrying their parameter: apply(x).

template <class C>
struct Scale {  // PREMUL_SUM
  C factor;
  STRAGG_HD_INLINE C apply(C x) const { return mul_rn(x, factor); }
};

template <class C>
struct Divide {  // AVG of floating types
  C divisor;
  STRAGG_HD_INLINE C apply(C x) const { return div_rn(x, divisor); }
};

template <class T>
struct IntDivide {  // AVG of integer types; divisor != 0 (checked by the callers)
  int64_t divisor;
  STRAGG_HD_INLINE T apply(T x) const {
    using W = typename Wide<T>::type;
    if (divisor == -1) return static_cast<T>(W{0} - static_cast<W>(x));  // INT_MIN / -1 wraps
    return static_cast<T>(static_cast<int64_t>(x) / divisor);
  }
};

// ------------------------------------------------------------------------------------------------
// Element functors on stored values: what a loop or a kernel applies to each element.

template <class Fmt, class Op>
struct Binary {
  using Format = Fmt;
  using Storage = typename Fmt::Storage;
  using Operator = Op;
  STRAGG_HD_INLINE Storage operator()(Storage a, Storage b) const {
    return Fmt::from(Op::apply(Fmt::to(a), Fmt::to(b)));
  }
};

template <class Fmt, class U>
struct Unary {
  using Format = Fmt;
  using Storage = typename Fmt::Storage;
  using Operator = U;
  U op;
  STRAGG_HD_INLINE Storage operator()(Storage x) const { return Fmt::from(op.apply(Fmt::to(x))); }
};

// ------------------------------------------------------------------------------------------------
// The one mapping from (dtype, op) to element functors. visit(fn) is called with the functor of
// the combination; the functions return false (and call nothing) for unsupported combinations.

template <class T, class Visit>
STRAGG_HOST_INLINE bool visit_binary_plain(ReduceOp op, Visit& visit) {
  using F = PlainFormat<T>;
  switch (op) {
    case ReduceOp::Sum:
      visit(Binary<F, Sum>{});
      return true;
    case ReduceOp::Prod:
      visit(Binary<F, Prod>{});
      return true;
    case ReduceOp::Min:
      visit(Binary<F, Min>{});
      return true;
    case ReduceOp::Max:
      visit(Binary<F, Max>{});
      return true;
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::BAnd)
          visit(Binary<F, BAnd>{});
        else if (op == ReduceOp::BOr)
          visit(Binary<F, BOr>{});
        else
          visit(Binary<F, BXor>{});
        return true;
      }
      return false;
  }
  return false;
}

template <class Visit>
STRAGG_HOST_INLINE bool visit_binary_bool(ReduceOp op, Visit& visit) {
  using F = PlainFormat<uint8_t>;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
    case ReduceOp::BOr:
      visit(Binary<F, LogicalOr>{});
      return true;
    case ReduceOp::Prod:
    case ReduceOp::Min:
    case ReduceOp::BAnd:
      visit(Binary<F, LogicalAnd>{});
      return true;
    case ReduceOp::BXor:
      visit(Binary<F, LogicalXor>{});
      return true;
  }
  return false;
}

template <class Fmt, class Visit>
STRAGG_HOST_INLINE bool visit_binary_16(ReduceOp op, Visit& visit) {
  switch (op) {
    case ReduceOp::Sum:
      visit(Binary<Fmt, Sum>{});
      return true;
    case ReduceOp::Prod:
      visit(Binary<Fmt, Prod>{});
      return true;
    case ReduceOp::Min:
      visit(Binary<Fmt, Min>{});
      return true;
    case ReduceOp::Max:
      visit(Binary<Fmt, Max>{});
      return true;
    default:
      return false;  // bitwise ops on floats
  }
}

// dst = op(dst, src) element functor of (t, op).
template <class Visit>
STRAGG_HOST_INLINE bool visit_binary(DType t, ReduceOp op, Visit&& visit) {
  switch (t) {
    case DType::Float32:
      return visit_binary_plain<float>(op, visit);
    case DType::Float64:
      return visit_binary_plain<double>(op, visit);
    case DType::Float16:
      return visit_binary_16<Float16Format>(op, visit);
    case DType::BFloat16:
      return visit_binary_16<BFloat16Format>(op, visit);
    case DType::Int8:
      return visit_binary_plain<int8_t>(op, visit);
    case DType::UInt8:
      return visit_binary_plain<uint8_t>(op, visit);
    case DType::Int16:
      return visit_binary_plain<int16_t>(op, visit);
    case DType::Int32:
      return visit_binary_plain<int32_t>(op, visit);
    case DType::Int64:
      return visit_binary_plain<int64_t>(op, visit);
    case DType::Bool:
      return visit_binary_bool(op, visit);
  }
  return false;
}

// buf *= factor (PREMUL_SUM): floating types only.
template <class Visit>
STRAGG_HOST_INLINE bool visit_scale(DType t, double factor, Visit&& visit) {
  const float f = static_cast<float>(factor);
  switch (t) {
    case DType::Float32:
      visit(Unary<PlainFormat<float>, Scale<float>>{{f}});
      return true;
    case DType::Float64:
      visit(Unary<PlainFormat<double>, Scale<double>>{{factor}});
      return true;
    case DType::Float16:
      visit(Unary<Float16Format, Scale<float>>{{f}});
      return true;
    case DType::BFloat16:
      visit(Unary<BFloat16Format, Scale<float>>{{f}});
      return true;
    default:
      return false;
  }
}

template <class T, class Visit>
STRAGG_HOST_INLINE void visit_int_divide(int64_t divisor, Visit& visit) {
  visit(Unary<PlainFormat<T>, IntDivide<T>>{{divisor}});
}

// buf /= divisor (AVG): every type but Bool; an integer divisor of 0 is the caller's to reject.
template <class Visit>
STRAGG_HOST_INLINE bool visit_divide(DType t, int64_t divisor, Visit&& visit) {
  const float fd = static_cast<float>(divisor);
  switch (t) {
    case DType::Float32:
      visit(Unary<PlainFormat<float>, Divide<float>>{{fd}});
      return true;
    case DType::Float64:
      visit(Unary<PlainFormat<double>, Divide<double>>{{static_cast<double>(divisor)}});
      return true;
    case DType::Float16:
      visit(Unary<Float16Format, Divide<float>>{{fd}});
      return true;
    case DType::BFloat16:
      visit(Unary<BFloat16Format, Divide<float>>{{fd}});
      return true;
    case DType::Int8:
      visit_int_divide<int8_t>(divisor, visit);
      return true;
    case DType::UInt8:
      visit_int_divide<uint8_t>(divisor, visit);
      return true;
    case DType::Int16:
      visit_int_divide<int16_t>(divisor, visit);
      return true;
    case DType::Int32:
      visit_int_divide<int32_t>(divisor, visit);
      return true;
    case DType::Int64:
      visit_int_divide<int64_t>(divisor, visit);
      return true;
    case DType::Bool:
      return false;
  }
  return false;
}

}  // namespace stragg::ops
