#include "transport/tcp/wait.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "transport/common.h"

namespace stragg::tcp {

Activity::Activity(int rank) : wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!wake_fd_.valid()) {
    throw Error(transport::rank_prefix(rank) +
                "tcp transport: eventfd() failed: " + transport::errno_text(errno));
  }
}

void Activity::note() {
  events_.fetch_add(1);
  const uint64_t one = 1;
  ssize_t r = ::write(wake_fd_.get(), &one, sizeof one);
  (void)r;  // EAGAIN only if the counter is saturated: it is readable then anyway
}

void Activity::drain() {
  uint64_t drained;
  ssize_t r = ::read(wake_fd_.get(), &drained, sizeof drained);
  (void)r;
}

void PollSet::clear() {
  fds_.clear();
  kinds_.clear();
  peers_.clear();
}

void PollSet::add(int fd, short events, Kind kind, int peer) {
  fds_.push_back({fd, events, 0});
  kinds_.push_back(kind);
  peers_.push_back(peer);
}

bool PollSet::wait(std::chrono::microseconds max_wait) { return poll_for(fds_, max_wait) > 0; }

}  // namespace stragg::tcp
