// Element types and reduction operators: sizes and names (no torch here).
#include "runtime/dtype.h"

#include <string>

#include "common/error.h"

namespace stragg {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
    case DType::UInt8: return 1;
    case DType::Int16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
  }
  // An out-of-range enum value: a size of 0 would silently corrupt buffer arithmetic.
  throw Error("stragg: unknown dtype " + std::to_string(static_cast<int>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
  }
  return "unknown";  // used in error messages, so never throws
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Prod: return "PRODUCT";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::BAnd: return "BAND";
    case ReduceOp::BOr: return "BOR";
    case ReduceOp::BXor: return "BXOR";
  }
  return "unknown";  // used in error messages, so never throws
}

bool is_floating(DType t) {
  switch (t) {
    case DType::Float32:
    case DType::Float64:
    case DType::Float16:
    case DType::BFloat16:
      return true;
    case DType::Int8:
    case DType::UInt8:
    case DType::Int16:
    case DType::Int32:
    case DType::Int64:
    case DType::Bool:
      return false;
  }
  return false;
}

}  // namespace stragg
