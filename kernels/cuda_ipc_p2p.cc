#include "kernels/cuda_ipc_p2p.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "kernels/cuda_check.h"
#include "runtime/error.h"

namespace stragg::gpu {

// Shared-memory segment: this header, then size x size Channel records (sender-major).
struct CudaIpcP2P::Shared {
  std::atomic<uint32_t> abort_state;  // 0: none, 1: a reason is being written, 2: reason valid
  char reason[1020];
};

namespace {

using Clock = std::chrono::steady_clock;

struct Channel {
  alignas(64) std::atomic<uint64_t> ready;     // pieces the sender has enqueued
  alignas(64) std::atomic<uint64_t> consumed;  // pieces the receiver has enqueued to copy out
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters must be lock-free");

Channel* channels(CudaIpcP2P::Shared* shared) {
  auto* base = reinterpret_cast<char*>(shared) + ((sizeof(CudaIpcP2P::Shared) + 63) & ~size_t{63});
  return reinterpret_cast<Channel*>(base);
}

size_t shared_size(int n) {
  return ((sizeof(CudaIpcP2P::Shared) + 63) & ~size_t{63}) + sizeof(Channel) * n * n;
}

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
enum Field { kVersion, kPid, kDevice, kSlotBytes, kSlots, kShmName, kStaging, kReady, kConsumed, kFields };

}  // namespace

std::string CudaIpcP2P::where() const {
  return "stragg: rank " + std::to_string(rank_) + ": cuda-ipc p2p";
}

CudaIpcP2P::CudaIpcP2P(Rendezvous& rdv, const std::string& key_prefix, int rank, int size,
                       int device, std::chrono::milliseconds timeout, CudaIpcOptions options)
    : rank_(rank), size_(size), device_(device), opt_(options) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(where() + ": invalid rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  if (opt_.slots < 1 || opt_.slot_bytes == 0) {
    throw Error(where() + ": need at least one staging slot of at least one byte");
  }
  const size_t n = static_cast<size_t>(size);
  const size_t slots = static_cast<size_t>(opt_.slots);
  int previous = 0;
  cuda_check(cudaGetDevice(&previous), where() + ": cudaGetDevice");
  std::string shm_name;  // rank 0: the segment it created, until everyone has opened it
  try {
    cuda_check(cudaSetDevice(device), where() + ": cudaSetDevice(" + std::to_string(device) + ")");

    // Rank 0 creates the shared counters; the name travels with its published record.
    shared_bytes_ = shared_size(size);
    if (rank == 0) {
      std::random_device rd;
      shm_name = "/stragg-cudaipc-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
      const int fd = ::shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) throw Error(where() + ": shm_open(" + shm_name + "): " + std::strerror(errno));
      if (::ftruncate(fd, static_cast<off_t>(shared_bytes_)) != 0) {
        const int err = errno;
        ::close(fd);
        ::shm_unlink(shm_name.c_str());
        throw Error(where() + ": ftruncate(" + shm_name + "): " + std::strerror(err));
      }
      void* p = ::mmap(nullptr, shared_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) {
        ::shm_unlink(shm_name.c_str());
        throw Error(where() + ": mmap(" + shm_name + "): " + std::strerror(errno));
      }
      shared_ = static_cast<Shared*>(p);  // zero-filled by ftruncate
    }

