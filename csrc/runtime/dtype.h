// Element types and reduction operators understood by the runtime (no torch here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stragg {

enum class DType : uint8_t {
  Float32 = 0,
  Float64,
  Float16,
  BFloat16,
  Int8,
  UInt8,
  Int16,
  Int32,
  Int64,
  Bool,
};

// Element-wise binary reductions. AVG and PREMUL_SUM are not listed: the backend runs them as
// SUM with a local pre-scaling (premul) or post-division (avg), see reduce.h.
enum class ReduceOp : uint8_t {
  Sum = 0,
  Prod,
  Min,
  Max,
  BAnd,
  BOr,
  BXor,
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* reduce_op_name(ReduceOp op);
bool is_floating(DType t);

}  // namespace stragg
