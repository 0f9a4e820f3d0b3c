// POSIX shared-memory segments of the shared-memory transport. Each rank creates its own
// segment and maps every peer's; once all ranks have mapped all segments the names are
// unlinked, so nothing is left in /dev/shm even if a process is killed later. A created segment
// whose name is still linked when it is destroyed (setup failed) unlinks it then.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace stragg::shm {

class Segment {
 public:
  // Creates the segment `name` (which must not exist) of `bytes` and maps it; no memory backs
  // it until back() or first touch. Throws stragg::Error naming `rank`.
  static std::unique_ptr<Segment> create(const std::string& name, size_t bytes, int rank);
  // Maps rank `peer`'s segment `name`, which must have `bytes`. Throws stragg::Error naming
  // `rank` and `peer`.
  static std::unique_ptr<Segment> open(const std::string& name, size_t bytes, int rank, int peer);
  ~Segment();

  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  uint8_t* base() const { return base_; }
  // Own segments: backs [offset, offset + len) with memory now (posix_fallocate), so that a full
  // /dev/shm is an error here instead of a SIGBUS on first touch. Returns 0 or the error number.
  int back(size_t offset, size_t len);
  // Own segments: removes the name (mappings stay valid).
  void unlink();

 private:
  Segment() = default;

  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;       // own segments keep it open for back()
  std::string name_;  // own segments while the name is linked
};

}  // namespace stragg::shm
