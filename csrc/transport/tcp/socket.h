// Sockets of the TCP transport: an owned file descriptor, the options every stream socket gets,
// non-blocking transfers that retry EINTR and sort the outcome, and ppoll() with a duration.
//
// Every stream socket is non-blocking, close-on-exec and TCP_NODELAY. Sends use MSG_NOSIGNAL,
// so SIGPIPE never fires: a vanished peer shows up as an ended transfer instead.
#pragma once

#include <poll.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace stragg::tcp {

// Owns a file descriptor (closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A non-blocking, close-on-exec TCP socket with TCP_NODELAY and the given SO_SNDBUF / SO_RCVBUF
// bytes (0 keeps the kernel's autotuning). The sizes are set before connect/listen so that the
// window scale covers them. Throws stragg::Error starting with `context`.
Fd make_stream_socket(int family, int send_buffer, int recv_buffer, const std::string& context);

void set_no_delay(int fd);
// TCP_NOTSENT_LOWAT: the socket takes more bytes only while fewer than `bytes` wait unsent
// (0: the kernel's net.ipv4.tcp_notsent_lowat).
void set_unsent_limit(int fd, size_t bytes);

// Outcome of one non-blocking send or receive (EINTR is retried inside).
struct Transfer {
  size_t bytes = 0;          // > 0: this many bytes moved
  bool would_block = false;  // nothing moved for now (EAGAIN)
  int err = 0;               // else the connection ended: the errno, 0 for an orderly EOF

  bool moved() const { return bytes > 0; }
  bool ended() const { return bytes == 0 && !would_block; }
};

Transfer receive_some(int fd, void* buf, size_t len);
Transfer send_some(int fd, const void* buf, size_t len);
Transfer send_vector(int fd, iovec* iov, int count);

// ppoll() on `fds` for at most `timeout` (a negative one counts as zero). Returns ppoll's result:
// the number of ready entries, 0 on timeout, -1 on error (EINTR included).
int poll_for(std::vector<pollfd>& fds, std::chrono::microseconds timeout);

}  // namespace stragg::tcp
