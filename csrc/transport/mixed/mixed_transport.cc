#include "transport/mixed/mixed_transport.h"

#include <sched.h>

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "transport/common.h"
#include "transport/mixed/peer_stats.h"
#include "transport/mixed/wait_bridge.h"

namespace stragg {
namespace {

using transport::rank_prefix;

// Longest sleep on one sub-transport when the helper thread failed and waits alternate.
constexpr auto kFallbackSlice = std::chrono::milliseconds(1);

// Forwards to the executor's sink and remembers whether it threw: the sink's errors name global
// ranks already and pass unchanged, the shm transport's own errors get translated.
class TrackingSink final : public RecvSink {
 public:
  explicit TrackingSink(RecvSink* inner) : inner_(inner) {}
  void on_header(const MessageHeader& header) override {
    threw = true;
    inner_->on_header(header);
    threw = false;
  }
  void on_data(size_t offset, const void* data, size_t len) override {
    threw = true;
    inner_->on_data(offset, data, len);
    threw = false;
  }
  bool threw = false;

 private:
  RecvSink* inner_;
};

// Shows an op to the shm sub-transport with the peer's local rank (and a receive's sink
// wrapped) while alive; restores it however the scope is left.
class LocalView {
 public:
  LocalView(SendOp& op, int local) : peer_(op.peer), slot_(op.peer) { op.peer = local; }
  LocalView(RecvOp& op, int local, TrackingSink* sink)
      : peer_(op.peer), slot_(op.peer), sink_slot_(&op.sink), sink_(op.sink) {
    op.peer = local;
    op.sink = sink;
  }
  ~LocalView() {
    slot_ = peer_;
    if (sink_slot_) *sink_slot_ = sink_;
  }
  LocalView(const LocalView&) = delete;
  LocalView& operator=(const LocalView&) = delete;

