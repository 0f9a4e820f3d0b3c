// Per-peer transport for groups where some ranks share a host and others are remote (no torch
// here): shared memory to the peers on this host, TCP to the others, one Transport for the group.
//
//   - shm: a ShmTransport among the ranks of this host only, numbered 0..k-1 in ascending global
//     rank (host_layout.h). Its rendezvous keys carry the host index
//     ("<prefix>/shm/h<index>"), so the sub-groups of different hosts never meet, even where
//     their emulated hosts share one store and one /dev/shm. Not built when this rank is alone
//     on its host.
//   - tcp: a TcpTransport over the whole group, with global rank numbers, that carries data to
//     remote peers only. Over all ranks rather than only the remote pairs because (1) every rank
//     then needs the same group and the TCP code stays as it is, (2) its control plane reaches
//     local peers too: aborts and progress reports travel both ways, and a local peer's death is
//     seen from its sockets even where its pid cannot be checked (another pid namespace). The
//     cost is two idle connections per pair of ranks on one host.
//
// Each op goes to the transport of its peer (the peer number is translated for shm while the op
// is progressed). Waiting: the executor's thread sleeps on the sub-transport whose ops it waits
// for, and a helper thread (wait_bridge.h) watches the other one:
//   - no TCP op left unfinished since the last wait (shm ops only, or nothing: agreement,
//     arrivals): wait on the shm doorbell exactly as a shm-only group does (spin, yield, futex),
//     so shm-only steps pay nothing; once the spin and yield window is over (a long wait), the
//     helper sleeps in TCP's wait meanwhile and rings the doorbell on TCP news (a remote abort
//     or death).
//   - TCP ops unfinished: sleep in TCP's ppoll(). If shm ops are unfinished too, waits first
//     only poll both for the spin and yield window (a local peer that answers at once needs no
//     relay), then the helper sleeps on the doorbell and wakes the ppoll() when it rings.
//     Without unfinished shm ops nothing is needed: a local peer's abort or death also reaches
//     us over TCP.
// The token packs this rank's doorbell (low 32 bits) and TCP's activity count (high 32 bits).
//
// Faults: signal_abort() goes out on both (with the first reason this rank knows of, so both
// carry the same one); abort_reason() keeps the first one seen; dead_peers() is the union of
// both; progress goes out on both; a host mate's status joins its shm report (current, with
// its pid's state) and its TCP report (the remote peers it awaits). There is no
// arrival board (the shm board would cover this host only): the session uses its store board.
// supports_recv_limit() holds only if both sub-transports support it.
//
// Threads: like the sub-transports, progress() / activity_token() / wait_for_activity() are
// called by one thread (the executor's); the fault and ticket calls from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/rendezvous.h"
#include "transport/group_transport.h"
#include "transport/mixed/host_layout.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace stragg {

class WaitBridge;

// An error `what` of the shm sub-group of `rank`'s host (which numbers its ranks 0..k-1) as rank
// `rank` of the whole group reports it: "stragg: rank <rank>: shared memory with rank <peer>:
// ... (ranks in this message are numbered within this host's shared-memory sub-group: local
// rank 0 is rank 2, ...)". `peer` < 0: about no peer (setup).
std::string shm_error_in_group_terms(const std::string& what, const HostLayout& layout, int rank,
                                     int peer);

struct MixedOptions {
  ShmOptions shm;
  TcpOptions tcp;
};

class MixedTransport final : public GroupTransport {
 public:
  // Collective over all ranks: `hosts[r]` is rank r's host identity (its size is the group
  // size). Builds the TCP mesh, then the shm sub-group of this host. Throws stragg::Error /
  // TimeoutError naming this rank (errors of the shm sub-group also list its rank numbering).
  MixedTransport(Rendezvous& rdv, const std::string& key_prefix, int rank,
                 const std::vector<std::string>& hosts, const MixedOptions& options);
  ~MixedTransport() override;

  const char* name() const override { return "mixed"; }
  bool over_network() const override { return true; }

  bool progress(SendOp& op) override;
  bool progress(RecvOp& op) override;
  bool supports_recv_limit() const override;
  uint64_t activity_token() override;
  void wait_for_activity(uint64_t token, std::chrono::microseconds max_wait) override;

  void signal_abort(const std::string& reason) override;
  std::optional<std::string> abort_reason() override;
  std::vector<int> dead_peers() override;
  std::vector<int> gone_peers() override;
  void publish_progress(const Progress& progress) override;
  PeerStatus peer_status(int peer) override;
  // Each peer's transport, the host counts and the helper thread's counters (peer_stats.h).
  TransportStats stats() const override;

  // "shm" or "tcp": what carries messages between this rank and `peer`.
  const char* peer_transport(int peer) const;
  const HostLayout& layout() const { return layout_; }
  // The sub-transports (shm is null when this rank is alone on its host).
  const ShmTransport* shm() const { return shm_.get(); }
  const TcpTransport& tcp() const { return *tcp_; }
  void set_paced_sends(bool paced) override { tcp_->set_paced_sends(paced); }
  // Wake-ups the helper thread passed between the sub-transports (0 without shm).
  uint64_t relayed_wakeups() const;
  // Times the executor's thread waited for the helper to leave TCP's wait (release_tcp()).
  uint64_t helper_handbacks() const;
  // The helper thread's kernel thread id once it runs (0 before, and without shm), for tests.
  int helper_thread_id() const;

 private:
  bool is_local(int peer) const { return peer != rank_ && layout_.same_host(peer, rank_); }
  bool progress_local(SendOp& op);
  bool progress_local(RecvOp& op);
  template <class Op>
  bool progress_remote(Op& op);
  [[noreturn]] void rethrow_shm_error(const Error& e, int peer) const;
  uint64_t widen_tcp_token(uint32_t low) const;
  std::chrono::microseconds busy_window_left();
  std::chrono::microseconds shm_yield_window() const;
  void wait_without_bridge(uint32_t shm_token, uint64_t tcp_token, bool tcp_ops,
                           std::chrono::microseconds max_wait);

  HostLayout layout_;
  std::unique_ptr<ShmTransport> shm_;   // this host's ranks, local numbering
  std::unique_ptr<TcpTransport> tcp_;   // every rank, global numbering
  std::unique_ptr<WaitBridge> bridge_;  // with shm only; destroyed first

  // Executor's thread: sub-transports with ops left unfinished since the last wait.
  bool shm_pending_ = false;
  bool tcp_pending_ = false;
  // Executor's thread: since when waits spin, yield or poll instead of sleeping
  // (busy_window_left()).
  bool polling_ = false;
  std::chrono::steady_clock::time_point poll_start_;

  std::mutex abort_mu_;
  std::optional<std::string> first_abort_;  // guarded by abort_mu_
};

}  // namespace stragg
