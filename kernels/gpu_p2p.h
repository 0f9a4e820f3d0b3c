// Point-to-point layer of the GPU executor (no torch; no CUDA headers): moves bytes between device
// buffers of the ranks of one group, stream-ordered. Implementations: CudaIpcP2P (one node, CUDA
// IPC), NcclP2P (NCCL), HostP2P (in-process ranks on the host device, for CI), LocalP2P (a one-rank
// group: nothing to move); CudaIpcP2P and HostP2P share their protocol (staged_p2p.h).
//
// Between group_start() and group_end() the caller posts the sends and receives of one schedule
// step; group_end() enqueues them all on their streams so that they progress concurrently (no
// send waits for a receive of the same group to be posted first). Messages between one ordered
// pair of ranks are matched in FIFO order; a receive must name the same byte count as its send.
// Nothing waits for the data to move on the host: completion is stream-ordered (work enqueued
// on the stream after group_end() sees the received bytes; the send buffer may be overwritten by
// work enqueued after group_end()).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/device.h"

namespace stragg::gpu {

class GpuP2P {
 public:
  // peer_arrival() of a layer that does not track arrivals.
  static constexpr int64_t kArrivalUnknown = -2;

  virtual ~GpuP2P() = default;

  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // CUDA device this rank's buffers live on.
  virtual int device() const = 0;

  virtual void group_start() = 0;
  virtual void send(const void* buf, size_t bytes, int peer, Stream stream) = 0;
  virtual void recv(void* buf, size_t bytes, int peer, Stream stream) = 0;
  // Enqueues the group. May block the host for at most `timeout` where the layer needs its peers
  // to make host-side progress (connection setup, staging handshakes), never for GPU completion.
  // Throws stragg::Error (TimeoutError on timeout) naming the rank and the peers involved, after
  // aborting the layer.
  virtual void group_end(std::chrono::milliseconds timeout) = 0;

  // An error that happened asynchronously (a peer aborted, a NCCL failure on the GPU), if any.
  // Never blocks.
  virtual std::optional<std::string> async_error() = 0;
  // Makes the layer unusable for every rank (idempotent; the first reason wins) and releases
  // host-side waits. GPU work already enqueued may never complete afterwards.
  virtual void abort(const std::string& reason) = 0;

  // Arrivals, so that a timeout names the ranks that never called the collective: the executor
  // announces collective `op_name` #`seq` when it starts it; peer_arrival(q) is the last seq
  // rank q announced (-1: none yet), or kArrivalUnknown where the layer does not track them.
  virtual void announce_arrival(const char* op_name, uint64_t seq) {
    (void)op_name;
    (void)seq;
  }
  virtual int64_t peer_arrival(int peer) {
    (void)peer;
    return kArrivalUnknown;
  }

  // "; rank q has not called <op_name> #<seq> (its last was #k)" for every peer known not to
  // have announced collective `seq` ("" where the layer does not track arrivals).
  std::string missing_ranks(const char* op_name, uint64_t seq) {
    std::string m;
    for (int q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      const int64_t last = peer_arrival(q);
      if (last == kArrivalUnknown || last >= static_cast<int64_t>(seq)) continue;
      m +=
          "; rank " + std::to_string(q) + " has not called " + op_name + " #" + std::to_string(seq);
      if (last >= 0) m += " (its last was #" + std::to_string(last) + ")";
    }
    return m;
  }
};

}  // namespace stragg::gpu