    // My staging (indexed by sender) and the events I record.
    cuda_check(cudaMalloc(&staging_, n * slots * opt_.slot_bytes),
               where() + ": cudaMalloc of " + std::to_string(n * slots * opt_.slot_bytes) +
                   " staging bytes");
    cudaIpcMemHandle_t mem_handle;
    cuda_check(cudaIpcGetMemHandle(&mem_handle, staging_), where() + ": cudaIpcGetMemHandle");
    ready_mine_.assign(n * slots, nullptr);
    consumed_mine_.assign(n * slots, nullptr);
    std::string ready_hex, consumed_hex;
    for (size_t q = 0; q < n; ++q) {
      for (size_t s = 0; s < slots; ++s) {
        cudaIpcEventHandle_t h[2];
        std::memset(h, 0, sizeof h);
        if (q != static_cast<size_t>(rank)) {
          const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
          cuda_check(cudaEventCreateWithFlags(&ready_mine_[q * slots + s], flags),
                     where() + ": cudaEventCreateWithFlags (interprocess)");
          cuda_check(cudaEventCreateWithFlags(&consumed_mine_[q * slots + s], flags),
                     where() + ": cudaEventCreateWithFlags (interprocess)");
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
    mine << "1;" << ::getpid() << ";" << device << ";" << opt_.slot_bytes << ";" << opt_.slots
         << ";" << shm_name << ";" << to_hex(&mem_handle, sizeof mem_handle) << ";" << ready_hex
         << ";" << consumed_hex;
    const auto records = exchange_all(rdv, key_prefix + "/cuda_ipc", rank, size, mine.str(),
                                      timeout, "cuda-ipc setup");

    pids_.assign(n, 0);
    peer_staging_.assign(n, nullptr);
    ready_peer_.assign(n * slots, nullptr);
    consumed_peer_.assign(n * slots, nullptr);
    for (size_t q = 0; q < n; ++q) {
      const auto f = split(records[q], ';');
      if (f.size() != kFields || f[kVersion] != "1") {
        throw Error(where() + ": malformed setup record from rank " + std::to_string(q));
      }
      pids_[q] = std::stoll(f[kPid]);
      if (f[kSlotBytes] != std::to_string(opt_.slot_bytes) || f[kSlots] != std::to_string(opt_.slots)) {
        throw Error(where() + ": staging configuration mismatch with rank " + std::to_string(q) +
                    ": slots x bytes " + f[kSlots] + " x " + f[kSlotBytes] + " (rank " +
                    std::to_string(q) + ") vs " + std::to_string(opt_.slots) + " x " +
                    std::to_string(opt_.slot_bytes) + " (rank " + std::to_string(rank) + ")");
      }
      if (q == 0 && rank != 0) {
        const std::string& name = f[kShmName];
        const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
        if (fd < 0) throw Error(where() + ": shm_open(" + name + ") of rank 0: " + std::strerror(errno));
        void* p = ::mmap(nullptr, shared_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) throw Error(where() + ": mmap(" + name + "): " + std::strerror(errno));
        shared_ = static_cast<Shared*>(p);
      }
      if (q == static_cast<size_t>(rank)) continue;
      if (pids_[q] == ::getpid()) {
        throw Error(where() + ": rank " + std::to_string(q) +
                    " runs in this process; CUDA IPC needs one process per rank");
      }
      cudaIpcMemHandle_t peer_mem;
      if (!from_hex(f[kStaging], 0, &peer_mem, sizeof peer_mem)) {
        throw Error(where() + ": malformed staging handle from rank " + std::to_string(q));
      }
      cuda_check(cudaIpcOpenMemHandle(&peer_staging_[q], peer_mem, cudaIpcMemLazyEnablePeerAccess),
                 where() + ": cudaIpcOpenMemHandle (staging of rank " + std::to_string(q) +
                     " on device " + f[kDevice] + ")");
      for (size_t s = 0; s < slots; ++s) {
        // Rank q's events for the channels with me: its ready events for q -> me (I wait on them
        // as receiver), its consumed events for me -> q (I wait on them as sender).
        const size_t idx = static_cast<size_t>(rank) * slots + s;
        cudaIpcEventHandle_t h;
        if (!from_hex(f[kReady], idx * 2 * sizeof h, &h, sizeof h)) {
          throw Error(where() + ": malformed event handle from rank " + std::to_string(q));
        }
        cuda_check(cudaIpcOpenEventHandle(&ready_peer_[q * slots + s], h),
                   where() + ": cudaIpcOpenEventHandle (rank " + std::to_string(q) + ")");
        if (!from_hex(f[kConsumed], idx * 2 * sizeof h, &h, sizeof h)) {
          throw Error(where() + ": malformed event handle from rank " + std::to_string(q));
        }
        cuda_check(cudaIpcOpenEventHandle(&consumed_peer_[q * slots + s], h),
                   where() + ": cudaIpcOpenEventHandle (rank " + std::to_string(q) + ")");
      }
    }
    // Everyone has mapped the shared segment: its name can go (nothing stays in /dev/shm).
    exchange_all(rdv, key_prefix + "/cuda_ipc_opened", rank, size, "1", timeout, "cuda-ipc setup");
    if (rank == 0) {
      ::shm_unlink(shm_name.c_str());
      shm_name.clear();
    }
  } catch (...) {
    if (!shm_name.empty()) ::shm_unlink(shm_name.c_str());  // rank 0, before everyone opened it
    cleanup();
    cudaSetDevice(previous);
    throw;
  }
  sent_pieces_.assign(n, 0);
  received_pieces_.assign(n, 0);
  cudaSetDevice(previous);
}

void CudaIpcP2P::cleanup() noexcept {
  int previous = 0;
  const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(device_);
  for (void* p : peer_staging_) {
    if (p != nullptr) cudaIpcCloseMemHandle(p);
  }
  peer_staging_.clear();
  for (auto* v : {&ready_mine_, &consumed_mine_, &ready_peer_, &consumed_peer_}) {
    for (cudaEvent_t e : *v) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    v->clear();
  }
  if (staging_ != nullptr) cudaFree(staging_);
  staging_ = nullptr;
  if (shared_ != nullptr) ::munmap(shared_, shared_bytes_);
  shared_ = nullptr;
  if (have_previous) cudaSetDevice(previous);
}

CudaIpcP2P::~CudaIpcP2P() { cleanup(); }

void CudaIpcP2P::group_start() {
  if (auto reason = async_error()) throw Error(where() + ": aborted: " + *reason);
  if (in_group_) throw Error(where() + ": group_start inside a group");
  group_.clear();
  in_group_ = true;
}

void CudaIpcP2P::send(const void* buf, size_t bytes, int peer, cudaStream_t stream) {
  if (!in_group_) throw Error(where() + ": send outside group_start/group_end");
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw Error(where() + ": send to invalid peer " + std::to_string(peer));
  }
  group_.push_back(Op{true, peer, static_cast<uint8_t*>(const_cast<void*>(buf)), bytes, 0, stream});
}

void CudaIpcP2P::recv(void* buf, size_t bytes, int peer, cudaStream_t stream) {
  if (!in_group_) throw Error(where() + ": recv outside group_start/group_end");
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw Error(where() + ": recv from invalid peer " + std::to_string(peer));
  }
  group_.push_back(Op{false, peer, static_cast<uint8_t*>(buf), bytes, 0, stream});
}

bool CudaIpcP2P::progress(Op& op) {
  const size_t slots = static_cast<size_t>(opt_.slots);
  const size_t q = static_cast<size_t>(op.peer);
  const size_t me = static_cast<size_t>(rank_);
  const size_t len = std::min(opt_.slot_bytes, op.bytes - op.done);
  if (op.is_send) {
    Channel& ch = channels(shared_)[me * size_ + q];
    const uint64_t k = sent_pieces_[q];
    const size_t slot = k % slots;
    if (k >= slots) {
      if (ch.consumed.load(std::memory_order_acquire) < k - slots + 1) return false;
      cuda_check(cudaStreamWaitEvent(op.stream, consumed_peer_[q * slots + slot], 0),
                 where() + ": cudaStreamWaitEvent (slot free at rank " + std::to_string(q) + ")");
    }
    auto* dst = static_cast<uint8_t*>(peer_staging_[q]) + (me * slots + slot) * opt_.slot_bytes;
    cuda_check(cudaMemcpyAsync(dst, op.buf + op.done, len, cudaMemcpyDeviceToDevice, op.stream),
               where() + ": cudaMemcpyAsync to rank " + std::to_string(q));
    cuda_check(cudaEventRecord(ready_mine_[q * slots + slot], op.stream),
               where() + ": cudaEventRecord (ready)");
    ch.ready.store(k + 1, std::memory_order_release);
    sent_pieces_[q] = k + 1;
  } else {
    Channel& ch = channels(shared_)[q * size_ + me];
    const uint64_t k = received_pieces_[q];
    const size_t slot = k % slots;
    if (ch.ready.load(std::memory_order_acquire) < k + 1) return false;
    cuda_check(cudaStreamWaitEvent(op.stream, ready_peer_[q * slots + slot], 0),
               where() + ": cudaStreamWaitEvent (data from rank " + std::to_string(q) + ")");
    const auto* src = static_cast<const uint8_t*>(staging_) + (q * slots + slot) * opt_.slot_bytes;
    cuda_check(cudaMemcpyAsync(op.buf + op.done, src, len, cudaMemcpyDeviceToDevice, op.stream),
               where() + ": cudaMemcpyAsync from staging of rank " + std::to_string(q));
    cuda_check(cudaEventRecord(consumed_mine_[q * slots + slot], op.stream),
               where() + ": cudaEventRecord (consumed)");
    ch.consumed.store(k + 1, std::memory_order_release);
    received_pieces_[q] = k + 1;
  }
  op.done += len;
  return true;
}

void CudaIpcP2P::group_end(std::chrono::milliseconds timeout) {
  if (!in_group_) throw Error(where() + ": group_end without group_start");
  in_group_ = false;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto last_health_check = start;
  int idle_rounds = 0;
  int previous = 0;
  cuda_check(cudaGetDevice(&previous), where() + ": cudaGetDevice");
  if (previous != device_) cuda_check(cudaSetDevice(device_), where() + ": cudaSetDevice");
  try {
    while (true) {
      bool moved = false;
      bool all_done = true;
      for (size_t i = 0; i < group_.size(); ++i) {
        Op& op = group_[i];
        if (op.done == op.bytes) continue;
        all_done = false;
        // FIFO per (direction, peer): only the first unfinished op of the pair progresses.
        bool earlier = false;
        for (size_t j = 0; j < i && !earlier; ++j) {
          const Op& o = group_[j];
          earlier = o.is_send == op.is_send && o.peer == op.peer && o.done != o.bytes;
        }
        if (!earlier) moved |= progress(op);
      }
      if (all_done) break;
      if (moved) {
        idle_rounds = 0;
        continue;
      }
      if (auto reason = async_error()) throw Error(where() + ": aborted: " + *reason);
      const auto now = Clock::now();
      if (now - last_health_check >= std::chrono::milliseconds(100)) {
        last_health_check = now;
        for (const Op& op : group_) {
          if (op.done != op.bytes && pid_dead(pids_[op.peer])) {
            throw TimeoutError(where() + ": rank " + std::to_string(op.peer) +
                               " has died (process gone)");
          }
        }
      }
      if (now >= deadline) {
        std::ostringstream m;
        m << where() << ": timed out after " << timeout.count() / 1000.0 << " s waiting for rank";
        for (const Op& op : group_) {
          if (op.done != op.bytes) m << " " << op.peer << (op.is_send ? " (send)" : " (recv)");
        }
        throw TimeoutError(m.str());
      }
      // Peers answer within microseconds when they are in their own group_end: spin, then yield,
      // then sleep briefly.
      ++idle_rounds;
      if (idle_rounds > 2000) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else if (idle_rounds > 200) {
        std::this_thread::yield();
      }
    }
  } catch (const Error& e) {
    abort(e.what());
    if (previous != device_) cudaSetDevice(previous);
    throw;
  }
  group_.clear();
  if (previous != device_) cudaSetDevice(previous);
}

std::optional<std::string> CudaIpcP2P::async_error() {
  if (shared_ == nullptr) return std::string("cuda-ipc p2p is not set up");
  if (shared_->abort_state.load(std::memory_order_acquire) == 0) return std::nullopt;
  // A writer publishes the reason right after taking the flag.
  for (int i = 0; i < 100000 && shared_->abort_state.load(std::memory_order_acquire) != 2; ++i) {
    std::this_thread::yield();
  }
  if (shared_->abort_state.load(std::memory_order_acquire) != 2) return std::string("aborted");
  return std::string(shared_->reason, strnlen(shared_->reason, sizeof shared_->reason));
}

void CudaIpcP2P::abort(const std::string& reason) {
  if (shared_ == nullptr) return;
  uint32_t expected = 0;
  if (!shared_->abort_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  const size_t len = std::min(reason.size(), sizeof shared_->reason - 1);
  std::memcpy(shared_->reason, reason.data(), len);
  shared_->reason[len] = '\0';
  shared_->abort_state.store(2, std::memory_order_release);
}

}  // namespace stragg::gpu
