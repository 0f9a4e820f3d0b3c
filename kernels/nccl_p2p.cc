#include "kernels/nccl_p2p.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "kernels/cuda_check.h"

namespace stragg::gpu {
namespace {

using Clock = std::chrono::steady_clock;

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

bool from_hex(const std::string& s, void* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

void sleep_backoff(std::chrono::microseconds& d) {
  std::this_thread::sleep_for(d);
  d = std::min(d * 2, std::chrono::microseconds(1000));
}

}  // namespace

std::string NcclP2P::where() const {
  return "stragg: rank " + std::to_string(rank_) + ": nccl p2p";
}

void NcclP2P::fail(const std::string& what, ncclResult_t rc) {
  std::string msg = where() + ": " + what + ": " + ncclGetErrorString(rc);
  if (comm_ != nullptr) {
    const char* last = ncclGetLastError(comm_);
    if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  }
  abort(msg);
  throw Error(msg);
}

NcclP2P::NcclP2P(Rendezvous& rdv, const std::string& key_prefix, int rank, int size, int device,
                 std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), device_(device) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(where() + ": invalid rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  const std::string key = key_prefix + "/nccl_unique_id";
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) {
      throw Error(where() + ": ncclGetUniqueId: " + ncclGetErrorString(rc));
    }
    rdv.set(key, to_hex(&id, sizeof id));
  } else {
    const auto value = rdv.get(key, timeout);
    if (!value) {
      std::ostringstream m;
      m << where() << ": setup timed out after " << timeout.count() / 1000.0
        << " s: rank 0 did not publish the NCCL unique id (" << key << ")";
      throw TimeoutError(m.str());
    }
    if (!from_hex(*value, &id, sizeof id)) {
      throw Error(where() + ": malformed NCCL unique id under " + key);
    }
  }

  int previous = 0;
  cuda_check(cudaGetDevice(&previous), where() + ": cudaGetDevice");
  cuda_check(cudaSetDevice(device), where() + ": cudaSetDevice(" + std::to_string(device) + ")");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns; progress is polled below with a deadline
  const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
  cudaSetDevice(previous);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw Error(where() + ": ncclCommInitRankConfig: " + ncclGetErrorString(rc));
  }
  wait_ready("ncclCommInitRankConfig (" + std::to_string(size) + " ranks)", timeout);
}

NcclP2P::~NcclP2P() {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr) return;
  // Flush and destroy; a communicator that does not finalise in time (a dead peer) is aborted.
  const ncclResult_t frc = ncclCommFinalize(comm_);
  ncclResult_t state = (frc == ncclSuccess || frc == ncclInProgress) ? ncclInProgress : frc;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  auto d = std::chrono::microseconds(10);
  while (state == ncclInProgress && Clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    if (state == ncclInProgress) sleep_backoff(d);
  }
  if (state == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

void NcclP2P::wait_ready(const std::string& what, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto d = std::chrono::microseconds(1);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) throw Error(where() + ": " + what + ": aborted: " + reason_);
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) fail(what + ": ncclCommGetAsyncError", rc);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail(what, state);
    if (Clock::now() >= deadline) {
      std::ostringstream m;
      m << where() << ": " << what << " timed out after " << timeout.count() / 1000.0
        << " s (a peer did not take part; the communicator is aborted)";
      abort(m.str());
      throw TimeoutError(m.str());
    }
    sleep_backoff(d);
  }
}

void NcclP2P::group_start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) throw Error(where() + ": aborted: " + reason_);
  }
  const ncclResult_t rc = ncclGroupStart();
  if (rc != ncclSuccess) fail("ncclGroupStart", rc);
  in_group_ = true;
}

void NcclP2P::send(const void* buf, size_t bytes, int peer, cudaStream_t stream) {
  const ncclResult_t rc = ncclSend(buf, bytes, ncclUint8, peer, comm_, stream);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (in_group_) ncclGroupEnd();
    in_group_ = false;
    fail("ncclSend of " + std::to_string(bytes) + " bytes to rank " + std::to_string(peer), rc);
  }
}

void NcclP2P::recv(void* buf, size_t bytes, int peer, cudaStream_t stream) {
  const ncclResult_t rc = ncclRecv(buf, bytes, ncclUint8, peer, comm_, stream);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (in_group_) ncclGroupEnd();
    in_group_ = false;
    fail("ncclRecv of " + std::to_string(bytes) + " bytes from rank " + std::to_string(peer), rc);
  }
}

void NcclP2P::group_end(std::chrono::milliseconds timeout) {
  in_group_ = false;
  const ncclResult_t rc = ncclGroupEnd();
  if (rc != ncclSuccess && rc != ncclInProgress) fail("ncclGroupEnd", rc);
  // Non-blocking communicator: the group may still be connecting to its peers.
  if (rc == ncclInProgress) wait_ready("ncclGroupEnd", timeout);
}

std::optional<std::string> NcclP2P::async_error() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return reason_;
  if (comm_ == nullptr) return std::nullopt;
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return where() + ": ncclCommGetAsyncError failed";
  if (state == ncclSuccess || state == ncclInProgress) return std::nullopt;
  std::string msg = where() + ": asynchronous NCCL error: " + ncclGetErrorString(state);
  const char* last = ncclGetLastError(comm_);
  if (last != nullptr && last[0] != '\0') msg += std::string(" (") + last + ")";
  return msg;
}

void NcclP2P::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  reason_ = reason;
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);  // also releases kernels of this communicator stuck on a dead peer
    comm_ = nullptr;
  }
}

}  // namespace stragg::gpu
