#include "plan/link_probe.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "plan/median.h"

namespace stragg {

namespace {

void check_round_rank(int n, int round, int rank, const char* what) {
  const int rounds = probe_rounds(n);
  if (round < 0 || round >= rounds)
    throw Error(std::string("stragg: ") + what + ": round " + std::to_string(round) +
                " out of range [0, " + std::to_string(rounds) + ") for " + std::to_string(n) +
                " ranks");
  if (rank < 0 || rank >= n)
    throw Error(std::string("stragg: ") + what + ": rank " + std::to_string(rank) +
                " is not a rank of a group of " + std::to_string(n));
}

bool measured(const LinkModel& l) {
  return l.alpha_s >= 0 && std::isfinite(l.alpha_s) && std::isfinite(l.beta_s_per_byte) &&
         l.beta_s_per_byte >= 0;
}

// A verdict's entry for `rank` (end(): healthy), and a verdict put in rank order.
std::vector<Slowdown>::const_iterator find_rank(const std::vector<Slowdown>& v, int rank) {
  return std::find_if(v.begin(), v.end(), [&](const Slowdown& d) { return d.rank == rank; });
}

void sort_by_rank(std::vector<Slowdown>& v) {
  std::sort(v.begin(), v.end(), [](const Slowdown& a, const Slowdown& b) { return a.rank < b.rank; });
}

}  // namespace

int probe_rounds(int n) {
  if (n < 1) throw Error("stragg: probe_rounds: needs n >= 1, got " + std::to_string(n));
  if (n == 1) return 0;
  return n % 2 == 0 ? n - 1 : n;
}

int probe_partner(int n, int round, int rank) {
  check_round_rank(n, round, rank, "probe_partner");
  const int m = n % 2 == 0 ? n - 1 : n;  // odd modulus: 2 is invertible
  if (n % 2 == 0 && rank == n - 1) return round;  // round's fixed point meets the extra rank
  const int p = ((2 * round - rank) % m + m) % m;
  if (p == rank) return n % 2 == 0 ? n - 1 : -1;
  return p;
}

bool probe_sends(int n, int round, int direction, int rank) {
  if (direction != 0 && direction != 1) {
    throw Error("stragg: link probe: direction must be 0 or 1, got " + std::to_string(direction));
  }
  const int peer = probe_partner(n, round, rank);
  if (peer < 0) return false;
  return direction == 0 ? rank < peer : rank > peer;
}

LoweredSchedule link_probe_schedule(int n, int rank, int round, int direction, int messages,
                                    size_t elems, ProbeShape shape) {
  check_round_rank(n, round, rank, "link_probe_schedule");
  return link_probe_pair_schedule(probe_partner(n, round, rank),
                                  probe_sends(n, round, direction, rank), messages, elems, shape);
}

LoweredSchedule link_probe_pair_schedule(int peer, bool sender, int messages, size_t elems,
                                         ProbeShape shape) {
  if (messages < 1)
    throw Error("stragg: link_probe_schedule: messages must be >= 1, got " +
                std::to_string(messages));
  if (elems < 1) throw Error("stragg: link_probe_schedule: elems must be >= 1, got 0");
  LoweredSchedule plan;
  plan.tag = kLinkProbeTag;
  if (peer < 0) return plan;
  const size_t m = static_cast<size_t>(messages);
  const size_t total = m * elems;
  auto op = [&](size_t offset, size_t count) {
    LoweredOp o;
    o.peer = peer;
    o.offset = offset;
    o.count = count;
    return o;
  };
  size_t last_landed = total;  // receiver: the last element the payload writes
  auto payload = [&](uint32_t id, size_t offset, size_t count) {
    LoweredStep s;
    s.id = id;
    if (sender) {
      s.sends.push_back(op(offset, count));
    } else {
      s.recvs.push_back(op(total + offset, count));
      last_landed = total + offset + count - 1;
    }
    plan.steps.push_back(std::move(s));
  };
  // Step ids: many 0..m-1 (ack m+2), one m (ack m+1), tiny m+3 (ack m+4).
  const uint32_t um = static_cast<uint32_t>(messages);
  uint32_t ack_id = 0;
  switch (shape) {
    case ProbeShape::kMany:
      for (size_t i = 0; i < m; ++i) payload(static_cast<uint32_t>(i), i * elems, elems);
      ack_id = um + 2;
      break;
    case ProbeShape::kOne:
      payload(um, 0, total);
      ack_id = um + 1;
      break;
    case ProbeShape::kTiny:
      payload(um + 3, 0, 1);
      ack_id = um + 4;
      break;
  }
  LoweredStep ack;
  ack.id = ack_id;
  if (sender) {
    ack.recvs.push_back(op(total, 1));
  } else {
    // The acknowledgement reads the payload's last element, so the executor sends it only once
    // the payload has landed (the receives from one peer complete in order). An ack that read
    // other memory could leave at once: a warm TCP connection takes the whole payload into its
    // send buffer, and the sender would time its own buffering instead of the link.
    ack.sends.push_back(op(last_landed, 1));
  }
  plan.steps.push_back(std::move(ack));
  return plan;
}

LinkModel estimate_link(double t_many, double t_one, double t_tiny, int messages,
                        size_t bytes_each) {
  if (messages < 2)
    throw Error("stragg: estimate_link: needs messages >= 2, got " + std::to_string(messages));
  if (bytes_each < 1) throw Error("stragg: estimate_link: bytes_each must be >= 1, got 0");
  for (double t : {t_many, t_one, t_tiny}) {
    if (!std::isfinite(t) || t < 0)
      throw Error("stragg: estimate_link: times must be finite and >= 0, got t_many=" +
                  std::to_string(t_many) + " t_one=" + std::to_string(t_one) +
                  " t_tiny=" + std::to_string(t_tiny));
  }
  LinkModel link;
  link.alpha_s =
      std::max({kMinProbeAlpha, (t_many - t_one) / (messages - 1), t_tiny / 2});
  const double bytes = static_cast<double>(static_cast<size_t>(messages) * bytes_each);
  // beta from the one message above a round trip, not above the alpha of the stream: a stream
  // slowed by noise (scheduling on a busy host) inflates alpha, and beta must not shrink for it.
  const double whole = t_one - t_tiny;
  link.beta_s_per_byte = std::max(kMinProbeBeta, (whole > 0 ? whole : t_one) / bytes);
  return link;
}

LinkAnalysis analyze_links(const std::vector<LinkModel>& links, int n, double threshold) {
  if (n < 1 || links.size() != static_cast<size_t>(n) * static_cast<size_t>(n))
    throw Error("stragg: analyze_links: expected an n x n = " + std::to_string(n) + "x" +
                std::to_string(n) + " matrix, got " + std::to_string(links.size()) + " entries");
  if (!(threshold >= 1)) throw Error("stragg: analyze_links: threshold must be >= 1");
  const size_t un = static_cast<size_t>(n);
  auto at = [&](int i, int j) -> const LinkModel& { return links[i * un + j]; };
  LinkAnalysis out;
  out.send_beta.assign(un, -1);
  out.recv_beta.assign(un, -1);
  out.slowdown.assign(un, 1.0);
  // A rank's side runs at the lower median of its links (the fastest of two, the 2nd of three,
  // the 4th of seven): the partners of most of its links are healthy, and unlike the fastest
  // link this does not follow one probe that read a link too fast (a shaper's burst).
  std::vector<std::vector<double>> out_links(un), in_links(un);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j || !measured(at(i, j))) continue;
      out_links[i].push_back(at(i, j).beta_s_per_byte);
      in_links[j].push_back(at(i, j).beta_s_per_byte);
    }
  }
  auto lower_median = [](std::vector<double> v) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    return v[(v.size() - 1) / 2];
  };
  for (size_t r = 0; r < un; ++r) {
    out.send_beta[r] = lower_median(out_links[r]);
    out.recv_beta[r] = lower_median(in_links[r]);
  }
  std::vector<double> rank_beta(un, -1), known;
  for (size_t r = 0; r < un; ++r) {
    if (out.send_beta[r] < 0 && out.recv_beta[r] < 0) continue;
    rank_beta[r] = std::max(out.send_beta[r], out.recv_beta[r]);
    known.push_back(rank_beta[r]);
  }
  if (known.empty()) return out;
  const double ref = median_of(known);
  for (size_t r = 0; r < un; ++r) {
    if (rank_beta[r] < 0 || !(ref > 0)) continue;
    out.slowdown[r] = std::max(1.0, rank_beta[r] / ref);
    if (out.slowdown[r] >= threshold) out.degraded.push_back({static_cast<int>(r), out.slowdown[r]});
  }
  std::vector<double> alphas, betas;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j || !measured(at(i, j))) continue;
      if (out.slowdown[i] >= threshold || out.slowdown[j] >= threshold) continue;
      alphas.push_back(at(i, j).alpha_s);
      betas.push_back(at(i, j).beta_s_per_byte);
    }
  }
  if (!alphas.empty()) {
    out.reference.alpha_s = median_of(alphas);
    out.reference.beta_s_per_byte = median_of(betas);
  }
  return out;
}

