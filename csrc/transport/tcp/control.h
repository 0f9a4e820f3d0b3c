// One peer's control connection in the TCP transport: small frames beside the data stream.
//
// A control frame is {uint32 type, uint32 length, payload}: ABORT carries the reason, ARRIVAL the
// int64 sequence number of the collective the sender started. The transport reads control
// connections whenever it waits or is asked about the group's state (abort_reason, dead_peers,
// peer_arrival, signal_abort), independently of the receives posted on the data connections, so
// an abort reaches a rank that is blocked on some other peer and has no receive posted for the
// aborting one. Outgoing control bytes are bounded: an unsent arrival ticket is replaced by the
// newer one, and the transport queues the abort frame once.
//
// Not thread-safe: the transport guards every ControlConnection with its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "transport/tcp/socket.h"

namespace stragg::tcp {

enum ControlType : uint32_t { kArrival = 1, kAbort = 2 };
constexpr size_t kMaxAbortBytes = 4000;  // an abort reason is cut to this length

class ControlConnection {
 public:
  explicit ControlConnection(Fd fd) : fd_(std::move(fd)) {}

  int fd() const { return fd_.get(); }
  // Not at EOF and not failed: worth polling for input.
  bool readable() const { return readable_; }
  // Queued bytes wait for socket space.
  bool has_output() const { return writable_ && out_sent_ < out_.size(); }
  // The last arrival ticket received from the peer (-1: none yet).
  int64_t peer_arrival() const { return peer_arrival_; }

  // Reads what arrived. Arrival tickets are recorded; each complete ABORT frame goes to
  // `on_abort`. Returns false if the stream is corrupt (it is not read any more then).
  bool read(const std::function<void(std::string)>& on_abort);
  // Queues a frame (dropped if the peer is gone).
  void queue(uint32_t type, const void* payload, size_t len);
  // This rank's arrival ticket, sent once the queued frames left (replacing an unsent older one).
  void announce(int64_t seq) { pending_arrival_ = seq; }
  // Sends queued bytes without blocking. True when nothing is left to send.
  bool flush();

 private:
  bool parse(const std::function<void(std::string)>& on_abort);

  Fd fd_;
  std::vector<uint8_t> in_;  // bytes of incomplete frames
  std::string out_;          // queued bytes; out_[0, out_sent_) are gone
  size_t out_sent_ = 0;
  std::optional<int64_t> pending_arrival_;  // still to send (coalesced: only the newest)
  bool readable_ = true;                    // not at EOF / failed
  bool writable_ = true;
  int64_t peer_arrival_ = -1;
};

}  // namespace stragg::tcp
