// The CUDA reduction kernels run on the host (no torch, no CUDA): the same argument checks, the
// same layout and grid size, and the same per-thread element loop (kernels/reduce_loop.h) over
// the same functors (csrc/runtime/reduce_ops.h), executed for every thread of the virtual grid
// one after the other. What the "kernel launches" of the host device (host_device.h) run, and what
// tests/cpp/test_reduce_kernel_loop.cc compares bitwise with the CPU reduction.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace stragg::gpu::host {

// The virtual GPU: how many SMs the grid size is computed for (gpu::grid_blocks), or, when
// threads > 0, exactly that many threads (tests use it to vary the grid).
struct VirtualGrid {
  int sm_count = 2;
  size_t threads = 0;
};

// Same contracts as gpu::reduce / reduce_into / scale / divide (kernels/reduce_kernels.h), on
// host memory, synchronously. Throw stragg::Error on bad arguments, like the CUDA functions.
void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count,
            VirtualGrid grid = {});
void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count,
                 VirtualGrid grid = {});
void scale(DType t, void* buf, size_t count, double factor, VirtualGrid grid = {});
void divide(DType t, void* buf, size_t count, int64_t divisor, VirtualGrid grid = {});

}  // namespace stragg::gpu::host