bool needs_confirmation(const LinkAnalysis& fresh, const std::vector<Slowdown>& current,
                        double sure) {
  for (const Slowdown& d : fresh.degraded) {
    if (find_rank(current, d.rank) == current.end() && d.factor < sure) return true;
  }
  // A known slow rank that reads healthy, or whose factor moved by more than `sure` either way.
  for (const Slowdown& c : current) {
    const auto it = find_rank(fresh.degraded, c.rank);
    if (it == fresh.degraded.end()) return true;
    if (it->factor > c.factor * sure || it->factor * sure < c.factor) return true;
  }
  return false;
}

std::vector<Slowdown> sure_degraded(const LinkAnalysis& fresh, const std::vector<Slowdown>& current,
                                    double sure) {
  std::vector<Slowdown> out = current;
  for (const Slowdown& d : fresh.degraded) {
    if (find_rank(current, d.rank) == current.end() && d.factor >= sure) out.push_back(d);
  }
  sort_by_rank(out);
  return out;
}

std::vector<Slowdown> confirmed_degraded(const LinkAnalysis& first, const LinkAnalysis& second,
                                         const std::vector<Slowdown>& current) {
  std::vector<Slowdown> out;
  for (const Slowdown& a : first.degraded) {
    const auto b = find_rank(second.degraded, a.rank);
    if (b != second.degraded.end()) {
      out.push_back({a.rank, std::min(a.factor, b->factor)});
    } else if (find_rank(current, a.rank) != current.end()) {
      out.push_back(a);
    }
  }
  for (const Slowdown& b : second.degraded) {
    if (find_rank(first.degraded, b.rank) == first.degraded.end() &&
        find_rank(current, b.rank) != current.end()) {
      out.push_back(b);
    }
  }
  sort_by_rank(out);
  return out;
}

