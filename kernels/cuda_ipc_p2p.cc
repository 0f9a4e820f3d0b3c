#include "kernels/cuda_ipc_p2p.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include "common/error.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_device.h"

namespace stragg::gpu {
namespace {

std::string to_hex(const void* data, size_t n) {
  static const char* digits = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

bool from_hex(const std::string& s, size_t pos, void* out, size_t n) {
  if (s.size() < pos + 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(s[pos + 2 * i]), lo = nibble(s[pos + 2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

bool pid_dead(int64_t pid) {
  return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

// Published by every rank at setup. Fields separated by ';'.
enum Field {
  kVersion,
  kPid,
  kDevice,
  kSlotBytes,
  kSlots,
  kShmName,
  kStaging,
  kReady,
  kConsumed,
  kFields
};

}  // namespace

CudaIpcP2P::CudaIpcP2P(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                       int device, std::chrono::milliseconds timeout, CudaIpcOptions options)
    : StagedP2P(cuda_device(), "cuda-ipc", rank, size, device, options.slot_bytes, options.slots) {
  int previous = 0;
  cuda_check(cudaGetDevice(&previous), where() + ": cudaGetDevice");
  std::string shm_name;  // rank 0: the segment it created, until everyone has opened it
  try {
    cuda_check(cudaSetDevice(device), where() + ": cudaSetDevice(" + std::to_string(device) + ")");
    setup(rdv, key_prefix, timeout, shm_name);
  } catch (...) {
    if (!shm_name.empty()) ::shm_unlink(shm_name.c_str());  // rank 0, before everyone opened it
    cleanup();
    cudaSetDevice(previous);
    throw;
  }
  cudaSetDevice(previous);
}

// Rank 0 creates the shared block; the name travels with its published record.
void CudaIpcP2P::create_shared(std::string& shm_name) {
  shared_map_bytes_ = shared_bytes(size_);
  std::random_device rd;
  shm_name = "/stragg-cudaipc-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
  const int fd = ::shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw Error(where() + ": shm_open(" + shm_name + "): " + std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(shared_map_bytes_)) != 0) {
    const int err = errno;
    ::close(fd);
    const std::string name = shm_name;
    ::shm_unlink(name.c_str());
    shm_name.clear();
    throw Error(where() + ": ftruncate(" + name + "): " + std::strerror(err));
  }
  void* p = ::mmap(nullptr, shared_map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw Error(where() + ": mmap(" + shm_name + "): " + std::strerror(errno));
  shared_map_ = p;  // zero-filled by ftruncate
}

void CudaIpcP2P::open_shared(const std::string& name) {
  shared_map_bytes_ = shared_bytes(size_);
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw Error(where() + ": shm_open(" + name + ") of rank 0: " + std::strerror(errno));
  void* p = ::mmap(nullptr, shared_map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw Error(where() + ": mmap(" + name + "): " + std::strerror(errno));
  shared_map_ = p;
}

void CudaIpcP2P::setup(Rendezvous& rdv, const std::string& key_prefix,
                       std::chrono::milliseconds timeout, std::string& shm_name) {
  const size_t n = static_cast<size_t>(size_);
  const size_t slots = static_cast<size_t>(slots_);
  if (rank_ == 0) create_shared(shm_name);

  // My staging (indexed by sender) and the events I record.
  void* staging = nullptr;
  cuda_check(
      cudaMalloc(&staging, n * slots * slot_bytes_),
      where() + ": cudaMalloc of " + std::to_string(n * slots * slot_bytes_) + " staging bytes");
  staging_ = static_cast<uint8_t*>(staging);
  cudaIpcMemHandle_t mem_handle;
  cuda_check(cudaIpcGetMemHandle(&mem_handle, staging_), where() + ": cudaIpcGetMemHandle");
  ready_mine_.assign(n * slots, nullptr);
  consumed_mine_.assign(n * slots, nullptr);
  std::string ready_hex, consumed_hex;
  for (size_t q = 0; q < n; ++q) {
    for (size_t s = 0; s < slots; ++s) {
      cudaIpcEventHandle_t h[2];
      std::memset(h, 0, sizeof h);
      if (q != static_cast<size_t>(rank_)) {
        const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
        for (auto* v : {&ready_mine_, &consumed_mine_}) {
          cuda_check(cudaEventCreateWithFlags(&(*v)[q * slots + s], flags),
                     where() + ": cudaEventCreateWithFlags (interprocess)");
        }
        cuda_check(cudaIpcGetEventHandle(&h[0], ready_mine_[q * slots + s]),
                   where() + ": cudaIpcGetEventHandle");
        cuda_check(cudaIpcGetEventHandle(&h[1], consumed_mine_[q * slots + s]),
                   where() + ": cudaIpcGetEventHandle");
      }
      ready_hex += to_hex(&h[0], sizeof h[0]);
      consumed_hex += to_hex(&h[1], sizeof h[1]);
    }
  }

  std::ostringstream mine;
  mine << "1;" << ::getpid() << ";" << device_ << ";" << slot_bytes_ << ";" << slots_ << ";"
       << shm_name << ";" << to_hex(&mem_handle, sizeof mem_handle) << ";" << ready_hex << ";"
       << consumed_hex;
  const auto records = exchange_all(rdv, key_prefix + "/cuda_ipc", rank_, size_, mine.str(),
                                    timeout, "cuda-ipc setup");
  pids_.assign(n, 0);
  ready_peer_.assign(n * slots, nullptr);
  consumed_peer_.assign(n * slots, nullptr);
  for (size_t q = 0; q < n; ++q) open_peer(static_cast<int>(q), split(records[q], ';'));
  attach_shared(shared_map_);
  // Everyone has mapped the shared segment: its name can go (nothing stays in /dev/shm).
  exchange_all(rdv, key_prefix + "/cuda_ipc_opened", rank_, size_, "1", timeout, "cuda-ipc setup");
  if (rank_ == 0) {
    ::shm_unlink(shm_name.c_str());
    shm_name.clear();
  }
}

// Rank q's published record: its pid, the shared segment (rank 0), its staging and the events
// it records for the channels with me.
void CudaIpcP2P::open_peer(int q, const std::vector<std::string>& f) {
  const std::string peer = std::to_string(q);
  const size_t slots = static_cast<size_t>(slots_);
  if (f.size() != kFields || f[kVersion] != "1") {
    throw Error(where() + ": malformed setup record from rank " + peer);
  }
  pids_[q] = std::stoll(f[kPid]);
  if (f[kSlotBytes] != std::to_string(slot_bytes_) || f[kSlots] != std::to_string(slots_)) {
    throw Error(where() + ": staging configuration mismatch with rank " + peer +
                ": slots x bytes " + f[kSlots] + " x " + f[kSlotBytes] + " (rank " + peer +
                ") vs " + std::to_string(slots_) + " x " + std::to_string(slot_bytes_) + " (rank " +
                std::to_string(rank_) + ")");
  }
  if (q == 0 && rank_ != 0) open_shared(f[kShmName]);
  if (q == rank_) return;
  if (pids_[q] == ::getpid()) {
    throw Error(where() + ": rank " + peer +
                " runs in this process; CUDA IPC needs one process per rank");
  }
  cudaIpcMemHandle_t peer_mem;
  if (!from_hex(f[kStaging], 0, &peer_mem, sizeof peer_mem)) {
    throw Error(where() + ": malformed staging handle from rank " + peer);
  }
  void* p = nullptr;
  cuda_check(cudaIpcOpenMemHandle(&p, peer_mem, cudaIpcMemLazyEnablePeerAccess),
             where() + ": cudaIpcOpenMemHandle (staging of rank " + peer + " on device " +
                 f[kDevice] + ")");
  peer_staging_[q] = static_cast<uint8_t*>(p);
  for (size_t s = 0; s < slots; ++s) {
    // Rank q's events for the channels with me: its ready events for q -> me (I wait on them
    // as receiver), its consumed events for me -> q (I wait on them as sender).
    const size_t idx = static_cast<size_t>(rank_) * slots + s;
    for (auto [field, v] :
         {std::pair{kReady, &ready_peer_}, std::pair{kConsumed, &consumed_peer_}}) {
      cudaIpcEventHandle_t h;
      if (!from_hex(f[field], idx * 2 * sizeof h, &h, sizeof h)) {
        throw Error(where() + ": malformed event handle from rank " + peer);
      }
      cuda_check(cudaIpcOpenEventHandle(&(*v)[q * slots + s], h),
                 where() + ": cudaIpcOpenEventHandle (rank " + peer + ")");
    }
  }
}

bool CudaIpcP2P::peer_gone(int q) { return pid_dead(pids_[q]); }

void CudaIpcP2P::cleanup() noexcept {
  int previous = 0;
  const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(device_);
  for (uint8_t* p : peer_staging_) {
    if (p != nullptr) cudaIpcCloseMemHandle(p);
  }
  peer_staging_.clear();
  for (auto* v : {&ready_mine_, &consumed_mine_, &ready_peer_, &consumed_peer_}) {
    for (Event e : *v) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    v->clear();
  }
  if (staging_ != nullptr) cudaFree(staging_);
  staging_ = nullptr;
  attach_shared(nullptr);
  if (shared_map_ != nullptr) ::munmap(shared_map_, shared_map_bytes_);
  shared_map_ = nullptr;
  if (have_previous) cudaSetDevice(previous);
}

CudaIpcP2P::~CudaIpcP2P() { cleanup(); }

}  // namespace stragg::gpu
