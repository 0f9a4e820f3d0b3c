// Micro-benchmark of the CPU reduction (csrc/runtime/reduce.h): GB/s per dtype x op.
//
//   build/ctest/tests/cpp/cpu_reduce_bench [--kib 256] [--reps 31] [--json]
//
// For every supported (dtype, op) it times reduce_into (dst op= src), and scale_inplace /
// divide_inplace for the types that have them, on buffers of --kib KiB each (default 256: the
// all_reduce hot path reduces pipeline pieces of this order, which sit in L2). Each repetition
// runs the kernel enough times to last about 2 ms; the table shows the median GB/s of the
// repetitions (bytes of one buffer per second) and the spread (min..max). The machine is shared
// and noisy: compare runs made back to back on the same machine only.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/reduce.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string dtype, op;
  double median_gbs, min_gbs, max_gbs;
};

// Seconds per call, one value per repetition.
std::vector<double> time_reps(const std::function<void()>& fn, int reps) {
  fn();  // warm up (page faults, ISA dispatch)
  int iters = 1;
  while (true) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    if (std::chrono::duration<double>(Clock::now() - t0).count() > 2e-3 || iters >= (1 << 20))
      break;
    iters *= 2;
  }
  std::vector<double> out;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    out.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  return out;
}

Result summarise(const char* dtype, const std::string& op, size_t bytes, std::vector<double> s) {
  std::sort(s.begin(), s.end());
  const double med = s[s.size() / 2];
  return {dtype, op, bytes / med / 1e9, bytes / s.back() / 1e9, bytes / s.front() / 1e9};
}

// Values that keep every op away from subnormals (slow on x86) however often it repeats: 1.0
// for floats, small for integers, 0/1 for bool.
void fill(stragg::DType t, std::vector<unsigned char>& b, std::mt19937& rng) {
  const size_t n = b.size() / stragg::dtype_size(t);
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case stragg::DType::Float32:
        reinterpret_cast<float*>(b.data())[i] = 1.0f;
        break;
      case stragg::DType::Float64:
        reinterpret_cast<double*>(b.data())[i] = 1.0;
        break;
      case stragg::DType::Float16:
        reinterpret_cast<uint16_t*>(b.data())[i] = 0x3c00;
        break;
      case stragg::DType::BFloat16:
        reinterpret_cast<uint16_t*>(b.data())[i] = 0x3f80;
        break;
      case stragg::DType::Bool:
        b[i] = static_cast<unsigned char>(rng() & 1);
        break;
      default: {
        const size_t es = stragg::dtype_size(t);
        for (size_t k = 0; k < es; ++k)
          b[i * es + k] = k == 0 ? static_cast<unsigned char>(rng() & 3) : 0;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t kib = 256;
  int reps = 31;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--kib" && i + 1 < argc) {
      kib = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: %s [--kib N] [--reps N] [--json]\n", argv[0]);
      return 2;
    }
  }
  using stragg::DType;
  using stragg::ReduceOp;
  const size_t bytes = kib * 1024;
  std::mt19937 rng(1);
  std::vector<Result> results;
  for (int ti = 0; ti <= static_cast<int>(DType::Bool); ++ti) {
    const DType t = static_cast<DType>(ti);
    std::vector<unsigned char> dst(bytes), src(bytes);
    fill(t, dst, rng);
    fill(t, src, rng);
    const size_t n = bytes / stragg::dtype_size(t);
    for (int oi = 0; oi <= static_cast<int>(ReduceOp::BXor); ++oi) {
      const ReduceOp op = static_cast<ReduceOp>(oi);
      if (!stragg::reduce_supported(t, op)) continue;
      std::vector<unsigned char> d = dst;
      auto fn = [&] { stragg::reduce_into(t, op, d.data(), src.data(), n); };
      results.push_back(
          summarise(stragg::dtype_name(t), stragg::reduce_op_name(op), bytes, time_reps(fn, reps)));
    }
    if (stragg::is_floating(t)) {
      std::vector<unsigned char> d = dst;
      bool up = true;
      auto fn = [&] {
        stragg::scale_inplace(t, d.data(), n, up ? 1.0009765625 : 1.0 / 1.0009765625);
        up = !up;
      };
      results.push_back(summarise(stragg::dtype_name(t), "scale", bytes, time_reps(fn, reps)));
    }
    if (t != DType::Bool) {
      std::vector<unsigned char> d = dst;
      auto fn = [&] { stragg::divide_inplace(t, d.data(), n, stragg::is_floating(t) ? 1 : 3); };
      results.push_back(summarise(stragg::dtype_name(t), "divide", bytes, time_reps(fn, reps)));
    }
  }
  if (json) {
    std::printf("[");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::printf(
          "%s{\"dtype\": \"%s\", \"op\": \"%s\", \"kib\": %zu, \"median_gbs\": %.3f, "
          "\"min_gbs\": %.3f, \"max_gbs\": %.3f}",
          i ? ", " : "", r.dtype.c_str(), r.op.c_str(), kib, r.median_gbs, r.min_gbs, r.max_gbs);
    }
    std::printf("]\n");
    return 0;
  }
  std::printf("%-9s %-8s %10s %20s   (%zu KiB buffers, %d reps)\n", "dtype", "op", "GB/s med",
              "spread", kib, reps);
  for (const Result& r : results) {
    std::printf("%-9s %-8s %10.2f %9.2f..%-9.2f\n", r.dtype.c_str(), r.op.c_str(), r.median_gbs,
                r.min_gbs, r.max_gbs);
  }
  return 0;
}
