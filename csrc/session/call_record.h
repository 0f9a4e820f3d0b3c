// One all_reduce as this rank saw it (no torch here): what stragg.recent_calls() returns, what
// STRAGG_DEBUG=DETAIL logs, and what the profiler learns from.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/algorithm.h"

namespace stragg {

struct CallRecord {
  uint64_t seq = 0;       // the user's call number on this group (0, 1, ...)
  int64_t numel = 0;
  int64_t bytes = 0;
  uint64_t wire_seq = 0;  // the collective's sequence number on the wire (internal ones count too)
  std::string algorithm;  // what ran: "ring", "stragglar", ... ("gloo" when delegated)
  // What ran with its parameters: "stragglar(2)", "optcc(3=2,k=16)", "ring" (the key "plan" of
  // stragg.recent_calls).
  std::string schedule_name;
  int straggler = -1;     // configured or agreed straggler of this call, -1 = none
  double queued_s = 0;    // from the call to the worker starting it
  double agreement_s = 0; // dynamic straggler agreement
  double run_s = 0;       // executing the schedule
  double wait_s = 0;      // of run_s, blocked waiting for peers
  double pre_arrival_s = 0;  // of run_s, in pre-arrival steps
  double window_s = 0;       // dynamic straggler: the wait-or-proceed window used
  // The cost model's time for the choice from the last rank's arrival, without measured
  // corrections (0: not predicted).
  double predicted_s = 0;
  Algorithm plan_algorithm = Algorithm::Auto;  // the plan's family (Auto: no schedule, one-shot)
  bool plan_by_host = false;
  // When this rank's run ended (unset: not run on the executor). The profiler times the job's
  // steps from it, so that it reads no clock of its own on every call.
  std::chrono::steady_clock::time_point run_end{};
  bool ok = true;
};

}  // namespace stragg
