// Receives one message of a plan step into the rank's buffer (no torch here): checks the header
// against what this rank expects (a different collective, dtype, numel, op, algorithm or step
// raises, naming both sides), then reduces or copies the payload, or stages it to be applied when
// the step's ops are done.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/lowered_schedule.h"
#include "runtime/stall.h"
#include "transport/transport.h"

namespace stragg {

class StepSink final : public RecvSink {
 public:
  // stream_copies: a copying receive (not reducing, not staged) writes the buffer with
  // non-temporal stores (runtime/streaming_copy.h).
  StepSink(int rank, const CollectiveSpec& spec, uint8_t tag, uint32_t step, const LoweredOp& op,
           uint8_t* buf, bool stream_copies);
  // Whether this receive's payload is written with non-temporal stores.
  bool streams() const { return stream_copies_; }
  // Staged receives: applies the message (after the step's sends are done).
  void apply_staged();
  void on_header(const MessageHeader& h) override;
  void on_data(size_t offset, const void* data, size_t len) override;

 private:
  int rank_;
  const CollectiveSpec& spec_;
  uint8_t tag_;
  uint32_t step_;
  LoweredOp op_;
  uint8_t* buf_;
  bool stream_copies_;
  std::unique_ptr<uint8_t[]> staging_;
};

}  // namespace stragg
