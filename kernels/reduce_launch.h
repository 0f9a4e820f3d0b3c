// What a launch of the reduction kernels needs, computed on the host: argument checks, the
// head / vector body / tail layout and the grid size (no torch, no CUDA). Shared by the CUDA
// launches (reduce_kernels.cu) and the host runner of the same kernels (host/host_kernels.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kernels/reduce_loop.h"
#include "runtime/dtype.h"

namespace stragg::gpu {

// Scalar head and vector body of `count` elements of `elem` bytes for pointers `ptrs`: the body
// needs every pointer at the same address modulo kBytes (otherwise everything is scalar).
Layout layout_for(size_t elem, size_t count, std::initializer_list<const void*> ptrs,
                  size_t kBytes = kVecBytes);

// Blocks of kThreadsPerBlock threads for a layout: one thread per vector (or per scalar element,
// whichever is more), at most 8 blocks (2048 threads) per SM.
unsigned grid_blocks(const Layout& l, size_t count, size_t elem, int sm_count,
                     size_t kBytes = kVecBytes);

// Argument checks of gpu::reduce / scale / divide; each throws stragg::Error naming the call,
// the op, the dtype and the element count. Pointer checks apply only when count > 0.
//  reduce: (t, op) supported; out must not overlap a or b partially; element-aligned pointers.
void check_reduce_args(DType t, ReduceOp op, const void* out, const void* a, const void* b,
                       size_t count);
//  scale (PREMUL_SUM): floating types; element-aligned buffer.
void check_scale_args(DType t, const void* buf, size_t count);
//  divide (AVG): every type but Bool; no integer division by zero; element-aligned buffer.
void check_divide_args(DType t, const void* buf, size_t count, int64_t divisor);

}  // namespace stragg::gpu
