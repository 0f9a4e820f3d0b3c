// The text of a collective mismatch between this rank and a peer (no torch here): what
// StepSink::on_header and the one-shot all_reduce raise, worded alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/stall.h"

namespace stragg {

class MismatchText {
 public:
  MismatchText(int rank, int peer) : rank_(rank), peer_(peer) {}

  // Records "name A (rank a) vs B (rank b)" if the values differ, lower rank first, so both
  // sides of a mismatch describe it the same way.
  void field(const char* name, const std::string& theirs, const std::string& ours);
  // dtype, numel and op of the peer's call (raw header values) against `spec`.
  void call_fields(uint8_t their_dtype, uint64_t their_numel, uint8_t their_op,
                   const CollectiveSpec& spec);
  bool empty() const { return diffs_.empty(); }
  // "stragg: rank R: all_reduce #K: mismatch with rank P: dtype ...; numel ..."
  std::string message(const CollectiveSpec& spec) const;

 private:
  int rank_;
  int peer_;
  std::vector<std::string> diffs_;
};

}  // namespace stragg