 private:
  int peer_;
  int& slot_;
  RecvSink** sink_slot_ = nullptr;
  RecvSink* sink_ = nullptr;
};

// "local rank 0 is rank 2, local rank 1 is rank 3".
std::string local_numbering(const HostLayout& layout, int rank) {
  const std::vector<int>& ranks = layout.ranks_on(layout.host_of(rank));
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += (i ? ", local rank " : "local rank ") + std::to_string(i) + " is rank " +
           std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

std::string shm_error_in_group_terms(const std::string& what, const HostLayout& layout, int rank,
                                     int peer) {
  std::string rest = what;
  const std::string local_prefix = rank_prefix(layout.local_rank_of(rank));
  if (rest.compare(0, local_prefix.size(), local_prefix) == 0) rest.erase(0, local_prefix.size());
  std::string m = rank_prefix(rank) + "shared memory";
  if (peer >= 0) m += " with rank " + std::to_string(peer);
  return m + ": " + rest + " (ranks in this message are numbered within this host's " +
         "shared-memory sub-group: " + local_numbering(layout, rank) + ")";
}

// ------------------------------------------------------------------------------------------------
// Setup

MixedTransport::MixedTransport(Rendezvous& rdv, const std::string& key_prefix, int rank,
                               const std::vector<std::string>& hosts, const MixedOptions& options)
    : GroupTransport("mixed", rank, static_cast<int>(hosts.size())), layout_(hosts) {
  // TCP first: its setup spans every rank, so a rank that never joins is named by its global
  // rank there; the shm sub-group then only meets ranks that are known to be up.
  tcp_ = std::make_unique<TcpTransport>(rdv, key_prefix + "/tcp", rank_, size_, options.tcp);
  const int host = layout_.host_of(rank_);
  const std::vector<int>& local = layout_.ranks_on(host);
  if (local.size() > 1) {
    try {
      shm_ = std::make_unique<ShmTransport>(rdv, key_prefix + "/shm/h" + std::to_string(host),
                                            layout_.local_rank_of(rank_),
                                            static_cast<int>(local.size()), options.shm);
    } catch (const Error& e) {
      rethrow_shm_error(e, -1);
    }
  }
  if (shm_) bridge_ = std::make_unique<WaitBridge>(*shm_, *tcp_);
}

MixedTransport::~MixedTransport() = default;  // bridge_ first: its thread uses shm_ and tcp_

const char* MixedTransport::peer_transport(int peer) const {
  return is_local(peer) ? "shm" : "tcp";
}

uint64_t MixedTransport::relayed_wakeups() const { return bridge_ ? bridge_->relayed() : 0; }

uint64_t MixedTransport::helper_handbacks() const { return bridge_ ? bridge_->handbacks() : 0; }

int MixedTransport::helper_thread_id() const { return bridge_ ? bridge_->thread_id() : 0; }

TransportStats MixedTransport::stats() const {
  TransportStats s;
  add_peer_transport_stats(rank_, size_, [this](int q) { return is_local(q); }, s);
  s["host_index"] = layout_.host_of(rank_);
  s["hosts"] = layout_.num_hosts();
  s["relayed_wakeups"] = static_cast<int64_t>(relayed_wakeups());
  s["helper_handbacks"] = static_cast<int64_t>(helper_handbacks());
  // The TCP part's own counters (staging, retransmit buffer, re-dials); not its peer counts.
  for (const auto& [key, value] : tcp_->stats()) {
    if (key.rfind("tcp_", 0) == 0 && key != "tcp_peers") s[key] = value;
  }
  return s;
}

// Rethrows an error of the shm sub-transport naming ranks globally; keeps TimeoutError a
// TimeoutError.
void MixedTransport::rethrow_shm_error(const Error& e, int peer) const {
  const std::string m = shm_error_in_group_terms(e.what(), layout_, rank_, peer);
  if (dynamic_cast<const TimeoutError*>(&e) != nullptr) throw TimeoutError(m);
  throw Error(m);
}

// ------------------------------------------------------------------------------------------------
// Messages

template <class Op>
bool MixedTransport::progress_remote(Op& op) {
  if (bridge_) bridge_->release_tcp();  // TCP's data plane is single-threaded
  const bool moved = tcp_->progress(op);
  if (!op.done) tcp_pending_ = true;
  if (moved) polling_ = false;
  return moved;
}

bool MixedTransport::progress(SendOp& op) {
  if (op.done) return false;
  check_peer(op.peer, "send");
  return is_local(op.peer) ? progress_local(op) : progress_remote(op);
}

bool MixedTransport::progress(RecvOp& op) {
  if (op.done) return false;
  check_peer(op.peer, "receive");
  return is_local(op.peer) ? progress_local(op) : progress_remote(op);
}

bool MixedTransport::progress_local(SendOp& op) {
  const int peer = op.peer;
  bool moved = false;
  try {
    LocalView view(op, layout_.local_rank_of(peer));
    moved = shm_->progress(op);
  } catch (const Error& e) {
    rethrow_shm_error(e, peer);
  }
  if (!op.done) shm_pending_ = true;
  if (moved) polling_ = false;
  return moved;
}

bool MixedTransport::progress_local(RecvOp& op) {
  const int peer = op.peer;
  TrackingSink sink(op.sink);
  bool moved = false;
  try {
    LocalView view(op, layout_.local_rank_of(peer), &sink);
    moved = shm_->progress(op);
  } catch (const Error& e) {
    if (sink.threw) throw;
    rethrow_shm_error(e, peer);
  }
  if (!op.done) shm_pending_ = true;
  if (moved) polling_ = false;
  return moved;
}

bool MixedTransport::supports_recv_limit() const {
  return (!shm_ || shm_->supports_recv_limit()) && tcp_->supports_recv_limit();
}

// ------------------------------------------------------------------------------------------------
// Waiting

uint64_t MixedTransport::activity_token() {
  if (!shm_) return tcp_->activity_token();
  const uint64_t tcp = static_cast<uint32_t>(tcp_->activity_token());
  return (tcp << 32) | static_cast<uint32_t>(shm_->activity_token());
}

// The TCP count whose low 32 bits are `low` and that is not newer than the count now.
uint64_t MixedTransport::widen_tcp_token(uint32_t low) const {
  const uint64_t now = tcp_->activity_token();
  uint64_t t = (now & ~uint64_t{0xffffffff}) | low;
  if (t > now) t -= uint64_t{1} << 32;
  return t;
}

void MixedTransport::wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) {
  const bool tcp_ops = std::exchange(tcp_pending_, false);
  const bool shm_ops = std::exchange(shm_pending_, false);
  if (!shm_) {
    tcp_->wait_for_activity(token, max_wait);
    return;
  }
  const uint32_t shm_token = static_cast<uint32_t>(token);
  const uint64_t tcp_token = widen_tcp_token(static_cast<uint32_t>(token >> 32));
  if (static_cast<uint32_t>(shm_->activity_token()) != shm_token ||
      tcp_->activity_token() != tcp_token) {
    return;
  }
  if (bridge_->failed()) {
    wait_without_bridge(shm_token, tcp_token, tcp_ops, max_wait);
    return;
  }
  const std::chrono::microseconds window = busy_window_left();
  if (!tcp_ops) {
    if (window.count() > 0) {  // as in a shm group: spin and yield, no helper yet
      shm_->wait_for_activity(shm_token, std::min(window, max_wait));
      return;
    }
    bridge_->watch_tcp(tcp_token);
    shm_->wait_for_activity(shm_token, max_wait);
    return;
  }
  bridge_->release_tcp();
  if (shm_ops && window.count() > 0) {  // poll both without sleeping; the caller progresses
    if (window < shm_yield_window()) sched_yield();
    tcp_->wait_for_activity(tcp_token, std::chrono::microseconds(0));
    return;
  }
  if (shm_ops) bridge_->watch_shm(shm_token);
  tcp_->wait_for_activity(tcp_token, max_wait);
  if (shm_ops) bridge_->end_watch_shm();
}

// Waits with shm ops start like a shm group's: for spin_us + yield_us after the last op moved
// they do not sleep (the shm wait spins, then yields; a wait for TCP and shm ops at once polls
// TCP without sleeping and returns, so the caller progresses the ops again). A peer that
// answers within that window is seen without the helper (whose relay costs two thread
// wake-ups); only longer waits engage it. Returns what is left of the window (0: over).
std::chrono::microseconds MixedTransport::busy_window_left() {
  const auto now = std::chrono::steady_clock::now();
  const ShmOptions& o = shm_->options();
  if (!polling_) {
    polling_ = true;
    poll_start_ = now;
  }
  const auto left = poll_start_ + std::chrono::microseconds(o.spin_us + o.yield_us) - now;
  return std::max(std::chrono::microseconds(0),
                  std::chrono::duration_cast<std::chrono::microseconds>(left));
}

// The yield part of the window (spin_us first, then yield_us).
std::chrono::microseconds MixedTransport::shm_yield_window() const {
  return std::chrono::microseconds(shm_->options().yield_us);
}

void MixedTransport::wait_without_bridge(uint32_t shm_token, uint64_t tcp_token, bool tcp_ops,
                                         std::chrono::microseconds max_wait) {
  const auto slice = std::min<std::chrono::microseconds>(max_wait, kFallbackSlice);
  if (tcp_ops) {
    tcp_->wait_for_activity(tcp_token, slice);
  } else {
    shm_->wait_for_activity(shm_token, slice);
  }
}

// ------------------------------------------------------------------------------------------------
// Faults and diagnostics

void MixedTransport::signal_abort(const std::string& reason) {
  // The first reason this rank knows of goes out on both, so both carry the same one.
  const std::string why = abort_reason().value_or(reason);
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!first_abort_) first_abort_ = why;
  }
  if (shm_) shm_->signal_abort(why);
  tcp_->signal_abort(why);
}

