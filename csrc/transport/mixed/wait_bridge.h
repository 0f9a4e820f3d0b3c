// The helper thread of the mixed transport (mixed_transport.h): it lets one thread sleep on
// either sub-transport and still be woken by the other, without losing a wake-up, without
// polling, and without adding latency where only one of them matters.
//
// The two sub-transports wake their waiters differently: shared memory through a futex on this
// rank's doorbell (no file descriptor), TCP through ppoll() on its sockets and an eventfd. The
// executor's thread picks one to sleep on for each wait (MixedTransport::wait_for_activity), and
// this helper watches the other one for it:
//   - watch_tcp(): the executor sleeps on the doorbell (spin, yield, futex: exactly as in a
//     shm-only group); the helper sleeps in TCP's wait and rings the doorbell when TCP has news
//     (an abort from a remote rank, a dead peer). This job persists across waits, because the
//     executor touches no TCP data-plane state while it lasts; release_tcp() ends it before the
//     executor progresses a TCP op or waits on TCP itself, and returns once the helper is out of
//     TCP's wait (TcpTransport's progress and wait are single-threaded).
//   - watch_shm(): the executor sleeps in TCP's ppoll(); the helper sleeps on the doorbell and
//     calls TcpTransport::wake() when it rings. One job per wait, ended by end_watch_shm().
// Each job starts from the token the executor took before it polled its ops, so news that
// arrived between that poll and the helper's start wakes the sleeper at once.
//
// Threads: the executor's thread calls watch_tcp, release_tcp, watch_shm and end_watch_shm; the
// destructor stops and joins the helper. If the helper fails (it never should), failed() turns
// true and the caller falls back to short alternating waits.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace stragg {

class ShmTransport;
class TcpTransport;

class WaitBridge {
 public:
  WaitBridge(ShmTransport& shm, TcpTransport& tcp);
  ~WaitBridge();
  WaitBridge(const WaitBridge&) = delete;
  WaitBridge& operator=(const WaitBridge&) = delete;

  // The helper watches TCP from `tcp_token` on, ringing this rank's doorbell on news, until
  // release_tcp(). No-op while it already does.
  void watch_tcp(uint64_t tcp_token);
  // Ends watch_tcp(); returns once the helper is out of TCP's wait.
  void release_tcp();
  // The helper sleeps on the doorbell from `shm_token` on and wakes TCP's wait when it rings.
  void watch_shm(uint32_t shm_token);
  void end_watch_shm();

  bool failed() const { return failed_.load(); }
  // Wake-ups the helper passed on (rings of the doorbell for TCP news, TCP wakes for rings).
  uint64_t relayed() const { return relayed_.load(); }
  // Times release_tcp() waited for the helper to leave TCP's wait.
  uint64_t handbacks() const { return handbacks_.load(); }
  // The helper's kernel thread id once it runs (0 before).
  int thread_id() const { return tid_.load(); }

 private:
  enum class Job { None, Tcp, Shm };

  void run();
  void run_tcp_job(std::unique_lock<std::mutex>& lock);
  void run_shm_job(std::unique_lock<std::mutex>& lock);
  bool current(uint64_t gen) const { return gen_ == gen && !stop_; }

  ShmTransport& shm_;
  TcpTransport& tcp_;

  std::mutex mu_;
  std::condition_variable to_helper_;
  std::condition_variable to_executor_;
  Job job_ = Job::None;  // guarded by mu_, like the fields below
  uint64_t gen_ = 0;     // bumped by every new or ended job
  uint64_t tcp_token_ = 0;
  uint32_t shm_token_ = 0;
  bool in_tcp_ = false;  // the helper is inside (or about to enter) TCP's wait
  bool in_shm_ = false;  // the helper is inside (or about to enter) the doorbell wait
  bool stop_ = false;

  bool watching_tcp_ = false;  // executor's thread only
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> relayed_{0};
  std::atomic<uint64_t> handbacks_{0};
  std::atomic<int> tid_{0};
  std::thread thread_;  // last: starts once the fields above exist
};

}  // namespace stragg
