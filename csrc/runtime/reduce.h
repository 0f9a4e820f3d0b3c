// Element-wise reduction kernels used by the CPU executor (no torch here).
//
// All kernels are deterministic: the same inputs give bitwise the same outputs on every rank.
// 16-bit floats (Float16, BFloat16) are widened to float32, combined, and rounded back to
// nearest-even, one element at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace stragg {

// True if `op` is defined for `t`. Bitwise ops (BAnd/BOr/BXor) are defined for integer types and
// Bool only. For Bool: Sum and Max are logical OR, Prod and Min are logical AND.
bool reduce_supported(DType t, ReduceOp op);

// dst[i] = op(dst[i], src[i]) for i in [0, count). dst and src may not overlap unless equal.
// Throws stragg::Error if the combination is not supported.
void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count);

// dst[i] = op(src[i], dst[i]): reduce_into with the operands swapped (the same kernels, through
// an aligned bounce buffer), for schedules whose ranks must evaluate op in one operand order.
void reduce_into_swapped(DType t, ReduceOp op, void* dst, const void* src, size_t count);

// buf[i] = buf[i] * factor for floating types (PREMUL_SUM). Throws for non-floating types.
void scale_inplace(DType t, void* buf, size_t count, double factor);

// buf[i] = buf[i] / divisor (AVG after SUM). Floating types divide in their compute type
// (float32 for 16-bit floats, double for Float64); integer types truncate toward zero like
// NCCL's ncclAvg; Bool throws.
void divide_inplace(DType t, void* buf, size_t count, int64_t divisor);

}  // namespace stragg
