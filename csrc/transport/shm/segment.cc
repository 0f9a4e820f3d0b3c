#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "transport/common.h"

namespace stragg::shm {

using transport::errno_text;
using transport::rank_prefix;

std::unique_ptr<Segment> Segment::create(const std::string& name, size_t bytes, int rank) {
  std::unique_ptr<Segment> s(new Segment());
  s->fd_ = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (s->fd_ < 0) {
    throw Error(rank_prefix(rank) + "shm_open(" + name + ") failed: " + errno_text(errno));
  }
  s->name_ = name;  // from here on unlinked on failure
  if (ftruncate(s->fd_, static_cast<off_t>(bytes)) != 0) {
    throw Error(rank_prefix(rank) + "ftruncate of shared memory to " + std::to_string(bytes) +
                " bytes failed: " + errno_text(errno));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
  if (base == MAP_FAILED) {
    throw Error(rank_prefix(rank) + "mmap of shared memory failed: " + errno_text(errno));
  }
  s->base_ = static_cast<uint8_t*>(base);
  s->bytes_ = bytes;
  return s;
}

std::unique_ptr<Segment> Segment::open(const std::string& name, size_t bytes, int rank, int peer) {
  std::unique_ptr<Segment> s(new Segment());
  const std::string whose = "rank " + std::to_string(peer) + "'s shared memory";
  s->fd_ = shm_open(name.c_str(), O_RDWR, 0600);
  if (s->fd_ < 0) {
    throw Error(rank_prefix(rank) + "cannot open " + whose + " " + name + ": " + errno_text(errno) +
                " (are all ranks really on one host? set STRAGG_TRANSPORT to override)");
  }
  struct stat st;
  if (fstat(s->fd_, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    throw Error(rank_prefix(rank) + whose + " has an unexpected size");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_, 0);
  if (base == MAP_FAILED) {
    throw Error(rank_prefix(rank) + "mmap of " + whose + " failed: " + errno_text(errno));
  }
  close(s->fd_);
  s->fd_ = -1;
  s->base_ = static_cast<uint8_t*>(base);
  s->bytes_ = bytes;
  return s;
}

Segment::~Segment() {
  if (base_) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
  unlink();
}

int Segment::back(size_t offset, size_t len) {
  return posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(len));
}

void Segment::unlink() {
  if (name_.empty()) return;
  shm_unlink(name_.c_str());
  name_.clear();
}

}  // namespace stragg::shm
