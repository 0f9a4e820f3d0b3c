#include "kernels/host/host_kernels.h"

#include "kernels/reduce_launch.h"
#include "kernels/reduce_loop.h"
#include "runtime/reduce_ops.h"

namespace stragg::gpu::host {
namespace {

size_t threads_for(const VirtualGrid& g, const Layout& l, size_t count, size_t elem) {
  if (g.threads > 0) return g.threads;
  return static_cast<size_t>(grid_blocks(l, count, elem, g.sm_count)) * kThreadsPerBlock;
}

struct RunBinary {
  void* out;
  const void* a;
  const void* b;
  size_t count;
  VirtualGrid grid;
  template <class Fn>
  void operator()(Fn fn) const {
    using S = typename Fn::Storage;
    const Layout l = layout_for(sizeof(S), count, {out, a, b});
    const size_t threads = threads_for(grid, l, count, sizeof(S));
    for (size_t tid = 0; tid < threads; ++tid) {
      binary_thread(tid, threads, fn, static_cast<S*>(out), static_cast<const S*>(a),
                    static_cast<const S*>(b), l, count);
    }
  }
};

struct RunUnary {
  void* buf;
  size_t count;
  VirtualGrid grid;
  template <class Fn>
  void operator()(Fn fn) const {
    using S = typename Fn::Storage;
    const Layout l = layout_for(sizeof(S), count, {buf});
    const size_t threads = threads_for(grid, l, count, sizeof(S));
    for (size_t tid = 0; tid < threads; ++tid) {
      unary_thread(tid, threads, fn, static_cast<S*>(buf), l, count);
    }
  }
};

}  // namespace

void reduce(DType t, ReduceOp op, void* out, const void* a, const void* b, size_t count,
            VirtualGrid grid) {
  check_reduce_args(t, op, out, a, b, count);
  if (count == 0) return;
  ops::visit_binary(t, op, RunBinary{out, a, b, count, grid});
}

void reduce_into(DType t, ReduceOp op, void* dst, const void* src, size_t count, VirtualGrid grid) {
  reduce(t, op, dst, dst, src, count, grid);
}

void scale(DType t, void* buf, size_t count, double factor, VirtualGrid grid) {
  check_scale_args(t, buf, count);
  if (count == 0) return;
  ops::visit_scale(t, factor, RunUnary{buf, count, grid});
}

void divide(DType t, void* buf, size_t count, int64_t divisor, VirtualGrid grid) {
  check_divide_args(t, buf, count, divisor);
  if (count == 0) return;
  ops::visit_divide(t, divisor, RunUnary{buf, count, grid});
}

}  // namespace stragg::gpu::host
