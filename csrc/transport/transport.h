// Point-to-point message transport between the ranks of one group (no torch here).
//
// The executor drives a Transport with non-blocking progress calls: it posts the sends and
// receives of one schedule step as SendOp/RecvOp objects, calls progress() on them until they are
// done, and calls wait_for_activity() when nothing moved. This fits a shared-memory transport
// (shm_transport.h), TCP sockets (poll), and later NCCL / CUDA-IPC.
//
// Messages between one ordered pair of ranks are delivered in FIFO order. Each message is a
// fixed-size header (checked by the receiver before any payload is accepted, so mismatched
// collectives are caught instead of producing garbage) plus payload bytes, streamed through
// bounded staging memory in pieces.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace stragg {

// Copied verbatim from sender to receiver; the executor defines the meaning of the fields.
struct MessageHeader {
  uint64_t coll_seq = 0;       // collective sequence number within the group
  uint64_t payload_bytes = 0;  // bytes that follow this header
  uint64_t numel = 0;          // elements in the whole collective buffer (for mismatch checks)
  uint32_t step = 0;           // schedule step that sent it
  uint32_t sender = 0;         // sending rank
  uint8_t dtype = 0;           // stragg::DType
  uint8_t op = 0;              // stragg::ReduceOp
  uint8_t algo = 0;            // executor-defined algorithm id
  uint8_t kind = 0;            // executor-defined message kind
  uint32_t reserved0 = 0;
  uint64_t reserved[3] = {0, 0, 0};
};
static_assert(sizeof(MessageHeader) == 64, "MessageHeader is one cache line");

// Receives one message. The transport calls on_header() once, then on_data() with consecutive
// pieces of exactly header.payload_bytes bytes in total (possibly zero pieces).
class RecvSink {
 public:
  virtual ~RecvSink() = default;
  // Throws stragg::Error to reject the message (e.g. the peer runs a different collective).
  virtual void on_header(const MessageHeader& header) = 0;
  virtual void on_data(size_t offset, const void* data, size_t len) = 0;
};

struct SendOp {
  int peer = -1;
  MessageHeader header;
  const void* data = nullptr;
  // Progress state, owned by the transport.
  size_t sent = 0;
  bool started = false;
  bool done = false;
};

struct RecvOp {
  int peer = -1;
  RecvSink* sink = nullptr;
  // Payload bytes the transport may hand to the sink so far (transports that support it, see
  // Transport::supports_recv_limit): the executor raises it as a send of the same step that
  // reads the same range progresses, so received data never overwrites bytes not yet sent.
  size_t limit = static_cast<size_t>(-1);
  // Progress state, owned by the transport.
  size_t received = 0;
  size_t expected = 0;
  bool header_seen = false;
  bool done = false;
};

// Shared arrival order of the ranks for one collective, used to agree on a straggler without a
// coordinator (StragglAR with "whichever rank arrives last"). Positions are handed out in
// arrival order; a decision register is written once per collective (first writer wins), so
// every rank reads the same decision.
class ArrivalBoard {
 public:
  virtual ~ArrivalBoard() = default;
  // Takes this rank's arrival ticket for collective `seq` (once per collective, every collective
  // of the group); returns its arrival position 0..n-1. Wakes waiting peers.
  virtual int arrive(uint64_t seq) = 0;
  // The rank missing from the first n-1 arrivals of `seq`, or -1 while fewer than n-1 arrived.
  virtual int missing_rank(uint64_t seq) = 0;
  // Proposes a decision for `seq` (-1: no straggler, else the straggler's rank) and returns the
  // decision that won (possibly another rank's earlier proposal).
  virtual int decide(uint64_t seq, int proposal) = 0;
  // The decision for `seq` if one was made.
  virtual std::optional<int> decision(uint64_t seq) = 0;
  // Longest a waiter may sleep between polls. Boards whose updates wake the transport's waiters
  // (shared memory) keep the default; boards that wake nobody (a remote store) poll faster.
  virtual std::chrono::microseconds poll_interval() const {
    return std::chrono::microseconds(100000);
  }
};

// The one-shot all_reduce of small calls (Executor::run_oneshot): every rank puts its input in a
// buffer all ranks read directly (shared memory), then each reduces all n inputs itself, in rank
// order. One synchronisation per call instead of log2(n) rounds of messages. A rank's calls are
// numbered 0, 1, 2, ... (the `index`); call #index uses buffer index % 2, so a rank may rewrite
// it for #index + 2 only after every peer has read it: it has, since the rank finished
// #index + 1, which needed every peer's input for #index + 1, published after its reads of #index.
struct OneshotHeader {
  uint64_t seq = 0;    // the collective's wire sequence number
  uint64_t numel = 0;  // elements of the input
  uint8_t dtype = 0;   // stragg::DType
  uint8_t op = 0;      // stragg::ReduceOp
  uint8_t reserved[6] = {0, 0, 0, 0, 0, 0};
};

