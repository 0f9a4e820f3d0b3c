// stragg's flight recorder: the entries torch's FlightRecorder would hold for stragg's collectives.
//
// torch's c10d::FlightRecorder<c10::Event> is a header template whose instance in libtorch_cpu is
// not exported (its get()::instance is a local symbol), so an extension cannot write into it: a
// FlightRecorder<c10::Event>::get() compiled here would be a second, private instance. stragg
// keeps its own ring buffer instead, sized like torch's (TORCH_FR_BUFFER_SIZE entries, off when
// unset or 0, read once per process), with entries in the schema torch's dump uses (version
// "2.10": record_id, pg_id, process_group, collective_seq_id, p2p_seq_id, op_id, profiling_name,
// time_created_ns, input/output sizes and dtypes, state, timeout_ms, is_p2p, duration_ms, ...)
// plus a "stragg" dict of what only stragg knows (its call number, the error naming the late or
// dead rank, and at dump time the plan / straggler of the call). merge_dump() adds them to a dump
// of torch's own recorder (what torch._C._distributed_c10d._dump_fr_trace returns), so torch's
// analyzer (python -m torch.distributed.flight_recorder.fr_trace) reads one file per rank.
//
// profiling_name uses the "gloo:" prefix: the analyzer accepts only the communication libraries
// it knows, and stragg's CPU collectives are Gloo-compatible ones (its delegated ones run on Gloo).
//
// With TORCH_FR_DUMP_TEMP_FILE set, the first failed collective of the process (timeout, peer
// found dead, delegated failure) writes the merged dump to ${TORCH_FR_DUMP_TEMP_FILE}<global rank>,
// as ProcessGroupNCCL does on a timeout; once per process, logged through c10 logging.
//
// Cost when off: one load of a bool per collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "session/call_record.h"

namespace stragg {

// One process group as the recorder knows it (owned by the backend and the recorder together).
struct FrGroup {
  std::string name;         // the group's name (torch's pg_name: "0", "1", ...)
  std::string desc;         // torch's group_desc ("default_pg", ...; guarded by the recorder)
  int64_t pg_id = 0;        // its number (the name when it is one)
  std::vector<int64_t> global_ranks;  // member global ranks, in group-rank order
  int64_t global_rank = -1;           // this process's global rank
  std::atomic<int64_t> collective_seq{0};
  std::atomic<int64_t> p2p_seq{0};
  std::atomic<int64_t> op_seq{0};
  // The session's recent call records (plan, straggler), read at dump time; empty once the
  // backend is gone. Guarded by the recorder's mutex.
  std::function<std::vector<CallRecord>()> recent_calls;
};

class FlightRecorder {
 public:
  // The process's recorder (never destroyed: works may complete during exit).
  static FlightRecorder& get();

  bool enabled() const noexcept { return capacity_ > 0; }

  // A new entry in state "scheduled"; returns its record id (-1 when off).
  // `desc`: the group's description as torch set it on the backend ("" keeps the known one).
  int64_t record(const std::shared_ptr<FrGroup>& group, const std::string& desc,
                 const std::string& profiling_name,
                 const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                 std::chrono::milliseconds timeout, bool is_p2p);
  // The session's call number of the entry (matches CallRecord::seq).
  void set_call_seq(int64_t id, uint64_t seq);
  // Completed (state "completed", duration_ms) or failed (stays "started", the error kept in the
  // stragg extras: the collective never completed, as torch shows a timed-out one).
  void finished(int64_t id, const std::string& error);
  // A failure of a collective of `group`: writes the dump when TORCH_FR_DUMP_TEMP_FILE is set
  // (the first failure of the process only). Never throws.
  void on_failure(const std::shared_ptr<FrGroup>& group, const std::string& why);

  void add_group(const std::shared_ptr<FrGroup>& group);
  // A new group, added: torch's pg_name `name` (its pg_id: the name when it is a number, else a
  // hash of it), this process's `rank` of `size` (global ranks 0..size-1 until the backend
  // learns the members'), `recent_calls` the session's.
  std::shared_ptr<FrGroup> add_group(const std::string& name, int rank, int size,
                                     std::function<std::vector<CallRecord>()> recent_calls);
  // The end of entry `id` of `group`: finished(), with the message of `error` if there is one
  // (then also on_failure()). Never throws.
  void finished(const std::shared_ptr<FrGroup>& group, int64_t id, std::exception_ptr error);
  // The backend is going away: stop reading its session.
  void detach_group(const std::shared_ptr<FrGroup>& group);

  // `torch_dump` (a pickle of torch's own dump, as _dump_fr_trace returns it) with stragg's
  // entries, groups and status added, pickled again. Entries of stragg's unnamed inner Gloo
  // backends are dropped (stragg records its delegated collectives under its own group).
  std::string merge_dump(const std::string& torch_dump, bool include_collectives,
                         bool only_active);
  // torch's own dump (c10d::dump_fr_trace) merged.
  std::string dump();

  // For tests: number of entries held.
  size_t size() const;

 private:
  FlightRecorder();
  struct Entry;
  std::vector<Entry> snapshot() const;

  size_t capacity_ = 0;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // ring of capacity_ entries
  size_t next_ = 0;             // slot of the next entry
  int64_t next_id_ = 0;         // record id of the next entry
  std::vector<std::weak_ptr<FrGroup>> groups_;
  std::atomic<bool> dumped_{false};
};

// torch's op name for stragg's op name ("all_reduce" -> "gloo:all_reduce", ...).
std::string fr_profiling_name(const char* op);

}  // namespace stragg
