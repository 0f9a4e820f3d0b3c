// Wake-ups of the TCP transport: the activity count and the poll set of wait_for_activity().
//
// activity_token() is an event count bumped when the transport itself learns something (abort
// received or signalled, a peer found dead). wait_for_activity(token) returns at once if the
// count moved; otherwise it blocks in ppoll() on:
//   - an eventfd, written when another thread signals an abort or finds news;
//   - every open control connection: POLLIN (and POLLOUT while control bytes are queued);
//   - every live data connection: POLLRDHUP always (peer closed), POLLIN if the last progress()
//     left a receive from that peer unfinished, POLLOUT if it left a send to it unfinished.
// poll() is level-triggered, so bytes or socket space that appeared after progress() gave up are
// seen by the wait: no wake-up is lost between polling the ops and waiting.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "transport/tcp/socket.h"

namespace stragg::tcp {

// The event count and the eventfd that wakes a waiting thread when it moves.
class Activity {
 public:
  explicit Activity(int rank);  // throws stragg::Error naming `rank` if no eventfd can be made

  int fd() const { return wake_fd_.get(); }
  uint64_t token() const { return events_.load(); }
  // Something a waiter must see happened: bump the count and wake a wait in another thread.
  void note();
  // Empties the eventfd after a wait saw it readable.
  void drain();

 private:
  Fd wake_fd_;
  std::atomic<uint64_t> events_{0};
};

// What one wait polls, and which peer and connection each entry stands for. Reused across
// waits to keep them allocation-free.
class PollSet {
 public:
  enum Kind : uint8_t { kWake, kData, kControl };

  void clear();
  void add(int fd, short events, Kind kind, int peer = -1);
  // ppoll() for at most `max_wait`; false if nothing became ready.
  bool wait(std::chrono::microseconds max_wait);

  size_t size() const { return fds_.size(); }
  short revents(size_t i) const { return fds_[i].revents; }
  int fd(size_t i) const { return fds_[i].fd; }
  Kind kind(size_t i) const { return kinds_[i]; }
  int peer(size_t i) const { return peers_[i]; }

 private:
  std::vector<pollfd> fds_;
  std::vector<Kind> kinds_;
  std::vector<int> peers_;
};

}  // namespace stragg::tcp
