#include "plan/link_probe.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/error.h"

namespace stragg {

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

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

RankPlan link_probe_plan(int n, int rank, int round, int messages, size_t elems, bool many) {
  check_round_rank(n, round, rank, "link_probe_plan");
  if (messages < 1)
    throw Error("stragg: link_probe_plan: messages must be >= 1, got " + std::to_string(messages));
  if (elems < 1) throw Error("stragg: link_probe_plan: elems must be >= 1, got 0");
  RankPlan plan;
  plan.tag = kLinkProbeTag;
  const int peer = probe_partner(n, round, rank);
  if (peer < 0) return plan;
  const size_t m = static_cast<size_t>(messages);
  const size_t total = m * elems;
  auto step = [&](uint32_t id, size_t offset, size_t count) {
    PlanStep s;
    s.id = id;
    PlanOp send;
    send.peer = peer;
    send.offset = offset;
    send.count = count;
    PlanOp recv = send;
    recv.offset = total + offset;
    recv.reduce = false;
    s.sends.push_back(send);
    s.recvs.push_back(recv);
    plan.steps.push_back(std::move(s));
  };
  if (many) {
    for (size_t i = 0; i < m; ++i) step(static_cast<uint32_t>(i), i * elems, elems);
  } else {
    step(static_cast<uint32_t>(messages), 0, total);
  }
  return plan;
}

LinkModel estimate_link(double t_many, double t_one, int messages, size_t bytes_each) {
  if (messages < 2)
    throw Error("stragg: estimate_link: needs messages >= 2, got " + std::to_string(messages));
  if (bytes_each < 1) throw Error("stragg: estimate_link: bytes_each must be >= 1, got 0");
  if (!std::isfinite(t_many) || !std::isfinite(t_one) || t_many < 0 || t_one < 0)
    throw Error("stragg: estimate_link: times must be finite and >= 0, got t_many=" +
                std::to_string(t_many) + " t_one=" + std::to_string(t_one));
  LinkModel link;
  link.alpha_s = std::max(kMinProbeAlpha, (t_many - t_one) / (messages - 1));
  const double bytes = static_cast<double>(messages) * static_cast<double>(bytes_each);
  link.beta_s_per_byte = std::max(kMinProbeBeta, (t_one - link.alpha_s) / bytes);
  return link;
}

LinkModel combine_links(const std::vector<LinkModel>& links, int n) {
  if (n < 1 || links.size() != static_cast<size_t>(n) * static_cast<size_t>(n))
    throw Error("stragg: combine_links: expected an n x n = " + std::to_string(n) + "x" +
                std::to_string(n) + " matrix, got " + std::to_string(links.size()) + " entries");
  std::vector<double> alphas, betas;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const LinkModel& l = links[static_cast<size_t>(i) * n + j];
      if (!(l.alpha_s >= 0) || !std::isfinite(l.alpha_s) || !std::isfinite(l.beta_s_per_byte) ||
          l.beta_s_per_byte < 0)
        continue;
      alphas.push_back(l.alpha_s);
      betas.push_back(l.beta_s_per_byte);
    }
  }
  if (alphas.empty()) return LinkModel{};
  LinkModel out;
  out.alpha_s = median_of(std::move(alphas));
  out.beta_s_per_byte = median_of(std::move(betas));
  return out;
}

}  // namespace stragg
