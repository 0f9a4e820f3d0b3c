// Element-wise reduction kernels on CUDA device memory (torch-free).
//
// The operators are those of csrc/runtime/reduce_ops.h, the CPU reduction's own definitions (same
// DType / ReduceOp enums), so results are bitwise those of csrc/runtime/reduce.h except for the
// payload of NaNs that SUM / PROD / scale / divide create (the GPU's canonical NaN; the CPU's is
// the ISA's): every element is one IEEE operation in the compute type (float32 for float16 /
// bfloat16, widened exactly and rounded back to nearest-even; no FMA contraction, no
// flush-to-zero); MIN / MAX propagate a NaN operand (a first, then b) with the CPU's bits and
// order signed zeros; integer SUM / PROD wrap; Bool: SUM/MAX/BOR = OR, PROD/MIN/BAND = AND,
// BXOR = XOR, results 0/1.
//
// Every function enqueues work on `stream` and returns without waiting for it. Loads and stores
// are 16 bytes wide when the pointers allow it (same address modulo 16 after a scalar head),
// with a scalar tail (kernels/reduce_loop.h). Unsupported (dtype, op) pairs, partially
// overlapping buffers and CUDA launch errors throw stragg::Error. Zero-element calls enqueue
// nothing. The element loop runs on the host in CI (kernels/host/host_kernels.h); on a GPU these
// functions have not run yet (tests/gpu/README.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace stragg::gpu {

// dst[i] = op(dst[i], src[i]). dst and src are device pointers; they may be equal but must not
// overlap partially.
void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count,
                 cudaStream_t stream);

// out[i] = op(a[i], b[i]). out may equal a or b (then in place); no other overlap.
void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count,
            cudaStream_t stream);

// buf[i] = buf[i] * factor (PREMUL_SUM, or AVG as a scale). Floating types only; float32 and
// 16-bit floats multiply by float(factor) in float32, Float64 in double (like scale_inplace).
void scale(DType t, void* buf, size_t count, double factor, cudaStream_t stream);

// buf[i] = buf[i] / divisor (AVG after SUM), bitwise like divide_inplace on the CPU: floating
// types divide in their compute type, integer types truncate toward zero (like ncclAvg), Bool
// throws, integer division by zero throws.
void divide(DType t, void* buf, size_t count, int64_t divisor, cudaStream_t stream);

}  // namespace stragg::gpu
