// Reduction kernel bandwidth vs a device-to-device cudaMemcpyAsync measured in the same run.
//
//   bench_reduce [--mib N] [--iters N] [--json] [--min-pct P]
//
// For each (dtype, op) it times gpu::reduce_into(dst, src) over N MiB per operand (default 256)
// and reports memory bandwidth: a reduce moves 3 x bytes (read dst, read src, write dst), a copy
// 2 x bytes (read, write). "% copy" compares the two memory bandwidths: the kernels are memory
// bound, so ~90-100% means they run at the speed of the memory system. With --min-pct P the
// exit status is 3 when any row is below P% (the roofline check of tests/gpu/README.md).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/reduce_kernels.h"
#include "runtime/dtype.h"
#include "runtime/reduce.h"

namespace {

// CUDA errors throw stragg::Error (kernels/cuda_check.h); main reports them and returns 1.
#define CHECK(x) ::stragg::gpu::cuda_check((x), #x)

template <class F>
float time_ms(cudaStream_t stream, int iters, F&& fn) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  fn();  // warm-up
  CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < iters; ++i) fn();
  CHECK(cudaEventRecord(b, stream));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return ms / iters;
}

}  // namespace

namespace {
int run(int argc, char** argv) {
  size_t mib = 256;
  int iters = 20;
  bool json = false;
  double min_pct = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mib") && i + 1 < argc) mib = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--min-pct") && i + 1 < argc) min_pct = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--mib N (>= 64 recommended)] [--iters N] [--json] [--min-pct P]\n",
                   argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "bench_reduce: no CUDA device\n");
    return 2;
  }
  const size_t bytes = mib << 20;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void *dst, *src;
  CHECK(cudaMalloc(&dst, bytes));
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMemset(dst, 0, bytes));
  CHECK(cudaMemset(src, 0, bytes));  // zeros: valid for every dtype, no NaN/denormal slow paths

  const float copy_ms = time_ms(stream, iters, [&] {
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const double copy_gbps = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;

  struct Row {
    std::string dtype, op;
    double us, algbw, membw, pct;
  };
  std::vector<Row> rows;
  const stragg::DType dtypes[] = {stragg::DType::Float32, stragg::DType::Float16,
                                  stragg::DType::BFloat16, stragg::DType::Float64,
                                  stragg::DType::Int32, stragg::DType::Int64, stragg::DType::Int8,
                                  stragg::DType::UInt8, stragg::DType::Bool};
  const stragg::ReduceOp ops[] = {stragg::ReduceOp::Sum, stragg::ReduceOp::Min,
                                  stragg::ReduceOp::Max, stragg::ReduceOp::Prod};
  for (auto t : dtypes) {
    for (auto op : ops) {
      if (!stragg::reduce_supported(t, op)) continue;
      const size_t count = bytes / stragg::dtype_size(t);
      const float ms = time_ms(stream, iters, [&] {
        stragg::gpu::reduce_into(t, op, dst, src, count, stream);
      });
      const double s = ms * 1e-3;
      const double membw = 3.0 * bytes / s / 1e9;
      rows.push_back({stragg::dtype_name(t), stragg::reduce_op_name(op), ms * 1e3, bytes / s / 1e9,
                      membw, 100.0 * membw / copy_gbps});
    }
  }

  if (json) {
    std::printf("{\"device\": \"%s\", \"bytes\": %zu, \"iters\": %d, \"copy_us\": %.2f, "
                "\"copy_membw_gbps\": %.1f, \"rows\": [",
                prop.name, bytes, iters, copy_ms * 1e3, copy_gbps);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("%s{\"dtype\": \"%s\", \"op\": \"%s\", \"us\": %.2f, \"algbw_gbps\": %.1f, "
                  "\"membw_gbps\": %.1f, \"pct_of_copy\": %.1f}",
                  i ? ", " : "", r.dtype.c_str(), r.op.c_str(), r.us, r.algbw, r.membw, r.pct);
    }
    std::printf("]}\n");
  } else {
    std::printf("# %s, %zu MiB per operand, %d iterations\n", prop.name, mib, iters);
    std::printf("# memcpy D2D: %.1f us, %.1f GB/s memory bandwidth (2 x bytes)\n", copy_ms * 1e3,
                copy_gbps);
    std::printf("%-9s %-8s %10s %12s %14s %8s\n", "dtype", "op", "time_us", "algbw_GB/s",
                "membw_GB/s", "%copy");
    for (const Row& r : rows) {
      std::printf("%-9s %-8s %10.1f %12.1f %14.1f %7.1f%%\n", r.dtype.c_str(), r.op.c_str(), r.us,
                  r.algbw, r.membw, r.pct);
    }
  }
  CHECK(cudaFree(dst));
  CHECK(cudaFree(src));
  CHECK(cudaStreamDestroy(stream));
  int below = 0;
  for (const Row& r : rows) {
    if (r.pct < min_pct) {
      std::fprintf(stderr, "bench_reduce: %s %s at %.1f%% of the copy bandwidth, below %.1f%%\n",
                   r.dtype.c_str(), r.op.c_str(), r.pct, min_pct);
      ++below;
    }
  }
  return below ? 3 : 0;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_reduce: %s\n", e.what());
    return 1;
  }
}
