// Executor::run_oneshot: the one-shot all_reduce of small calls over a transport's OneshotArea.
#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/executor.h"
#include "runtime/mismatch.h"
#include "runtime/reduce.h"

namespace stragg {
namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting rank looks for peers that run this collective as a schedule (a size
// mismatch across the one-shot threshold): reading peer statuses is not free.
constexpr auto kScheduleCheckEvery = std::chrono::milliseconds(10);

// Throws the mismatch between this rank's call and `peer`'s header, if any.
void check_header(int rank, int peer, const CollectiveSpec& spec, const OneshotHeader& h) {
  if (h.seq == spec.seq && h.numel == spec.numel && h.dtype == static_cast<uint8_t>(spec.dtype) &&
      h.op == static_cast<uint8_t>(spec.op)) {
    return;
  }
  std::ostringstream m;
  m << collective_prefix(rank, spec);
  if (h.seq != spec.seq) {
    m << ": sequence mismatch with rank " << peer << ": it is in " << spec.op_name << " #"
      << h.seq << " (the ranks issued a different number of all_reduce calls on this group)";
    throw Error(m.str());
  }
  MismatchText diffs(rank, peer);
  diffs.call_fields(h.dtype, h.numel, h.op, spec);
  throw Error(diffs.message(spec));
}

}  // namespace

void Executor::run_oneshot(const CollectiveSpec& spec, void* buf, uint64_t index,
                           std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const int rank = transport_.rank();
  const int n = transport_.size();
  const RunGuard running(*this, spec, "Executor::run_oneshot");
  OneshotArea* area = transport_.oneshot_area();
  const size_t bytes = spec.numel * dtype_size(spec.dtype);
  if (area == nullptr || bytes > area->capacity()) {
    throw Error(collective_prefix(rank, spec) + ": the one-shot all_reduce of " +
                std::to_string(bytes) + " bytes needs a transport with one-shot buffers of that size (" +
                transport_.name() + " has " +
                (area == nullptr ? std::string("none") : std::to_string(area->capacity()) + " bytes") +
                ")");
  }
  check_not_aborted(transport_, spec);
  publish(spec, Progress::kStarting, {});
  void* own = area->own_buffer(index);
  if (bytes > 0) std::memcpy(own, buf, bytes);
  OneshotHeader mine;
  mine.seq = spec.seq;
  mine.numel = spec.numel;
  mine.dtype = static_cast<uint8_t>(spec.dtype);
  mine.op = static_cast<uint8_t>(spec.op);
  area->publish(index, mine);

  Stall stall(transport_, spec, start, timeout);
  auto schedule_checked = start;
  int next = 0;  // inputs folded into buf so far, in rank order
  try {
    while (true) {
      const uint64_t token = transport_.activity_token();
      const int before = next;
      for (; next < n; ++next) {
        const void* src = own;
        if (next != rank) {
          const OneshotHeader* h = area->published(next, index);
          if (h == nullptr) break;
          check_header(rank, next, spec, *h);
          src = area->peer_buffer(next, index);
        }
        if (next == 0) {
          if (rank != 0 && bytes > 0) std::memcpy(buf, src, bytes);
        } else if (spec.numel > 0) {
          reduce_into(spec.dtype, spec.op, buf, src, spec.numel);
        }
      }
      if (next == n) break;
      if (next != before) continue;
      const auto now = Clock::now();
      awaited_.clear();
      for (int q = next; q < n; ++q) {
        if (q != rank && area->published(q, index) == nullptr) awaited_.push_back(q);
      }
      if (awaited_ != progress_.awaiting) publish(spec, Progress::kStarting, awaited_);
      stall.check(now, awaited_, "in the one-shot exchange");
      if (now - schedule_checked >= kScheduleCheckEvery) {
        schedule_checked = now;
        for (int q : awaited_) {
          const Progress p = transport_.peer_status(q).progress;
          if (p.seq == static_cast<int64_t>(spec.seq) && p.step >= 0) {
            throw Error(collective_prefix(rank, spec) + ": mismatch with rank " +
                        std::to_string(q) + ": it runs this collective as a schedule (step " +
                        std::to_string(p.step) + ") where rank " + std::to_string(rank) +
                        " runs the one-shot all_reduce of " + std::to_string(bytes) +
                        " bytes: the ranks called different collectives here (e.g. a barrier) "
                        "or all_reduce with a different numel or dtype");
          }
        }
      }
      wait_for_peers(token, stall, now);
    }
  } catch (const Error& e) {
    transport_.signal_abort(e.what());
    throw;
  }
  publish(spec, Progress::kFinished, {});
  stats_.runs += 1;
  stats_.bytes_sent += bytes;
  stats_.bytes_received += static_cast<uint64_t>(n - 1) * bytes;
  stats_.busy_s += std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace stragg
