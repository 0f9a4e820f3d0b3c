#include "transport/shm/doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

namespace stragg::shm {
namespace {

using Clock = std::chrono::steady_clock;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds max) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(max.count() / 1000000);
  ts.tv_nsec = static_cast<long>((max.count() % 1000000) * 1000);
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

void ring(ControlBlock* cb) {
  cb->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (cb->sleeping.load(std::memory_order_seq_cst) != 0) futex_wake_all(&cb->doorbell);
}

void wait_for_ring(ControlBlock* cb, uint32_t token, std::chrono::microseconds max_wait,
                   int spin_us, int yield_us) {
  const auto start = Clock::now();
  const auto deadline = start + max_wait;
  const auto spin_end = start + std::chrono::microseconds(spin_us);
  const auto yield_end = spin_end + std::chrono::microseconds(yield_us);
  while (Clock::now() < std::min(spin_end, deadline)) {
    for (int i = 0; i < 32; ++i) {
      if (cb->doorbell.load(std::memory_order_acquire) != token) return;
      cpu_relax();
    }
  }
  while (Clock::now() < std::min(yield_end, deadline)) {
    if (cb->doorbell.load(std::memory_order_acquire) != token) return;
    sched_yield();
  }
  const auto now = Clock::now();
  if (now >= deadline) return;
  // A count, not a flag: several threads of the owner may wait at once (a composed transport's
  // helper thread next to the executor, transport/mixed), and one leaving must not hide another.
  cb->sleeping.fetch_add(1, std::memory_order_seq_cst);
  if (cb->doorbell.load(std::memory_order_seq_cst) == token) {
    futex_wait(&cb->doorbell, token,
               std::chrono::duration_cast<std::chrono::microseconds>(deadline - now));
  }
  cb->sleeping.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace stragg::shm
