#include "session/link_prober.h"

#include <algorithm>
#include <tuple>

#include "plan/link_probe.h"
#include "plan/planner.h"

namespace stragg {
namespace {

// probe_now(): 8 messages of 128 KiB against one of 1 MiB, best of 5, on every link. Transfers
// of 1 MiB rather than less: shorter ones read healthy hosts further apart.
constexpr size_t kFullTransferBytes = 1 << 20;
constexpr int kFullRepetitions = 5;
constexpr double kUnmeasured = 1e300;

}  // namespace

LinkProber::LinkProber(int rank, int n, bool all_rounds, const std::vector<int>& host_of)
    : rank_(rank), n_(n), all_rounds_(all_rounds || ProbePairing(n, host_of).by_host()),
      pairing_(n, host_of) {}

void LinkProber::start(size_t transfer_bytes) {
  const size_t per_message = std::max<size_t>(sizeof(float), transfer_bytes / kMessages);
  elems_ = per_message / sizeof(float);
  const int rounds = all_rounds_ ? pairing_.rounds() : std::min(pairing_.rounds(), kCampaignRounds);
  slices_.clear();
  for (int rep = 0; rep < kCampaignRepetitions; ++rep) {
    for (int round = 0; round < rounds; ++round) {
      for (int direction : {0, 1}) slices_.push_back({round, direction});
    }
  }
  next_ = 0;
  best_.assign(static_cast<size_t>(pairing_.rounds()) * 2, {kUnmeasured, kUnmeasured, kUnmeasured});
  buf_.assign(2 * static_cast<size_t>(kMessages) * elems_, 1.0f);
  active_ = !slices_.empty();
}

void LinkProber::run_slice(Executor& ex, const InternalSpec& spec,
                           std::chrono::milliseconds timeout, const Slice& slice) {
  using Clock = std::chrono::steady_clock;
  auto& best = best_[static_cast<size_t>(slice.round) * 2 + slice.direction];
  for (int shape = 0; shape < 3; ++shape) {
    const LoweredSchedule plan = link_probe_pair_schedule(
        pairing_.partner(slice.round, rank_), pairing_.sends(slice.round, slice.direction, rank_),
        kMessages, elems_, static_cast<ProbeShape>(shape));
    const CollectiveSpec s = spec("link probe", DType::Float32, buf_.size());
    const auto t0 = Clock::now();
    ex.run(plan, s, buf_.data(), timeout);
    // The fastest repetition: noise (scheduling, other load) only ever adds time.
    best[shape] = std::min(best[shape], std::chrono::duration<double>(Clock::now() - t0).count());
  }
}

std::optional<std::vector<LinkModel>> LinkProber::run_slices(Executor& ex, const InternalSpec& spec,
                                                             std::chrono::milliseconds timeout,
                                                             size_t count) {
  if (!active_) return std::nullopt;
  for (size_t i = 0; i < count && next_ < slices_.size(); ++i) {
    run_slice(ex, spec, timeout, slices_[next_++]);
  }
  if (next_ < slices_.size()) return std::nullopt;
  active_ = false;
  return finish(ex, spec, timeout);
}

std::vector<LinkModel> LinkProber::probe_now(Executor& ex, const InternalSpec& spec,
                                             std::chrono::milliseconds timeout) {
  const bool was_active = active_;
  const auto saved = std::make_tuple(elems_, slices_, next_, best_, buf_);
  elems_ = kFullTransferBytes / kMessages / sizeof(float);
  buf_.assign(2 * static_cast<size_t>(kMessages) * elems_, 1.0f);
  best_.assign(static_cast<size_t>(pairing_.rounds()) * 2, {kUnmeasured, kUnmeasured, kUnmeasured});
  for (int round = 0; round < pairing_.rounds(); ++round) {
    for (int direction : {0, 1}) {
      for (int rep = 0; rep < kFullRepetitions; ++rep) run_slice(ex, spec, timeout, {round, direction});
    }
  }
  std::vector<LinkModel> matrix = finish(ex, spec, timeout);
  // A campaign in progress goes on where it was.
  std::tie(elems_, slices_, next_, best_, buf_) = saved;
  active_ = was_active;
  return matrix;
}

std::vector<LinkModel> LinkProber::finish(Executor& ex, const InternalSpec& spec,
                                          std::chrono::milliseconds timeout) {
  // This rank's row: the links it sent on (it timed them).
  const size_t n = static_cast<size_t>(n_);
  std::vector<double> all(n * n * 2, 0.0);
  for (size_t j = 0; j < n; ++j) all[(rank_ * n + j) * 2] = all[(rank_ * n + j) * 2 + 1] = -1;
  for (int round = 0; round < pairing_.rounds(); ++round) {
    for (int direction : {0, 1}) {
      const auto& b = best_[static_cast<size_t>(round) * 2 + direction];
      if (!pairing_.sends(round, direction, rank_) || b[0] >= kUnmeasured ||
          b[1] >= kUnmeasured || b[2] >= kUnmeasured) {
        continue;
      }
      const LinkModel l = estimate_link(b[0], b[1], b[2], kMessages, elems_ * sizeof(float));
      const size_t j = static_cast<size_t>(pairing_.partner(round, rank_));
      all[(rank_ * n + j) * 2] = l.alpha_s;
      all[(rank_ * n + j) * 2 + 1] = l.beta_s_per_byte;
    }
  }
  // All-gather through a sum: every rank fills its own row, zeros elsewhere (x + 0 is exact).
  ex.run(*small_allreduce_schedule(rank_, n_, all.size()),
         spec("link probe exchange", DType::Float64, all.size()), all.data(), timeout);
  std::vector<LinkModel> matrix(n * n);
  for (size_t i = 0; i < n * n; ++i) {
    const bool diagonal = i / n == i % n;
    matrix[i].alpha_s = diagonal ? -1 : all[i * 2];
    matrix[i].beta_s_per_byte = diagonal ? -1 : all[i * 2 + 1];
  }
  return pairing_.expand(matrix);
}

}  // namespace stragg
