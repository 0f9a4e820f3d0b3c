#include "transport/tcp/socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>

#include "common/error.h"
#include "transport/common.h"

namespace stragg::tcp {
namespace {

// A send or receive call's result, sorted. `r` == 0 means EOF for a receive; a send of a
// non-empty buffer never returns 0 on a stream socket, so it is treated as a reset.
Transfer sort_result(ssize_t r, bool is_send) {
  Transfer t;
  if (r > 0) {
    t.bytes = static_cast<size_t>(r);
  } else if (r == 0) {
    t.err = is_send ? ECONNRESET : 0;
  } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
    t.would_block = true;
  } else {
    t.err = errno;
  }
  return t;
}

}  // namespace

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Fd make_stream_socket(int family, int send_buffer, int recv_buffer, const std::string& context) {
  Fd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Error(context + ": socket() failed: " + transport::errno_text(errno));
  if (send_buffer > 0) setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof(int));
  if (recv_buffer > 0) setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &recv_buffer, sizeof(int));
  set_no_delay(fd.get());
  return fd;
}

void set_no_delay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_unsent_limit(int fd, size_t bytes) {
  const int v = static_cast<int>(std::min<size_t>(bytes, std::numeric_limits<int>::max()));
  setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v);
}

Transfer receive_some(int fd, void* buf, size_t len) {
  while (true) {
    const ssize_t r = ::recv(fd, buf, len, MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    return sort_result(r, false);
  }
}

Transfer send_some(int fd, const void* buf, size_t len) {
  while (true) {
    const ssize_t r = ::send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    return sort_result(r, true);
  }
}

Transfer send_vector(int fd, iovec* iov, int count) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(count);
  while (true) {
    const ssize_t r = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    return sort_result(r, true);
  }
}

int poll_for(std::vector<pollfd>& fds, std::chrono::microseconds timeout) {
  if (timeout.count() < 0) timeout = std::chrono::microseconds(0);
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  return ::ppoll(fds.data(), fds.size(), &ts, nullptr);
}

}  // namespace stragg::tcp
