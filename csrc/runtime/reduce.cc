// The CPU reduction (no torch, no CUDA): ISA selection, argument checks, the aligned bounce path
// and the public API of reduce.h.
//
// Structure:
//  * reduce_ops.h defines every operator once (shared with the CUDA kernels) and maps
//    (dtype, op) to an element functor; dtype_float16.h defines the 16-bit float conversions.
//  * reduce_loops.h runs a functor over a buffer (auto-vectorised, baseline ISA);
//    reduce_loops_avx2.h compiles the same loops for AVX2+F16C, with F16C codecs for the 16-bit
//    floats. The variant is picked at runtime with __builtin_cpu_supports; both are bit-for-bit
//    identical (tests/cpp/test_reduce.cc).
//  * Misaligned pointers and dst == src go through aligned bounce buffers, so the loops only ever
//    see element-aligned, non-aliasing pointers.
#include "runtime/reduce.h"

#include <cstring>
#include <string>

#include "common/error.h"
#include "runtime/dtype_float16.h"
#include "runtime/reduce_loops.h"
#include "runtime/reduce_ops.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define STRAGG_X86_FAST 1
#include "runtime/reduce_loops_avx2.h"
#else
#define STRAGG_X86_FAST 0
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

using namespace cpu_reduce;

// ------------------------------------------------------------------------------------------------
// One entry point per ISA variant and kind of call. Arguments are already validated.

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
  ops::visit_binary(t, op, PortableBinary{d, s, n});
}
void scale_portable(DType t, void* b, size_t n, double f) {
  ops::visit_scale(t, f, PortableUnary{b, n});
}
void divide_portable(DType t, void* b, size_t n, int64_t d) {
  ops::visit_divide(t, d, PortableUnary{b, n});
}
void to_f32_portable(DType t, const uint16_t* STRAGG_RESTRICT in, float* STRAGG_RESTRICT out,
                     size_t n) {
  if (t == DType::Float16) {
    for (size_t i = 0; i < n; ++i) out[i] = ops::half_to_float(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = ops::bf16_to_float(in[i]);
  }
}
void from_f32_portable(DType t, const float* STRAGG_RESTRICT in, uint16_t* STRAGG_RESTRICT out,
                       size_t n) {
  if (t == DType::Float16) {
    for (size_t i = 0; i < n; ++i) out[i] = ops::float_to_half(in[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = ops::float_to_bf16(in[i]);
  }
}

constexpr Kernels kPortable{reduce_portable, scale_portable, divide_portable, to_f32_portable,
                            from_f32_portable};

#if STRAGG_X86_FAST
void reduce_avx2(DType t, ReduceOp op, void* d, const void* s, size_t n) {
  ops::visit_binary(t, op, Avx2Binary{d, s, n});
}
void scale_avx2(DType t, void* b, size_t n, double f) { ops::visit_scale(t, f, Avx2Unary{b, n}); }
void divide_avx2(DType t, void* b, size_t n, int64_t d) {
  ops::visit_divide(t, d, Avx2Unary{b, n});
}
void to_f32_avx2(DType t, const uint16_t* in, float* out, size_t n) {
  if (t == DType::Float16)
    f16_to_f32_avx2<HalfCodecF16C>(in, out, n);
  else
    f16_to_f32_avx2<Bf16CodecAvx2>(in, out, n);
}
void from_f32_avx2(DType t, const float* in, uint16_t* out, size_t n) {
  if (t == DType::Float16)
    f32_to_f16_avx2<HalfCodecF16C>(in, out, n);
  else
    f32_to_f16_avx2<Bf16CodecAvx2>(in, out, n);
}

constexpr Kernels kAvx2{reduce_avx2, scale_avx2, divide_avx2, to_f32_avx2, from_f32_avx2};

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
    throw Error("stragg: reduce kernel variant " + std::to_string(isa) +
                " is not available on this CPU");
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
  throw Error(std::string("stragg: reduce op ") + reduce_op_name(op) +
              " is not supported for dtype " + dtype_name(t));
}

bool is_valid(DType t) { return static_cast<unsigned>(t) <= static_cast<unsigned>(DType::Bool); }

bool misaligned(const void* p, size_t align) {
  return (reinterpret_cast<uintptr_t>(p) & (align - 1)) != 0;
}

constexpr size_t kBounceBytes = 8192;

void reduce_checked(const Kernels& k, DType t, ReduceOp op, void* dst, const void* src,
                    size_t count) {
  if (!reduce_supported(t, op)) throw_unsupported(t, op);
  if (count == 0) return;
  const size_t es = dtype_size(t);
  unsigned char* d = static_cast<unsigned char*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  const size_t bytes = count * es;
  if (d != s && d < s + bytes && s < d + bytes) {
    throw Error("stragg: reduce_into: dst and src overlap partially (dtype " +
                std::string(dtype_name(t)) + ", count " + std::to_string(count) + ")");
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
    throw Error(std::string("stragg: divide_inplace (AVG) is not supported for dtype ") +
                dtype_name(t));
  }
  if (divisor == 0 && !is_floating(t)) {
    throw Error(std::string("stragg: divide_inplace (AVG): integer division by zero for dtype ") +
                dtype_name(t));
  }
  inplace_checked(t, buf, count, [&](void* p, size_t n) { k.divide(t, p, n, divisor); });
}

void check_16bit_float(DType t) {
  if (t != DType::Float16 && t != DType::BFloat16) {
    throw Error(std::string("stragg: 16-bit float conversion requested for dtype ") +
                dtype_name(t));
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

void reduce_into_swapped(DType t, ReduceOp op, void* dst, const void* src, size_t count) {
  if (count == 0) return;
  const size_t es = dtype_size(t);
  unsigned char* d = static_cast<unsigned char*>(dst);
  const unsigned char* s = static_cast<const unsigned char*>(src);
  alignas(64) unsigned char a[kBounceBytes];
  const size_t per = kBounceBytes / es;
  for (size_t off = 0; off < count; off += per) {
    const size_t m = count - off < per ? count - off : per;
    std::memcpy(a, s + off * es, m * es);
    reduce_into(t, op, a, d + off * es, m);  // a = op(src, dst)
    std::memcpy(d + off * es, a, m * es);
  }
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