std::optional<std::string> MixedTransport::abort_reason() {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (first_abort_) return first_abort_;
  }
  std::optional<std::string> seen = shm_ ? shm_->abort_reason() : std::nullopt;
  if (!seen) seen = tcp_->abort_reason();
  if (!seen) return std::nullopt;
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (!first_abort_) first_abort_ = std::move(seen);
  return first_abort_;
}

namespace {

// Peers that `query` finds on either part (shm: this host's ranks; tcp: the group's ranks).
template <typename Query>
std::vector<int> union_of_parts(int size, const std::vector<int>* local, Query query) {
  std::vector<bool> hit(size, false);
  if (local) {
    for (int l : query(true)) hit[(*local)[l]] = true;
  }
  for (int q : query(false)) hit[q] = true;
  std::vector<int> out;
  for (int q = 0; q < size; ++q) {
    if (hit[q]) out.push_back(q);
  }
  return out;
}

}  // namespace

std::vector<int> MixedTransport::dead_peers() {
  const std::vector<int>* local = shm_ ? &layout_.ranks_on(layout_.host_of(rank_)) : nullptr;
  return union_of_parts(size_, local, [this](bool shm) {
    return shm ? shm_->dead_peers() : tcp_->dead_peers();
  });
}

std::vector<int> MixedTransport::gone_peers() {
  const std::vector<int>* local = shm_ ? &layout_.ranks_on(layout_.host_of(rank_)) : nullptr;
  return union_of_parts(size_, local, [this](bool shm) {
    return shm ? shm_->gone_peers() : tcp_->gone_peers();
  });
}

void MixedTransport::publish_progress(const Progress& progress) {
  tcp_->publish_progress(progress);
  if (!shm_) return;
  // The shm sub-group numbers its ranks 0..k-1; remote peers travel over TCP only.
  Progress local = progress;
  local.awaiting.clear();
  for (int q : progress.awaiting) {
    if (q >= 0 && q < size_ && is_local(q)) local.awaiting.push_back(layout_.local_rank_of(q));
  }
  shm_->publish_progress(local);
}

PeerStatus MixedTransport::peer_status(int peer) {
  if (peer < 0 || peer >= size_) return PeerStatus{};
  PeerStatus tcp = tcp_->peer_status(peer);
  if (!shm_ || !(peer == rank_ || is_local(peer))) return tcp;
  // A host mate: its shared-memory report is current (TCP's lags by a heartbeat) and its pid
  // tells whether it runs; the awaited remote peers come from its TCP report of the same step.
  PeerStatus local = shm_->peer_status(layout_.local_rank_of(peer));
  const std::vector<int>& mates = layout_.ranks_on(layout_.host_of(rank_));
  PeerStatus out = tcp;
  out.progress = local.progress;
  out.progress.awaiting.clear();
  for (int l : local.progress.awaiting) out.progress.awaiting.push_back(mates[l]);
  if (tcp.progress.seq == local.progress.seq && tcp.progress.step == local.progress.step) {
    for (int q : tcp.progress.awaiting) {
      if (!layout_.same_host(q, rank_)) out.progress.awaiting.push_back(q);
    }
  }
  std::vector<int>& awaiting = out.progress.awaiting;
  std::sort(awaiting.begin(), awaiting.end());
  awaiting.erase(std::unique(awaiting.begin(), awaiting.end()), awaiting.end());
  if (local.liveness != Liveness::Alive) {
    out.liveness = local.liveness;
    out.evidence = local.evidence;
  }
  return out;
}

}  // namespace stragg
