// Point-to-point layer of the GPU executor (torch-free): moves bytes between device buffers of
// the ranks of one group, stream-ordered.
//
// Between group_start() and group_end() the caller posts the sends and receives of one schedule
// step; group_end() enqueues them all on their streams so that they progress concurrently (no
// send waits for a receive of the same group to be posted first). Messages between one ordered
// pair of ranks are matched in FIFO order; a receive must name the same byte count as its send.
// Nothing waits for the data to move on the host: completion is stream-ordered (work enqueued
// on the stream after group_end() sees the received bytes; the send buffer may be overwritten by
// work enqueued after group_end()).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

namespace stragg::gpu {

class GpuP2P {
 public:
  virtual ~GpuP2P() = default;

  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // CUDA device this rank's buffers live on.
  virtual int device() const = 0;

  virtual void group_start() = 0;
  virtual void send(const void* buf, size_t bytes, int peer, cudaStream_t stream) = 0;
  virtual void recv(void* buf, size_t bytes, int peer, cudaStream_t stream) = 0;
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
};

}  // namespace stragg::gpu
