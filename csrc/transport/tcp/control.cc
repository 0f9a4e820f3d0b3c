#include "transport/tcp/control.h"

#include <cstring>

namespace stragg::tcp {
namespace {

struct ControlHead {
  uint32_t type;
  uint32_t len;
};
constexpr size_t kMaxControlPayload = 4096;

}  // namespace

bool ControlConnection::read(const std::function<void(std::string)>& on_abort) {
  uint8_t buf[4096];
  while (readable_) {
    const Transfer t = receive_some(fd_.get(), buf, sizeof buf);
    if (t.moved()) {
      in_.insert(in_.end(), buf, buf + t.bytes);
    } else if (t.would_block) {
      break;
    } else {
      // EOF or reset: the peer closed its transport or died. Its data connection decides when
      // it counts as dead (see tcp_transport.h); stop polling this one.
      readable_ = false;
    }
  }
  return parse(on_abort);
}

bool ControlConnection::parse(const std::function<void(std::string)>& on_abort) {
  size_t pos = 0;
  while (in_.size() - pos >= sizeof(ControlHead)) {
    ControlHead head;
    std::memcpy(&head, in_.data() + pos, sizeof head);
    if (head.len > kMaxControlPayload || (head.type != kArrival && head.type != kAbort)) {
      readable_ = false;
      in_.clear();
      return false;
    }
    if (in_.size() - pos < sizeof head + head.len) break;
    const uint8_t* payload = in_.data() + pos + sizeof head;
    if (head.type == kArrival && head.len == sizeof(int64_t)) {
      std::memcpy(&peer_arrival_, payload, sizeof(int64_t));
    } else if (head.type == kAbort) {
      on_abort(std::string(reinterpret_cast<const char*>(payload), head.len));
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
      if (!pending_arrival_) return true;
      const int64_t seq = *pending_arrival_;
      pending_arrival_.reset();
      queue(kArrival, &seq, sizeof seq);
    }
    const Transfer t = send_some(fd_.get(), out_.data() + out_sent_, out_.size() - out_sent_);
    if (t.moved()) {
      out_sent_ += t.bytes;
    } else if (t.would_block) {
      return false;
    } else {
      writable_ = false;  // the peer is gone; nothing more to tell it
      out_.clear();
      out_sent_ = 0;
    }
  }
  return true;
}

}  // namespace stragg::tcp
