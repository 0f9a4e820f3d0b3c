// One peer's control connection in the TCP transport: small frames beside the data stream.
//
// A control frame is {uint32 type, uint32 length, payload}: ABORT carries the reason, BEAT the
// sender's Progress (transport.h) and the peers it has not heard from for a while (see
// heartbeat.h). The transport reads control connections whenever it waits, when its heartbeat
// thread beats, and when it is asked about the group's state (abort_reason, dead_peers,
// peer_status, signal_abort), independently of the receives posted on the data connections, so
// an abort reaches a rank that is blocked on some other peer and has no receive posted for the
// aborting one. Outgoing control bytes are bounded: an unsent beat is replaced by the newer one,
// and the transport queues the abort frame once. Any bytes received count as a sign of life.
//
// Not thread-safe: the transport guards every ControlConnection with its mutex.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace stragg::tcp {

enum ControlType : uint32_t { kAbort = 2, kBeat = 3 };
constexpr size_t kMaxAbortBytes = 4000;  // an abort reason is cut to this length

// What a BEAT frame carries.
struct Beat {
  Progress progress;
  std::vector<int> cannot_hear;  // peers the sender has not heard from for a while
};
// A BEAT frame's payload (lists cut to what fits in one control frame), and back; false if
// `payload` is not a beat.
std::string encode_beat(const Beat& beat);
bool decode_beat(const uint8_t* payload, size_t len, Beat* beat);

class ControlConnection {
 public:
  explicit ControlConnection(Fd fd) : fd_(std::move(fd)) {}

  int fd() const { return fd_.get(); }
  // Not at EOF and not failed: worth polling for input.
  bool readable() const { return readable_; }
  // Queued bytes wait for socket space.
  bool has_output() const { return writable_ && out_sent_ < out_.size(); }
  // The last beat received from the peer (progress.seq -1: none yet).
  const Beat& peer_beat() const { return peer_beat_; }
  // When bytes last arrived from the peer (the connection's creation before any did).
  std::chrono::steady_clock::time_point last_heard() const { return last_heard_; }

  // Reads what arrived. Beats are recorded; each complete ABORT frame goes to `on_abort`.
  // Returns false if the stream is corrupt (it is not read any more then).
  bool read(const std::function<void(std::string)>& on_abort);
  // Queues a frame (dropped if the peer is gone).
  void queue(uint32_t type, const void* payload, size_t len);
  // A beat payload (encode_beat), sent once the queued frames left (replacing an unsent older
  // one).
  void beat(std::string payload) { pending_beat_ = std::move(payload); }
  // Sends queued bytes without blocking. True when nothing is left to send.
  bool flush();

 private:
  bool parse(const std::function<void(std::string)>& on_abort);

  Fd fd_;
  std::vector<uint8_t> in_;  // bytes of incomplete frames
  std::string out_;          // queued bytes; out_[0, out_sent_) are gone
  size_t out_sent_ = 0;
  std::optional<std::string> pending_beat_;  // still to send (coalesced: only the newest)
  bool readable_ = true;                     // not at EOF / failed
  bool writable_ = true;
  Beat peer_beat_;
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
};

}  // namespace stragg::tcp