std::vector<LinkModel> average_links(const std::vector<LinkModel>& a,
                                     const std::vector<LinkModel>& b) {
  if (a.size() != b.size()) {
    throw Error("stragg: average_links: the probes measured " + std::to_string(a.size()) +
                " and " + std::to_string(b.size()) + " links");
  }
  std::vector<LinkModel> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!measured(a[i]) || !measured(b[i])) {
      out[i].alpha_s = out[i].beta_s_per_byte = -1;
      continue;
    }
    out[i].alpha_s = 0.5 * (a[i].alpha_s + b[i].alpha_s);
    out[i].beta_s_per_byte = 0.5 * (a[i].beta_s_per_byte + b[i].beta_s_per_byte);
  }
  return out;
}

}  // namespace stragg

namespace stragg {

ProbePairing::ProbePairing(int n, const std::vector<int>& host_of) : n_(n) {
  if (n < 1) throw Error("stragg: link probe pairing: needs n >= 1, got " + std::to_string(n));
  if (!host_of.empty() && static_cast<int>(host_of.size()) != n) {
    throw Error("stragg: link probe pairing: host_of names " + std::to_string(host_of.size()) +
                " ranks, the group has " + std::to_string(n));
  }
  int hosts = 0;
  for (int h : host_of) hosts = std::max(hosts, h + 1);
  std::vector<std::vector<int>> ranks(static_cast<size_t>(hosts));
  for (int r = 0; r < static_cast<int>(host_of.size()); ++r) {
    if (host_of[r] < 0) throw Error("stragg: link probe pairing: negative host index");
    ranks[static_cast<size_t>(host_of[r])].push_back(r);
  }
  bool mates = false;
  for (const auto& h : ranks) {
    if (h.empty()) throw Error("stragg: link probe pairing: host indices must be 0..P-1");
    mates = mates || h.size() > 1;
  }
  if (hosts < 2 || !mates) return;  // every rank pair
  host_of_ = host_of;
  hosts_ = std::move(ranks);
}

int ProbePairing::rounds() const {
  if (!by_host()) return probe_rounds(n_);
  return probe_rounds(static_cast<int>(hosts_.size())) + 1;
}

int ProbePairing::partner(int round, int rank) const {
  if (!by_host()) return probe_partner(n_, round, rank);
  if (round < 0 || round >= rounds() || rank < 0 || rank >= n_) {
    throw Error("stragg: link probe pairing: round " + std::to_string(round) + " or rank " +
                std::to_string(rank) + " out of range");
  }
  const std::vector<int>& mine = hosts_[static_cast<size_t>(host_of_[rank])];
  if (round == rounds() - 1) {  // the shared-memory link: each host's first two ranks
    if (mine.size() < 2) return -1;
    if (rank == mine[0]) return mine[1];
    if (rank == mine[1]) return mine[0];
    return -1;
  }
  if (rank != mine[0]) return -1;
  const int other = probe_partner(static_cast<int>(hosts_.size()), round, host_of_[rank]);
  return other < 0 ? -1 : hosts_[static_cast<size_t>(other)][0];
}

bool ProbePairing::sends(int round, int direction, int rank) const {
  if (direction != 0 && direction != 1) {
    throw Error("stragg: link probe: direction must be 0 or 1, got " + std::to_string(direction));
  }
  const int peer = partner(round, rank);
  if (peer < 0) return false;
  return direction == 0 ? rank < peer : rank > peer;
}

std::vector<LinkModel> ProbePairing::expand(const std::vector<LinkModel>& measured) const {
  if (!by_host()) return measured;
  const size_t n = static_cast<size_t>(n_);
  if (measured.size() != n * n) {
    throw Error("stragg: link probe pairing: expected an " + std::to_string(n) + " x " +
                std::to_string(n) + " matrix");
  }
  std::vector<LinkModel> out(n * n);
  for (auto& l : out) l.alpha_s = l.beta_s_per_byte = -1;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      const auto& hi = hosts_[static_cast<size_t>(host_of_[i])];
      const auto& hj = hosts_[static_cast<size_t>(host_of_[j])];
      size_t a = static_cast<size_t>(hi[0]), b = static_cast<size_t>(hj[0]);
      if (&hi == &hj) {  // host mates: the host's measured shared-memory link, either direction
        if (hi.size() < 2) continue;
        a = static_cast<size_t>(hi[0]);
        b = static_cast<size_t>(hi[1]);
        if (i == b) std::swap(a, b);
      }
      out[i * n + j] = measured[a * n + b];
    }
  }
  return out;
}

}  // namespace stragg