class OneshotArea {
 public:
  virtual ~OneshotArea() = default;
  // Bytes one rank's input may have.
  virtual size_t capacity() const = 0;
  // This rank's buffer for call #index (capacity() bytes).
  virtual void* own_buffer(uint64_t index) = 0;
  // Makes this rank's input for #index visible to every peer (release) and wakes them.
  virtual void publish(uint64_t index, const OneshotHeader& header) = 0;
  // The header `peer` published for #index (acquire: its buffer is readable then), or nullptr
  // while it has not published it.
  virtual const OneshotHeader* published(int peer, uint64_t index) = 0;
  virtual const void* peer_buffer(int peer, uint64_t index) = 0;
};

// Where a rank is, as it publishes it for its peers (Transport::publish_progress). A rank that
// times out reads every peer's Progress to find the rank or link that stopped the group, instead
// of naming whichever peer it happened to wait for.
struct Progress {
  static constexpr int32_t kStarting = -1;  // began the collective, in no step yet (e.g. agreeing)
  static constexpr int32_t kFinished = -2;  // finished the collective
  int64_t seq = -1;           // wire sequence number of the collective it is in or last began
  int64_t call = -1;          // that collective's number as the user counts it (-1: unknown)
  int32_t step = kStarting;   // step index inside it, or kStarting / kFinished
  std::vector<int> awaiting;  // peers it waits for (sends or receives not done), sorted
};

// What a rank can tell about a peer's process and the path to it.
enum class Liveness : uint8_t {
  Alive,        // shows signs of life (or the transport cannot tell otherwise)
  Stopped,      // its process does not run (SIGSTOP, a debugger) or nothing came from it for long
  Unreachable,  // alive (other ranks hear from it) but this rank does not: the link between is down
  Dead,         // its process or connection is gone and nothing more can arrive from it
};

struct PeerStatus {
  Progress progress;  // the peer's last published progress (seq -1: none seen yet)
  Liveness liveness = Liveness::Alive;
  std::string evidence;          // why Stopped / Unreachable, e.g. "no heartbeat for 5.1 s"
  std::vector<int> cannot_hear;  // peers this peer reported it does not hear (a link down)
};

// Named counters a transport reports for backend_stats (Session::stats): its buffer sizes and
// what carries messages to each peer (transport/mixed/peer_stats.h). The names are the keys
// Python's backend_stats shows.
using TransportStats = std::map<std::string, int64_t>;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Advance an op as far as possible without blocking. Returns true if anything moved.
  // May throw stragg::Error (e.g. from RecvSink::on_header).
  virtual bool progress(SendOp& op) = 0;
  virtual bool progress(RecvOp& op) = 0;

  // Event count: take a token BEFORE polling the ops; if nothing moved, wait_for_activity(token)
  // blocks until something may have changed for this rank since the token was taken (data
  // arrived, staging space freed, abort signalled) or until max_wait elapsed. It returns at once
  // if something already changed, so no wake-up between the poll and the wait is lost.
  // Spurious returns are allowed.
  virtual uint64_t activity_token() = 0;
  virtual void wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) = 0;

  // Fault handling. signal_abort() tells every peer that this group is unusable and why
  // (idempotent; the first reason wins). abort_reason() returns the reason if any rank aborted.
  virtual void signal_abort(const std::string& reason) = 0;
  virtual std::optional<std::string> abort_reason() = 0;
  // Peers known to be dead: their process or connection is gone AND nothing they sent is left
  // to read (a rank that finished its sends and exited is not dead for a peer still reading
  // them). Empty when the transport cannot tell. Cheap: the executor asks every 100 ms.
  virtual std::vector<int> dead_peers() = 0;
  // Peers whose process or connection is gone, whether or not something they sent is still
  // unread: who can no longer take part in anything, e.g. in shrink_group's agreement. Call it
  // when no collective runs (the group was shut down or aborted).
  virtual std::vector<int> gone_peers() { return dead_peers(); }

  // Progress reports: each rank publishes where it is (cheap: the executor calls it when a
  // collective starts and ends and whenever it waits); a rank that times out reads every peer's
  // status to name the rank or link that stopped the group. peer_status(rank()) is this rank's.
  virtual void publish_progress(const Progress& progress) = 0;
  virtual PeerStatus peer_status(int peer) = 0;

  // True if some peers are reached over a network (TCP) rather than shared memory: the planner
  // then pipelines large chunks (PlannerConfig::pipeline_bytes).
  virtual bool over_network() const { return false; }

  // True if progress(RecvOp&) honours RecvOp::limit (else the executor stages such receives).
  virtual bool supports_recv_limit() const { return false; }

  // Whether the next runs' sends should finish only when their bytes are about to leave, so
  // that sends issued one after another to different peers leave in that order (a plan with
  // LoweredSchedule::ordered_sends). TCP then holds few bytes unsent per socket; shared memory
  // has nothing to do. Called between runs by the thread that runs them.
  virtual void set_paced_sends(bool /*paced*/) {}

  // Arrival board for dynamic straggler agreement, or nullptr if this transport has none.
  virtual ArrivalBoard* arrival_board() { return nullptr; }
  // Buffers for the one-shot all_reduce, or nullptr if this transport has none (every rank
  // must then be reachable through memory: shm).
  virtual OneshotArea* oneshot_area() { return nullptr; }

  // Its counters for backend_stats (see TransportStats); none unless the transport has some.
  virtual TransportStats stats() const { return {}; }
};

}  // namespace stragg
