#include "runtime/mismatch.h"

#include <sstream>

namespace stragg {

void MismatchText::field(const char* name, const std::string& theirs, const std::string& ours) {
  if (theirs == ours) return;
  const bool peer_first = peer_ < rank_;
  const std::string& a = peer_first ? theirs : ours;
  const std::string& b = peer_first ? ours : theirs;
  diffs_.push_back(std::string(name) + " " + a + " (rank " +
                   std::to_string(peer_first ? peer_ : rank_) + ") vs " + b + " (rank " +
                   std::to_string(peer_first ? rank_ : peer_) + ")");
}

void MismatchText::call_fields(uint8_t their_dtype, uint64_t their_numel, uint8_t their_op,
                               const CollectiveSpec& spec) {
  field("dtype",
        their_dtype <= static_cast<uint8_t>(DType::Bool)
            ? dtype_name(static_cast<DType>(their_dtype))
            : "?",
        dtype_name(spec.dtype));
  field("numel", std::to_string(their_numel), std::to_string(spec.numel));
  field("op",
        their_op <= static_cast<uint8_t>(ReduceOp::BXor)
            ? reduce_op_name(static_cast<ReduceOp>(their_op))
            : "?",
        reduce_op_name(spec.op));
}

std::string MismatchText::message(const CollectiveSpec& spec) const {
  std::ostringstream m;
  m << collective_prefix(rank_, spec) << ": mismatch with rank " << peer_ << ": ";
  for (size_t i = 0; i < diffs_.size(); ++i) m << (i ? "; " : "") << diffs_[i];
  return m.str();
}

}  // namespace stragg
