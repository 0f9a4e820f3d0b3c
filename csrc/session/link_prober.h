// The link probes of a group (no torch here): runs link_probe_schedule transfers on the executor
// and all-gathers the n x n matrix of per-link alpha/beta (plan/link_probe.h).
//
// Two ways to probe:
// Who probes whom in a round is ProbePairing's (plan/link_probe.h): every rank pair, or host to
// host where ranks share hosts among several.
//  * probe_now(): every round of the round-robin pairing, 5 repetitions, 1 MiB transfers, at
//    once (stragg.profiler.measure_links(): the user asked and waits for it).
//  * a campaign in slices, run between the calls of a job: start() picks the transfer size and
//    the rounds, run_slices() runs a few slices (one slice: one direction of one round, one
//    repetition of the three probe shapes) at the start of a call, and returns the matrix when
//    the last one ran. Which and how many slices run when is decided by the caller from exchanged
//    numbers, so every rank runs the same slices at the same call. A campaign measures at most
//    kCampaignRounds partners per rank when every rank is alone on its host (enough for the
//    analysis's lower medians to see through one or two degraded partners), every round
//    otherwise (host mates' links do not describe the network).
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "plan/link_model.h"
#include "plan/link_probe.h"
#include "runtime/executor.h"

namespace stragg {

// Spec of the next internal collective on the wire (it takes a sequence number).
using InternalSpec = std::function<CollectiveSpec(const char* name, DType dtype, size_t numel)>;

class LinkProber {
 public:
  static constexpr int kMessages = 8;  // a stream of 8 messages against one of 8x the size
  static constexpr int kCampaignRounds = 4;
  static constexpr int kCampaignRepetitions = 3;

  // `all_rounds`: campaigns run every round of the pairing (groups with host mates). `host_of`:
  // the ranks' hosts (ProbePairing: host to host where ranks share hosts among several).
  LinkProber(int rank, int n, bool all_rounds, const std::vector<int>& host_of = {});

  // Every link, now (collective): 5 repetitions of 1 MiB transfers.
  std::vector<LinkModel> probe_now(Executor& ex, const InternalSpec& spec,
                                   std::chrono::milliseconds timeout);

  // Begins a campaign with transfers of `transfer_bytes` (rounded to whole probe messages).
  void start(size_t transfer_bytes);
  bool active() const { return active_; }
  size_t slices_left() const { return active_ ? slices_.size() - next_ : 0; }
  size_t transfer_bytes() const { return elems_ * kMessages * sizeof(float); }
  // Runs up to `count` slices (collective); the n x n matrix once the campaign's last slice ran
  // (it then ends), else nothing.
  std::optional<std::vector<LinkModel>> run_slices(Executor& ex, const InternalSpec& spec,
                                                   std::chrono::milliseconds timeout, size_t count);

 private:
  struct Slice {
    int round;
    int direction;
  };
  // One repetition of the three shapes of `slice`; keeps each shape's fastest time.
  void run_slice(Executor& ex, const InternalSpec& spec, std::chrono::milliseconds timeout,
                 const Slice& slice);
  std::vector<LinkModel> finish(Executor& ex, const InternalSpec& spec,
                                std::chrono::milliseconds timeout);

  const int rank_;
  const int n_;
  const bool all_rounds_;
  const ProbePairing pairing_;
  bool active_ = false;
  size_t elems_ = 0;  // floats per probe message
  std::vector<Slice> slices_;
  size_t next_ = 0;
  std::vector<float> buf_;
  // Per (round, direction): the fastest time of each ProbeShape so far.
  std::vector<std::array<double, 3>> best_;
};

}  // namespace stragg
