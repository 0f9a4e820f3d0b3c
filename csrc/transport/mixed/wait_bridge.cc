#include "transport/mixed/wait_bridge.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace stragg {
namespace {

// Longest single sleep of the helper: news and job changes wake it earlier; this only bounds
// the effect of a wake-up it could miss through a bug.
constexpr auto kHelperSleep = std::chrono::seconds(1);

}  // namespace

WaitBridge::WaitBridge(ShmTransport& shm, TcpTransport& tcp)
    : shm_(shm), tcp_(tcp), thread_([this] { run(); }) {}

WaitBridge::~WaitBridge() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    ++gen_;
  }
  to_helper_.notify_all();
  tcp_.wake();
  shm_.ring_own_doorbell();
  thread_.join();
}

// ------------------------------------------------------------------------------------------------
// Executor's side

void WaitBridge::watch_tcp(uint64_t tcp_token) {
  if (watching_tcp_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = Job::Tcp;
    tcp_token_ = tcp_token;
    ++gen_;
  }
  to_helper_.notify_one();
  watching_tcp_ = true;
}

void WaitBridge::release_tcp() {
  if (!watching_tcp_) return;
  watching_tcp_ = false;
  std::unique_lock<std::mutex> lock(mu_);
  job_ = Job::None;
  ++gen_;
  if (!in_tcp_) return;  // the helper never started the job (it sees job_ == None)
  handbacks_.fetch_add(1);
  tcp_.wake();
  to_executor_.wait(lock, [this] { return !in_tcp_; });
}

void WaitBridge::watch_shm(uint32_t shm_token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = Job::Shm;
    shm_token_ = shm_token;
    ++gen_;
  }
  to_helper_.notify_one();
}

void WaitBridge::end_watch_shm() {
  bool sleeping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = Job::None;
    ++gen_;
    sleeping = in_shm_;
  }
  // Wake the helper off the doorbell, so it can take the next job (a TCP watch) at once.
  if (sleeping) shm_.ring_own_doorbell();
}

// ------------------------------------------------------------------------------------------------
// Helper's side

void WaitBridge::run() {
  pthread_setname_np(pthread_self(), "stragg-bridge");
  tid_ = static_cast<int>(::syscall(SYS_gettid));
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t seen = 0;  // gen_'s initial value: a job posted before this thread ran is not missed
  try {
    while (true) {
      to_helper_.wait(lock, [&] { return stop_ || (gen_ != seen && job_ != Job::None); });
      if (stop_) return;
      seen = gen_;
      if (job_ == Job::Tcp) {
        run_tcp_job(lock);
      } else {
        run_shm_job(lock);
      }
    }
  } catch (...) {
    // Nothing here should throw; if it does, the executor falls back to alternating waits.
    if (!lock.owns_lock()) lock.lock();
    failed_ = true;
    in_tcp_ = in_shm_ = false;
    to_executor_.notify_all();
  }
}

// Entered and left with `lock` held.
void WaitBridge::run_tcp_job(std::unique_lock<std::mutex>& lock) {
  const uint64_t gen = gen_;
  uint64_t token = tcp_token_;
  in_tcp_ = true;
  lock.unlock();
  while (true) {
    tcp_.wait_for_activity(token, kHelperSleep);
    const uint64_t now = tcp_.activity_token();
    lock.lock();
    if (!current(gen)) break;
    lock.unlock();
    if (now != token) {
      shm_.ring_own_doorbell();
      relayed_.fetch_add(1);
      token = now;
    }
  }
  in_tcp_ = false;
  to_executor_.notify_all();
}

// Entered and left with `lock` held.
void WaitBridge::run_shm_job(std::unique_lock<std::mutex>& lock) {
  const uint64_t gen = gen_;
  const uint32_t token = shm_token_;
  in_shm_ = true;
  lock.unlock();
  bool rang = false;
  while (!rang) {
    shm_.sleep_for_activity(token, kHelperSleep);
    rang = static_cast<uint32_t>(shm_.activity_token()) != token;
    lock.lock();
    if (!current(gen)) break;
    if (!rang) lock.unlock();
  }
  in_shm_ = false;
  if (rang && current(gen)) {  // one wake per job: the loop in run() waits for the next one
    tcp_.wake();
    relayed_.fetch_add(1);
  }
}

}  // namespace stragg
