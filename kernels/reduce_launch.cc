#include "kernels/reduce_launch.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "runtime/reduce.h"

namespace stragg::gpu {
namespace {

std::string what(const char* fn, DType t, const char* op, size_t count) {
  return std::string("stragg: gpu ") + fn + " " + op + (op[0] ? " " : "") + dtype_name(t) + " (" +
         std::to_string(count) + " elements)";
}

void check_aligned(const char* fn, DType t, const char* op, size_t count, const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(t) != 0) {
    throw Error(what(fn, t, op, count) + ": pointer " +
                std::to_string(reinterpret_cast<uintptr_t>(p)) +
                " is not aligned to the element size");
  }
}

bool overlap_partially(const void* x, const void* y, size_t bytes) {
  const auto* a = static_cast<const unsigned char*>(x);
  const auto* b = static_cast<const unsigned char*>(y);
  return a != b && a < b + bytes && b < a + bytes;
}

bool valid_dtype(DType t) { return static_cast<unsigned>(t) <= static_cast<unsigned>(DType::Bool); }

}  // namespace

Layout layout_for(size_t elem, size_t count, std::initializer_list<const void*> ptrs,
                  size_t kBytes) {
  Layout l;
  const uintptr_t first = reinterpret_cast<uintptr_t>(*ptrs.begin()) & (kBytes - 1);
  for (const void* p : ptrs) {
    if ((reinterpret_cast<uintptr_t>(p) & (kBytes - 1)) != first) return l;  // all scalar
  }
  const size_t head = first == 0 ? 0 : (kBytes - first) / elem;
  if (head >= count) {
    l.head = count;
    return l;
  }
  l.head = head;
  l.nvec = (count - head) * elem / kBytes;
  return l;
}

unsigned grid_blocks(const Layout& l, size_t count, size_t elem, int sm_count, size_t kBytes) {
  const size_t body = l.nvec * kBytes / elem;
  const size_t work = std::max(l.nvec, count - body);  // threads with something to do
  const size_t want = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const size_t cap = static_cast<size_t>(sm_count > 0 ? sm_count : 1) * 8;
  return static_cast<unsigned>(std::max<size_t>(1, std::min(want, cap)));
}

void check_reduce_args(DType t, ReduceOp op, const void* out, const void* a, const void* b,
                       size_t count) {
  if (!reduce_supported(t, op)) {
    throw Error(std::string("stragg: gpu reduce: op ") + reduce_op_name(op) +
                " is not supported for dtype " + dtype_name(t));
  }
  if (count == 0) return;
  const size_t bytes = count * dtype_size(t);
  if (overlap_partially(out, a, bytes) || overlap_partially(out, b, bytes)) {
    throw Error(what("reduce", t, reduce_op_name(op), count) +
                ": output and input overlap partially");
  }
  for (const void* p : {out, a, b}) check_aligned("reduce", t, reduce_op_name(op), count, p);
}

void check_scale_args(DType t, const void* buf, size_t count) {
  if (!valid_dtype(t) || !is_floating(t)) {
    throw Error(std::string("stragg: gpu scale (PREMUL_SUM) is not supported for dtype ") +
                dtype_name(t));
  }
  if (count > 0) check_aligned("scale", t, "", count, buf);
}

void check_divide_args(DType t, const void* buf, size_t count, int64_t divisor) {
  if (!valid_dtype(t) || t == DType::Bool) {
    throw Error(std::string("stragg: gpu divide (AVG) is not supported for dtype ") +
                dtype_name(t));
  }
  if (divisor == 0 && !is_floating(t)) {
    throw Error(std::string("stragg: gpu divide (AVG): integer division by zero for dtype ") +
                dtype_name(t));
  }
  if (count > 0) check_aligned("divide", t, "", count, buf);
}

}  // namespace stragg::gpu
