// Maps torch types (at::ScalarType, c10d::ReduceOp) onto the torch-free runtime's types.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <string>

#include "runtime/dtype.h"

namespace stragg {

// std::nullopt for dtypes stragg's executor does not handle.
std::optional<DType> to_runtime_dtype(at::ScalarType t);

// How a c10d reduce op runs on the executor: a runtime op plus optional local pre-scaling
// (PREMUL_SUM) and post-division (AVG).
struct LoweredReduceOp {
  ReduceOp op = ReduceOp::Sum;
  bool premul = false;
  double premul_factor = 1.0;
  bool average = false;
};

// Throws c10::Error naming rank, op and dtype if the combination is not supported.
LoweredReduceOp lower_reduce_op(const c10d::ReduceOp& op, DType dtype, int rank);

std::string c10d_reduce_op_name(const c10d::ReduceOp& op);

// The c10d op that computes runtime op `op` on `dtype` (for delegating to another backend);
// for bool, Sum is MAX (logical OR) and Prod is MIN (logical AND), as in stragg's kernels.
c10d::ReduceOp to_c10d_reduce_op(ReduceOp op, DType dtype);

}  // namespace stragg
