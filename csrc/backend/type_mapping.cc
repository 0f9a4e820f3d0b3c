#include "backend/type_mapping.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include "runtime/reduce.h"

namespace stragg {
namespace {

// The factor of a PREMUL_SUM op: c10d::NCCLPreMulSumSupplement up to torch 2.11, renamed
// PreMulSumSupplement by 2.13 (which keeps the old name as an alias "for BC only").
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
using PreMulSumSupplement = c10d::PreMulSumSupplement;
#else
using PreMulSumSupplement = c10d::NCCLPreMulSumSupplement;
#endif

}  // namespace

std::optional<DType> to_runtime_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::Float32;
    case at::kDouble:
      return DType::Float64;
    case at::kHalf:
      return DType::Float16;
    case at::kBFloat16:
      return DType::BFloat16;
    case at::kChar:
      return DType::Int8;
    case at::kByte:
      return DType::UInt8;
    case at::kShort:
      return DType::Int16;
    case at::kInt:
      return DType::Int32;
    case at::kLong:
      return DType::Int64;
    case at::kBool:
      return DType::Bool;
    default:
      return std::nullopt;
  }
}

std::string c10d_reduce_op_name(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

LoweredReduceOp lower_reduce_op(const c10d::ReduceOp& op, DType dtype, int rank) {
  LoweredReduceOp out;
  // TORCH_CHECK formats its message only when the check fails: no string per call.
#define STRAGG_WHERE "stragg: rank ", rank, ": all_reduce: "
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      out.op = ReduceOp::Sum;
      break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(dtype != DType::Bool, STRAGG_WHERE,
                  "ReduceOp.AVG is not defined for bool tensors");
      out.op = ReduceOp::Sum;
      out.average = true;
      break;
    case c10d::ReduceOp::PRODUCT:
      out.op = ReduceOp::Prod;
      break;
    case c10d::ReduceOp::MIN:
      out.op = ReduceOp::Min;
      break;
    case c10d::ReduceOp::MAX:
      out.op = ReduceOp::Max;
      break;
    case c10d::ReduceOp::BAND:
      out.op = ReduceOp::BAnd;
      break;
    case c10d::ReduceOp::BOR:
      out.op = ReduceOp::BOr;
      break;
    case c10d::ReduceOp::BXOR:
      out.op = ReduceOp::BXor;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(is_floating(dtype), STRAGG_WHERE,
                  "ReduceOp.PREMUL_SUM needs a floating-point tensor, got ", dtype_name(dtype));
      auto* supp = dynamic_cast<PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(supp != nullptr, STRAGG_WHERE, "ReduceOp.PREMUL_SUM without a factor");
      out.op = ReduceOp::Sum;
      out.premul = true;
      out.premul_factor = supp->tensor_factor.defined()
                              ? supp->tensor_factor.to(at::kDouble).cpu().item<double>()
                              : supp->double_factor;
      break;
    }
    default:
      TORCH_CHECK(false, STRAGG_WHERE, "unsupported reduce op ", c10d_reduce_op_name(op));
  }
  TORCH_CHECK(reduce_supported(dtype, out.op), STRAGG_WHERE, "ReduceOp.", c10d_reduce_op_name(op),
              " is not supported for dtype ", dtype_name(dtype));
#undef STRAGG_WHERE
  return out;
}

c10d::ReduceOp to_c10d_reduce_op(ReduceOp op, DType dtype) {
  const bool is_bool = dtype == DType::Bool;
  switch (op) {
    case ReduceOp::Sum:
      return is_bool ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    case ReduceOp::Prod:
      return is_bool ? c10d::ReduceOp::MIN : c10d::ReduceOp::PRODUCT;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::BAnd:
      return c10d::ReduceOp::BAND;
    case ReduceOp::BOr:
      return c10d::ReduceOp::BOR;
    case ReduceOp::BXor:
      return c10d::ReduceOp::BXOR;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace stragg
