// Doorbells of the shared-memory transport. Every rank's control block holds an event count,
// its doorbell, that anyone with news for that rank bumps (data or free slots in a channel, an
// abort, an arrival). The owner waits for it to move spin -> yield -> futex sleep, which matters
// when more ranks than cores share the machine; a ring wakes the futex only when the owner said
// it sleeps.
#pragma once

#include <chrono>
#include <cstdint>

#include "transport/shm/layout.h"

namespace stragg::shm {

void ring(ControlBlock* cb);

// Returns once cb's doorbell differs from `token` (at once if it already does) or `max_wait`
// passed: busy-polls for `spin_us`, polls with sched_yield() for `yield_us`, then sleeps on the
// futex. Spurious returns are allowed. Several threads may wait on one doorbell at once.
void wait_for_ring(ControlBlock* cb, uint32_t token, std::chrono::microseconds max_wait,
                   int spin_us, int yield_us);

}  // namespace stragg::shm
