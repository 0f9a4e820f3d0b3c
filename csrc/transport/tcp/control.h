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
// ACK carries the bytes of the peer's data stream this rank has received (data_connection.h):
// only the newest unsent one is kept, like a beat. A control connection that fails with an
// error is lost (the transport re-dials it and starts a fresh ControlConnection, queueing the
// abort again if it was sent); EOF means the peer closed it.
//
// Not thread-safe: the transport guards every ControlConnection with its mutex.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace stragg::tcp {

enum ControlType : uint32_t { kAbort = 2, kBeat = 3, kAck = 4 };
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
  // Failed with an error (not EOF): to be re-dialed. take_loss(): its errno once, else 0.
  bool lost() const { return lost_err_ != 0; }
  int take_loss() { return std::exchange(loss_pending_, 0); }
  // The peer closed it (EOF): its transport or process is gone.
  bool ended() const { return !readable_ && !lost(); }
  // Queued bytes wait for socket space.
  bool has_output() const { return writable_ && out_sent_ < out_.size(); }
  // The last beat received from the peer (progress.seq -1: none yet).
  const Beat& peer_beat() const { return peer_beat_; }
  // When bytes last arrived from the peer (the connection's creation before any did).
  std::chrono::steady_clock::time_point last_heard() const { return last_heard_; }

  // Reads what arrived. Beats are recorded; each complete ABORT frame goes to `on_abort`, each
  // ACK's offset to `on_ack`. Returns false if the stream is corrupt (it is not read any more
  // then).
  bool read(const std::function<void(std::string)>& on_abort,
            const std::function<void(uint64_t)>& on_ack);
  // Queues a frame (dropped if the peer is gone).
  void queue(uint32_t type, const void* payload, size_t len);
  // A beat payload (encode_beat), sent once the queued frames left (replacing an unsent older
  // one).
  void beat(std::string payload) { pending_beat_ = std::move(payload); }
  // Acknowledges `offset` bytes of the peer's data stream (sent after the beat; an older unsent
  // ack is replaced, one not newer than the last queued is dropped).
  void ack(uint64_t offset) {
    if (offset > acked_) pending_ack_ = acked_ = offset;
  }
  // Sends queued bytes without blocking. True when nothing is left to send.
  bool flush();

 private:
  bool parse(const std::function<void(std::string)>& on_abort,
             const std::function<void(uint64_t)>& on_ack);
  void fail(int err);

  Fd fd_;
  std::vector<uint8_t> in_;  // bytes of incomplete frames
  std::string out_;          // queued bytes; out_[0, out_sent_) are gone
  size_t out_sent_ = 0;
  std::optional<std::string> pending_beat_;  // still to send (coalesced: only the newest)
  uint64_t pending_ack_ = 0;                 // still to send (0: none)
  uint64_t acked_ = 0;                       // the newest ack queued
  bool readable_ = true;                     // not at EOF / failed
  bool writable_ = true;
  int lost_err_ = 0;
  int loss_pending_ = 0;
  Beat peer_beat_;
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
};

}  // namespace stragg::tcp
