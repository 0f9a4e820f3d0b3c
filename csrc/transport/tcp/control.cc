#include "transport/tcp/control.h"

#include <algorithm>
#include <cstring>

namespace stragg::tcp {
namespace {

struct ControlHead {
  uint32_t type;
  uint32_t len;
};
constexpr size_t kMaxControlPayload = 4096;

// BEAT payload: the fixed part, then awaiting and cannot_hear as int32 ranks.
struct BeatHead {
  int64_t seq;
  int64_t call;
  int32_t step;
  uint16_t awaiting;
  uint16_t cannot_hear;
};
constexpr size_t kMaxBeatRanks = (kMaxControlPayload - sizeof(BeatHead)) / sizeof(int32_t);

}  // namespace

std::string encode_beat(const Beat& beat) {
  const size_t a = std::min(beat.progress.awaiting.size(), kMaxBeatRanks);
  const size_t c = std::min(beat.cannot_hear.size(), kMaxBeatRanks - a);
  const BeatHead head{beat.progress.seq, beat.progress.call, beat.progress.step,
                      static_cast<uint16_t>(a), static_cast<uint16_t>(c)};
  std::string out(reinterpret_cast<const char*>(&head), sizeof head);
  auto put = [&](int r) {
    const int32_t v = r;
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  };
  for (size_t i = 0; i < a; ++i) put(beat.progress.awaiting[i]);
  for (size_t i = 0; i < c; ++i) put(beat.cannot_hear[i]);
  return out;
}

bool decode_beat(const uint8_t* payload, size_t len, Beat* beat) {
  BeatHead head;
  if (len < sizeof head) return false;
  std::memcpy(&head, payload, sizeof head);
  if (len != sizeof head + (size_t{head.awaiting} + head.cannot_hear) * sizeof(int32_t)) {
    return false;
  }
  beat->progress.seq = head.seq;
  beat->progress.call = head.call;
  beat->progress.step = head.step;
  beat->progress.awaiting.resize(head.awaiting);
  beat->cannot_hear.resize(head.cannot_hear);
  const uint8_t* p = payload + sizeof head;
  for (auto* list : {&beat->progress.awaiting, &beat->cannot_hear}) {
    for (int& r : *list) {
      int32_t v;
      std::memcpy(&v, p, sizeof v);
      p += sizeof v;
      r = v;
    }
  }
  return true;
}

void ControlConnection::fail(int err) {
  if (lost_err_ == 0) lost_err_ = loss_pending_ = err;
  readable_ = writable_ = false;
  out_.clear();
  out_sent_ = 0;
}

bool ControlConnection::read(const std::function<void(std::string)>& on_abort,
                             const std::function<void(uint64_t)>& on_ack) {
  uint8_t buf[4096];
  while (readable_) {
    const Transfer t = receive_some(fd_.get(), buf, sizeof buf);
    if (t.moved()) {
      in_.insert(in_.end(), buf, buf + t.bytes);
      last_heard_ = std::chrono::steady_clock::now();
    } else if (t.would_block) {
      break;
    } else if (t.err != 0) {
      fail(t.err);  // reset: re-dialed by the transport
    } else {
      // EOF: the peer closed its transport or died. Its data connection decides when it
      // counts as dead (see tcp_transport.h); stop polling this one.
      readable_ = false;
    }
  }
  return parse(on_abort, on_ack);
}

bool ControlConnection::parse(const std::function<void(std::string)>& on_abort,
                              const std::function<void(uint64_t)>& on_ack) {
  size_t pos = 0;
  while (in_.size() - pos >= sizeof(ControlHead)) {
    ControlHead head;
    std::memcpy(&head, in_.data() + pos, sizeof head);
    const bool known = head.type == kBeat || head.type == kAbort ||
                       (head.type == kAck && head.len == sizeof(uint64_t));
    if (head.len > kMaxControlPayload || !known) {
      readable_ = false;
      in_.clear();
      return false;
    }
    if (in_.size() - pos < sizeof head + head.len) break;
    const uint8_t* payload = in_.data() + pos + sizeof head;
    if (head.type == kBeat) {
      Beat beat;
      if (!decode_beat(payload, head.len, &beat)) {
        readable_ = false;
        in_.clear();
        return false;
      }
      peer_beat_ = std::move(beat);
    } else if (head.type == kAbort) {
      on_abort(std::string(reinterpret_cast<const char*>(payload), head.len));
    } else {
      uint64_t offset;
      std::memcpy(&offset, payload, sizeof offset);
      on_ack(offset);
    }
    pos += sizeof head + head.len;
  }
  in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(pos));
  return true;
}

void ControlConnection::queue(uint32_t type, const void* payload, size_t len) {
  if (!writable_) return;
  const ControlHead head{type, static_cast<uint32_t>(len)};
  out_.append(reinterpret_cast<const char*>(&head), sizeof head);
  out_.append(static_cast<const char*>(payload), len);
}

bool ControlConnection::flush() {
  while (writable_) {
    if (out_sent_ == out_.size()) {
      out_.clear();
      out_sent_ = 0;
      if (!pending_beat_ && pending_ack_ == 0) return true;
      if (pending_beat_) {
        const std::string beat = std::move(*pending_beat_);
        pending_beat_.reset();
        queue(kBeat, beat.data(), beat.size());
      }
      if (pending_ack_ != 0) {
        queue(kAck, &pending_ack_, sizeof pending_ack_);
        pending_ack_ = 0;
      }
    }
    const Transfer t = send_some(fd_.get(), out_.data() + out_sent_, out_.size() - out_sent_);
    if (t.moved()) {
      out_sent_ += t.bytes;
    } else if (t.would_block) {
      return false;
    } else {
      fail(t.err);  // reset (re-dialed by the transport) or the peer is gone
    }
  }
  return true;
}

}  // namespace stragg::tcp
