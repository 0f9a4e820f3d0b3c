#include "runtime/step_sink.h"

#include <cstring>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "runtime/mismatch.h"
#include "runtime/reduce.h"
#include "runtime/streaming_copy.h"

namespace stragg {

StepSink::StepSink(int rank, const CollectiveSpec& spec, uint8_t tag, uint32_t step,
                   const LoweredOp& op, uint8_t* buf, bool stream_copies)
    : rank_(rank),
      spec_(spec),
      tag_(tag),
      step_(step),
      op_(op),
      buf_(buf),
      stream_copies_(stream_copies && !op.reduce && !op.staged) {
  // Not zero-filled: every byte is written by on_data before apply_staged reads it.
  if (op_.staged) staging_.reset(new uint8_t[op_.count * dtype_size(spec_.dtype)]);
}

void StepSink::apply_staged() {
  if (!op_.staged || op_.count == 0) return;
  const size_t elem = dtype_size(spec_.dtype);
  uint8_t* dst = buf_ + op_.offset * elem;
  if (op_.reduce) {
    (op_.received_first ? reduce_into_swapped : reduce_into)(spec_.dtype, spec_.op, dst,
                                                             staging_.get(), op_.count);
  } else {
    std::memcpy(dst, staging_.get(), op_.count * elem);
  }
}

void StepSink::on_header(const MessageHeader& h) {
  const size_t elem = dtype_size(spec_.dtype);
  const int peer = op_.peer;
  // The common case, without building the strings a mismatch message needs (every message of
  // every call passes here: small calls would pay for them).
  if (h.coll_seq == spec_.seq && h.dtype == static_cast<uint8_t>(spec_.dtype) &&
      h.numel == spec_.numel && h.op == static_cast<uint8_t>(spec_.op) && h.algo == tag_ &&
      h.step == step_ && h.payload_bytes == op_.count * elem &&
      h.sender == static_cast<uint32_t>(peer)) {
    return;
  }
  if (h.coll_seq != spec_.seq) {
    std::ostringstream m;
    m << collective_prefix(rank_, spec_) << ": sequence mismatch with rank " << peer << ": it sent data for "
      << spec_.op_name << " #" << h.coll_seq
      << " (the ranks issued a different number of all_reduce calls on this group)";
    throw Error(m.str());
  }
  MismatchText diffs(rank_, peer);
  diffs.call_fields(h.dtype, h.numel, h.op, spec_);
  if (diffs.empty()) {
    diffs.field("algorithm", schedule_tag_name(h.algo), schedule_tag_name(tag_));
    diffs.field("step", std::to_string(h.step), std::to_string(step_));
    diffs.field("message bytes", std::to_string(h.payload_bytes), std::to_string(op_.count * elem));
    diffs.field("sender", std::to_string(h.sender), std::to_string(peer));
  }
  if (!diffs.empty()) throw Error(diffs.message(spec_));
}

void StepSink::on_data(size_t offset, const void* data, size_t len) {
  if (op_.staged) {
    std::memcpy(staging_.get() + offset, data, len);
    return;
  }
  const size_t elem = dtype_size(spec_.dtype);
  uint8_t* dst = buf_ + op_.offset * elem + offset;
  if (op_.reduce) {
    (op_.received_first ? reduce_into_swapped : reduce_into)(spec_.dtype, spec_.op, dst, data,
                                                             len / elem);
  } else if (stream_copies_) {
    copy_streaming(dst, data, len);
  } else {
    std::memcpy(dst, data, len);
  }
}

}  // namespace stragg
