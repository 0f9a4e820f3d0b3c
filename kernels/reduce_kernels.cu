// Element-wise reduction kernels on the GPU (see reduce_kernels.h for the semantics).
//
// One templated grid-stride kernel per element functor of csrc/runtime/reduce_ops.h (the
// definitions the CPU reduction instantiates too); the body of each thread is
// kernels/reduce_loop.h (a scalar head, 16-byte vectors, a scalar tail), which the host runs as
// well (kernels/host/host_kernels.cc) so that CI checks it without a GPU. Argument checks, layout
// and grid size come from kernels/reduce_launch.h, shared with that host runner.
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/reduce_kernels.h"
#include "kernels/reduce_launch.h"
#include "kernels/reduce_loop.h"
#include "runtime/reduce_ops.h"

namespace stragg::gpu {
namespace {

template <class Fn>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_kernel(Fn fn, typename Fn::Storage* out, const typename Fn::Storage* a,
                  const typename Fn::Storage* b, Layout l, size_t n) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  binary_thread(tid, stride, fn, out, a, b, l, n);
}

template <class Fn>
__global__ void __launch_bounds__(kThreadsPerBlock)
    unary_kernel(Fn fn, typename Fn::Storage* buf, Layout l, size_t n) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unary_thread(tid, stride, fn, buf, l, n);
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

std::string launch_what(const char* fn, DType t, size_t count) {
  return std::string("stragg: gpu ") + fn + " " + dtype_name(t) + " (" + std::to_string(count) +
         " elements): kernel launch";
}

struct LaunchBinary {
  DType t;
  void* out;
  const void* a;
  const void* b;
  size_t count;
  cudaStream_t stream;
  template <class Fn>
  void operator()(Fn fn) const {
    using S = typename Fn::Storage;
    const Layout l = layout_for(sizeof(S), count, {out, a, b});
    binary_kernel<Fn>
        <<<grid_blocks(l, count, sizeof(S), sm_count()), kThreadsPerBlock, 0, stream>>>(
            fn, static_cast<S*>(out), static_cast<const S*>(a), static_cast<const S*>(b), l, count);
    cuda_check(cudaGetLastError(), launch_what("reduce", t, count));
  }
};

struct LaunchUnary {
  const char* name;
  DType t;
  void* buf;
  size_t count;
  cudaStream_t stream;
  template <class Fn>
  void operator()(Fn fn) const {
    using S = typename Fn::Storage;
    const Layout l = layout_for(sizeof(S), count, {buf});
    unary_kernel<Fn><<<grid_blocks(l, count, sizeof(S), sm_count()), kThreadsPerBlock, 0, stream>>>(
        fn, static_cast<S*>(buf), l, count);
    cuda_check(cudaGetLastError(), launch_what(name, t, count));
  }
};

}  // namespace

void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count,
            cudaStream_t stream) {
  check_reduce_args(t, op, out, a, b, count);
  if (count == 0) return;
  ops::visit_binary(t, op, LaunchBinary{t, out, a, b, count, stream});
}

void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count,
                 cudaStream_t stream) {
  reduce(t, op, dst, dst, src, count, stream);
}

void scale(DType t, void* buf, size_t count, double factor, cudaStream_t stream) {
  check_scale_args(t, buf, count);
  if (count == 0) return;
  ops::visit_scale(t, factor, LaunchUnary{"scale", t, buf, count, stream});
}

void divide(DType t, void* buf, size_t count, int64_t divisor, cudaStream_t stream) {
  check_divide_args(t, buf, count, divisor);
  if (count == 0) return;
  ops::visit_divide(t, divisor, LaunchUnary{"divide", t, buf, count, stream});
}

}  // namespace stragg::gpu
