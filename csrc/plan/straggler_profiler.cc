#include "plan/straggler_profiler.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <locale>
#include <sstream>

#include "common/error.h"
#include "core/closed_forms.h"
#include "plan/median.h"

namespace stragg {

namespace cf = core::closed_form;

namespace {

[[noreturn]] void bad_setting(const std::string& field, const std::string& why) {
  throw Error("stragg: invalid straggler profiler setting " + field + ": " + why);
}

std::string num(double v) {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os << v;
  return os.str();
}

std::string ms(double seconds) {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os << std::fixed << std::setprecision(3) << seconds * 1e3 << " ms";
  return os.str();
}

std::string pct(double share) {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os << std::fixed << std::setprecision(1) << share * 100 << "%";
  return os.str();
}

}  // namespace

void validate_profiler_settings(const ProfilerSettings& s) {
  if (s.exchange_every < 1) bad_setting("exchange_every", "must be >= 1, got " + num(s.exchange_every));
  if (s.window < 1) bad_setting("window", "must be >= 1, got " + num(s.window));
  if (s.patience < 1) bad_setting("patience", "must be >= 1, got " + num(s.patience));
  if (!std::isfinite(s.adopt_share) || s.adopt_share <= 0 || s.adopt_share > 1)
    bad_setting("adopt_share", "must be in (0, 1], got " + num(s.adopt_share));
  if (!std::isfinite(s.drop_share) || s.drop_share < 0 || s.drop_share > s.adopt_share)
    bad_setting("drop_share", "must be in [0, adopt_share=" + num(s.adopt_share) + "], got " +
                                  num(s.drop_share));
  if (!std::isfinite(s.min_gain_s)) bad_setting("min_gain_s", "must be finite, got " + num(s.min_gain_s));
  if (!std::isfinite(s.noise_floor_s) || s.noise_floor_s < 0)
    bad_setting("noise_floor_s", "must be finite and >= 0, got " + num(s.noise_floor_s));
}

double stragglar_call_gain(int n, double bytes, double delay_s, bool s_was_late,
                           const LinkModel& link) {
  if (n < 3) return 0;  // StragglAR is never run: Ring against itself
  const double a = link.alpha_s, b = link.beta_s_per_byte;
  if (!s_was_late) return -cf::stragglar_critical_delay(n, bytes, a, b);
  const double ring = delay_s + cf::ring(n, bytes, a, b);
  const double stragglar =
      std::max(delay_s, cf::stragglar_reduce_scatter(n, bytes, a, b)) + cf::stragglar_best(n, bytes, a, b);
  return ring - stragglar;
}

double stragglar_direct_call_gain(int n, double bytes, double delay_s, bool s_was_late,
                                  const LinkModel& link) {
  if (n < 3) return 0;
  const double a = link.alpha_s, b = link.beta_s_per_byte;
  // (k+1)(a + bytes*b/k) is least at k = sqrt(bytes*b/a), about the count the planner picks.
  const double k = std::clamp(std::round(std::sqrt(bytes * b / std::max(a, 1e-12))), 1.0, 1024.0);
  const double rounds = (k + 1) * (a + bytes * b / k);
  const double rs = cf::stragglar_reduce_scatter(n, bytes, a, b);
  const double ring = cf::ring(n, bytes, a, b);
  if (!s_was_late) return ring - (rs + rounds);
  return delay_s + ring - (std::max(delay_s, rs) + rounds);
}

StragglerProfiler::StragglerProfiler(int n, ProfilerSettings settings)
    : n_(n),
      settings_(std::move(settings)),
      window_(static_cast<size_t>(std::max(settings_.window, 1))),
      recent_(kRecentCalls) {
  if (n < 1) throw Error("stragg: straggler profiler needs a group of >= 1 ranks, got " + num(n));
  validate_profiler_settings(settings_);
  last_counts_.assign(n_, 0);
}

bool StragglerProfiler::add_batch(const std::vector<double>& durations, int k,
                                  const std::vector<int64_t>& bytes, const LinkModel& link,
                                  uint64_t first_call) {
  check_batch(durations, k, bytes, link, first_call);
  const size_t ku = static_cast<size_t>(k);
  ++exchanges_;
  next_call_ = first_call + ku;
  link_ = link;
  const size_t valid = record_calls(durations, ku, bytes);
  if (valid == 0 || !settings_.enabled || n_ <= 2) return false;
  return update_straggler();
}

void StragglerProfiler::check_batch(const std::vector<double>& durations, int k,
                                    const std::vector<int64_t>& bytes, const LinkModel& link,
                                    uint64_t first_call) const {
  if (k < 0) throw Error("stragg: straggler profiler: batch size k must be >= 0, got " + num(k));
  const size_t ku = static_cast<size_t>(k);
  if (durations.size() != static_cast<size_t>(n_) * ku)
    throw Error("stragg: straggler profiler: expected n*k = " + std::to_string(n_) + "*" +
                std::to_string(k) + " durations, got " + std::to_string(durations.size()));
  if (bytes.size() != ku)
    throw Error("stragg: straggler profiler: expected k = " + std::to_string(k) +
                " byte counts, got " + std::to_string(bytes.size()));
  for (size_t i = 0; i < ku; ++i)
    if (bytes[i] < 0)
      throw Error("stragg: straggler profiler: call " + std::to_string(first_call + i) +
                  " has negative bytes " + std::to_string(bytes[i]));
  if (!std::isfinite(link.alpha_s) || link.alpha_s < 0 || !std::isfinite(link.beta_s_per_byte) ||
      link.beta_s_per_byte < 0)
    throw Error("stragg: straggler profiler: link model needs finite alpha, beta >= 0, got alpha=" +
                num(link.alpha_s) + " beta=" + num(link.beta_s_per_byte));
}

size_t StragglerProfiler::record_calls(const std::vector<double>& durations, size_t ku,
                                       const std::vector<int64_t>& bytes) {
  size_t valid = 0;
  for (size_t i = 0; i < ku; ++i) {
    // One pass: the shortest duration (ties: lowest rank) and the second shortest.
    double shortest = std::numeric_limits<double>::infinity();
    double second = shortest;
    int last = 0;
    bool ok = true;
    for (int r = 0; r < n_; ++r) {
      const double d = durations[static_cast<size_t>(r) * ku + i];
      if (!(d >= 0) || !std::isfinite(d)) {
        ok = false;
        break;
      }
      if (d < shortest) {
        second = shortest;
        shortest = d;
        last = r;
      } else if (d < second) {
        second = d;
      }
    }
    if (!ok) {
      ++skipped_;
      continue;
    }
    CallSample rec;
    rec.delay_s = n_ >= 2 ? second - shortest : 0;
    rec.bytes = bytes[i];
    rec.last = (n_ >= 2 && rec.delay_s >= settings_.noise_floor_s) ? last : -1;
    if (rec.last >= 0)
      ++last_counts_[rec.last];
    else
      ++insignificant_;
    ++calls_;
    ++valid;
    window_.push(rec);
    recent_.push(rec);
  }
  return valid;
}

bool StragglerProfiler::update_straggler() {
  // Rule 3: who qualifies, whether the current straggler should go.
  const Evaluation e = evaluate_counts();
  const int c = e.candidate;
  int target = -1;
  if (c >= 0 && c != straggler_ && share(e, c) >= settings_.adopt_share &&
      gain(c, link_) > settings_.min_gain_s)
    target = c;
  if (straggler_ >= 0) {
    const bool go = share(e, straggler_) < settings_.drop_share ||
                    gain(straggler_, link_) <= settings_.min_gain_s;
    leave_streak_ = go ? leave_streak_ + 1 : 0;
  }
  if (target >= 0) {
    adopt_streak_ = target == adopt_target_ ? adopt_streak_ + 1 : 1;
    adopt_target_ = target;
  } else {
    adopt_target_ = -1;
    adopt_streak_ = 0;
  }

  // Rule 4: hysteresis. Each text names the rule that decided: share and gain for an adoption
  // (both must qualify), the one that failed (or both) for a drop.
  const int patience = settings_.patience;
  const bool adopt_ready = adopt_target_ >= 0 && adopt_streak_ >= patience;
  if (straggler_ >= 0 && leave_streak_ >= patience) {
    const int old = straggler_;
    if (adopt_ready) {
      record_decision(adopt_target_, "rank " + std::to_string(adopt_target_) + " replaces rank " +
                                         std::to_string(old) + ": rank " + std::to_string(old) +
                                         " dropped " + drop_reason(e, old) + "; adopted: " +
                                         adopt_reason(e, adopt_target_));
      adopt_target_ = -1;
      adopt_streak_ = 0;
    } else {
      record_decision(-1, "rank " + std::to_string(old) + " dropped " + drop_reason(e, old));
    }
    leave_streak_ = 0;
    return true;
  }
  if (straggler_ < 0 && adopt_ready) {
    record_decision(adopt_target_, "adopted: " + adopt_reason(e, adopt_target_));
    adopt_target_ = -1;
    adopt_streak_ = 0;
    leave_streak_ = 0;
    return true;
  }
  return false;
}

std::string StragglerProfiler::share_text(const Evaluation& e, int rank,
                                          const std::string& threshold) const {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  if (e.significant * 4 < static_cast<int64_t>(settings_.window)) {
    // share() is 0 then: too few significant calls for a persistent straggler.
    os << "only " << e.significant << " of the window's " << window_.size()
       << " calls significant (a share needs " << (settings_.window + 3) / 4 << ")";
  } else {
    os << "last in " << pct(share(e, rank)) << " of the window's " << e.significant
       << " significant calls";
  }
  os << ", " << threshold;
  return os.str();
}

std::string StragglerProfiler::gain_text(int rank) const {
  const Gain g = gain_of(rank, link_);
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os << "predicted gain " << ms(g.s) << " per call over Ring with ";
  if (g.direct) {
    os << "stragglar_direct";
  } else {
    // StragglAR's critical delay: the delay from which it beats Ring on the calls s is late for.
    os << "StragglAR (critical delay "
       << ms(cf::stragglar_critical_delay(n_, median_bytes(), link_.alpha_s, link_.beta_s_per_byte))
       << " at " << static_cast<int64_t>(median_bytes()) << " bytes)";
  }
  os << ", needs > " << ms(settings_.min_gain_s);
  return os.str();
}

std::string StragglerProfiler::adopt_reason(const Evaluation& e, int rank) const {
  return "rank " + std::to_string(rank) + " was " +
         share_text(e, rank, "adopt at " + pct(settings_.adopt_share)) + ", and its " +
         gain_text(rank) + " (median delay " + ms(median_delay(rank)) + ")";
}

std::string StragglerProfiler::drop_reason(const Evaluation& e, int rank) const {
  const std::string threshold = "drop below " + pct(settings_.drop_share);
  const bool for_share = share(e, rank) < settings_.drop_share;
  const bool for_gain = gain(rank, link_) <= settings_.min_gain_s;
  const std::string by_share = share_text(e, rank, threshold);
  const std::string by_gain = gain_text(rank);
  const std::string delay = "median delay " + ms(median_delay(rank));
  if (for_share && for_gain) {
    return "for its share and its gain: " + by_share + "; " + by_gain + " (" + delay + ")";
  }
  if (for_share) {
    return "for its share: " + by_share + " (not for its gain: " + by_gain + "; " + delay + ")";
  }
  return "for its gain: " + by_gain + " (not for its share: " + by_share + "; " + delay + ")";
}

StragglerProfiler::Evaluation StragglerProfiler::evaluate_counts() const {
  Evaluation e;
  e.counts.assign(n_, 0);
  for (const auto& rec : window_) {
    if (rec.last < 0) continue;
    ++e.counts[rec.last];
    ++e.significant;
  }
  int64_t best = 0;
  for (int r = 0; r < n_; ++r) {
    if (e.counts[r] > best) {  // strict: ties go to the lowest rank
      best = e.counts[r];
      e.candidate = r;
    }
  }
  return e;
}

double StragglerProfiler::share(const Evaluation& e, int rank) const {
  if (rank < 0 || e.significant == 0) return 0;
  // Too few significant calls in the window: no persistent straggler.
  if (e.significant * 4 < static_cast<int64_t>(settings_.window)) return 0;
  return static_cast<double>(e.counts[rank]) / static_cast<double>(e.significant);
}

StragglerProfiler::Gain StragglerProfiler::gain_of(int rank, const LinkModel& link) const {
  if (rank < 0 || window_.empty()) return {};
  double sum = 0, direct = 0;
  for (const auto& rec : window_) {
    const double bytes = static_cast<double>(rec.bytes);
    sum += stragglar_call_gain(n_, bytes, rec.delay_s, rec.last == rank, link);
    if (direct_variant_)
      direct += stragglar_direct_call_gain(n_, bytes, rec.delay_s, rec.last == rank, link);
  }
  const bool use_direct = direct_variant_ && direct > sum;
  return {(use_direct ? direct : sum) / static_cast<double>(window_.size()), use_direct};
}

double StragglerProfiler::median_delay(int rank) const {
  if (rank < 0) return 0;
  std::vector<double> d;
  d.reserve(window_.size());
  for (const auto& rec : window_)
    if (rec.last == rank) d.push_back(rec.delay_s);
  return median_of(std::move(d));
}

double StragglerProfiler::median_bytes() const {
  std::vector<double> b;
  b.reserve(window_.size());
  for (const auto& rec : window_) b.push_back(static_cast<double>(rec.bytes));
  return median_of(std::move(b));
}

void StragglerProfiler::record_decision(int straggler, const std::string& reason) {
  straggler_ = straggler;
  decisions_.push_back(ProfilerDecision{next_call_, straggler, reason});
  if (decisions_.size() > kMaxDecisions) decisions_.pop_front();
  ++decisions_total_;
}

void StragglerProfiler::reset_decision(const std::string& reason) {
  leave_streak_ = 0;
  adopt_target_ = -1;
  adopt_streak_ = 0;
  if (straggler_ >= 0) record_decision(-1, reason);
}

double StragglerProfiler::candidate_median_delay_s() const {
  return median_delay(evaluate_counts().candidate);
}

std::vector<double> StragglerProfiler::recent_delays(size_t count) const {
  const size_t w = std::min(count, recent_.size());
  std::vector<double> out;
  out.reserve(w);
  for (size_t i = recent_.size() - w; i < recent_.size(); ++i) out.push_back(recent_[i].delay_s);
  return out;
}

ProfilerSummary StragglerProfiler::summary() const {
  ProfilerSummary s;
  s.n = n_;
  s.calls = calls_;
  s.exchanges = exchanges_;
  s.skipped_calls = skipped_;
  s.insignificant_calls = insignificant_;
  s.straggler = straggler_;
  const Evaluation e = evaluate_counts();
  s.candidate = e.candidate;
  s.candidate_share = share(e, e.candidate);
  s.median_delay_s = median_delay(e.candidate);
  s.critical_delay_s =
      n_ >= 3 ? cf::stragglar_critical_delay(n_, median_bytes(), link_.alpha_s, link_.beta_s_per_byte)
              : 0;
  s.predicted_gain_s = gain(e.candidate, link_);
  s.straggler_share = share(e, straggler_);
  s.straggler_gain_s = gain(straggler_, link_);
  s.last_counts = last_counts_;
  s.window_last_counts = e.counts;
  s.recent_delays_s.reserve(recent_.size());
  s.recent_last.reserve(recent_.size());
  for (const auto& rec : recent_) {
    s.recent_delays_s.push_back(rec.delay_s);
    s.recent_last.push_back(rec.last);
  }
  s.decisions.assign(decisions_.begin(), decisions_.end());
  s.decisions_total = decisions_total_;
  s.link = link_;
  return s;
}

}  // namespace stragg
