#include "core/simulator.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace stragg {
namespace core {

SimMode sim_mode_from_string(const std::string& m) {
  if (m == "lockstep") return SimMode::kLockstep;
  if (m == "dataflow") return SimMode::kDataflow;
  throw ScheduleError("unknown simulation mode '" + m + "' (lockstep|dataflow)");
}

namespace {

struct RoundSpan {
  size_t begin, end;  // steps [begin, end)
};

std::vector<RoundSpan> rounds_of(const Schedule& s) {
  std::vector<RoundSpan> out;
  size_t i = 0;
  while (i < s.steps.size()) {
    size_t j = i;
    while (j < s.steps.size() && s.steps[j].round == s.steps[i].round) ++j;
    out.push_back({i, j});
    i = j;
  }
  return out;
}

void check_options(const Schedule& s, const SimOptions& o) {
  if (!(o.nbytes >= 0) || !(o.alpha >= 0) || !(o.beta >= 0) || !(o.hop_delay >= 0) ||
      !(o.reconfig_delay >= 0))
    throw ScheduleError("simulate: nbytes, alpha, beta and delays must be >= 0");
  if (!o.arrival.empty() && static_cast<int>(o.arrival.size()) != s.n)
    throw ScheduleError("simulate: arrival has " + std::to_string(o.arrival.size()) +
                        " entries, expected n=" + std::to_string(s.n));
  if (!o.slowdown.empty() && static_cast<int>(o.slowdown.size()) != s.n)
    throw ScheduleError("simulate: slowdown has " + std::to_string(o.slowdown.size()) +
                        " entries, expected n=" + std::to_string(s.n));
  for (double f : o.slowdown)
    if (!(f >= 1.0)) throw ScheduleError("simulate: slowdown factors must be >= 1");
  if (o.mode == SimMode::kDataflow && o.ring_topology)
    throw ScheduleError("simulate: the ring-topology model is lockstep only");
}

}  // namespace

SimResult simulate(const Schedule& s, const SimOptions& o) {
  s.validate_structure();
  check_options(s, o);
  const int n = s.n;
  const std::vector<double>& slow = o.slowdown.empty() ? s.rank_slowdown : o.slowdown;
  std::vector<double> arrival = o.arrival.empty() ? std::vector<double>(n, 0.0) : o.arrival;

  // Bytes of a chunk run (prefix sums over weights).
  std::vector<double> prefix(s.num_chunks + 1, 0.0);
  for (int c = 0; c < s.num_chunks; ++c) prefix[c + 1] = prefix[c] + s.chunk_weights[c];
  const double scale = s.total_weight() > 0 ? o.nbytes / s.total_weight() : 0.0;
  auto bytes_of = [&](const Transfer& t) { return (prefix[t.chunk + t.count] - prefix[t.chunk]) * scale; };
  auto factor = [&](const Transfer& t) { return std::max(slow[t.src], slow[t.dst]); };

  const std::vector<RoundSpan> spans = rounds_of(s);
  if (!o.reconfigure.empty() && o.reconfigure.size() != spans.size())
    throw ScheduleError("simulate: reconfigure has " + std::to_string(o.reconfigure.size()) +
                        " entries, expected one per round (" + std::to_string(spans.size()) + ")");

  // Transfers of one round (all its steps, in order; pattern steps expanded), O(n) memory.
  std::vector<Transfer> round_buf, scratch;
  auto round_transfers = [&](const RoundSpan& sp) -> const std::vector<Transfer>& {
    if (sp.end == sp.begin + 1) return s.transfers_of(sp.begin, scratch);
    round_buf.clear();
    for (size_t i = sp.begin; i < sp.end; ++i) {
      const std::vector<Transfer>& t = s.transfers_of(i, scratch);
      round_buf.insert(round_buf.end(), t.begin(), t.end());
    }
    return round_buf;
  };

  SimResult res;
  res.rounds = static_cast<int>(spans.size());
  res.rank_finish = arrival;
  std::vector<double> sent_total(n, 0.0);
  std::vector<double> send_load(n), recv_load(n);

  if (o.mode == SimMode::kLockstep) {
    double clock = 0.0;
    for (size_t k = 0; k < spans.size(); ++k) {
      const RoundSpan& sp = spans[k];
      std::fill(send_load.begin(), send_load.end(), 0.0);
      std::fill(recv_load.begin(), recv_load.end(), 0.0);
      double start = clock;
      bool pre = true;
      for (size_t i = sp.begin; i < sp.end; ++i) pre &= s.steps[i].pre_arrival;
      const std::vector<Transfer>& rt = round_transfers(sp);
      for (const Transfer& t : rt) {
        start = std::max({start, arrival[t.src], arrival[t.dst]});
        const double b = bytes_of(t);
        send_load[t.src] += b * factor(t);
        recv_load[t.dst] += b * factor(t);
        sent_total[t.src] += b;
      }
      bool reconf = !o.reconfigure.empty() && o.reconfigure[k];
      for (size_t i = sp.begin; i < sp.end; ++i) reconf |= s.steps[i].reconfigure;
      double duration = o.alpha;
      if (o.ring_topology && !reconf) {
        // Static ring: shortest-path routing, per-hop delay, congestion on the busiest link.
        std::vector<double> cw(n, 0.0), ccw(n, 0.0);  // link i->i+1 and i->i-1
        int max_hops = 0;
        for (const Transfer& t : rt) {
          const int d = ((t.dst - t.src) % n + n) % n;
          const bool clockwise = d <= n - d;
          const int hops = clockwise ? d : n - d;
          max_hops = std::max(max_hops, hops);
          const double b = bytes_of(t) * factor(t);
          for (int h = 0; h < hops; ++h) {
            if (clockwise)
              cw[(t.src + h) % n] += b;
            else
              ccw[((t.src - h) % n + n) % n] += b;
          }
        }
        double link = 0.0;
        for (int i = 0; i < n; ++i) link = std::max({link, cw[i], ccw[i]});
        duration += max_hops * o.hop_delay + link * o.beta;
      } else {
        double port = 0.0;
        for (int r = 0; r < n; ++r) port = std::max({port, send_load[r], recv_load[r]});
        duration += port * o.beta;
        if (o.ring_topology) duration += o.hop_delay + o.reconfig_delay;
      }
      const double end = start + duration;
      for (const Transfer& t : rt) {
        res.rank_finish[t.src] = std::max(res.rank_finish[t.src], end);
        res.rank_finish[t.dst] = std::max(res.rank_finish[t.dst], end);
      }
      res.round_end.push_back(end);
      if (pre) res.pre_arrival_time = end;
      clock = end;
    }
  } else {
    // Dataflow: per-rank port availability and per-(rank, chunk) data readiness.
    std::vector<double> free_at = arrival;
    std::vector<double> ready(static_cast<size_t>(n) * s.num_chunks, 0.0);
    auto rd = [&](int r, int c) -> double& { return ready[static_cast<size_t>(r) * s.num_chunks + c]; };
    std::vector<double> start(n);
    for (const RoundSpan& sp : spans) {
      std::fill(send_load.begin(), send_load.end(), 0.0);
      std::fill(recv_load.begin(), recv_load.end(), 0.0);
      for (int r = 0; r < n; ++r) start[r] = free_at[r];
      bool pre = true;
      for (size_t i = sp.begin; i < sp.end; ++i) pre &= s.steps[i].pre_arrival;
      const std::vector<Transfer>& rt = round_transfers(sp);
      for (const Transfer& t : rt) {
        for (int c = t.chunk; c < t.chunk + t.count; ++c)
          start[t.src] = std::max(start[t.src], rd(t.src, c));
        const double b = bytes_of(t);
        send_load[t.src] += b * factor(t);
        recv_load[t.dst] += b * factor(t);
        sent_total[t.src] += b;
      }
      for (const Transfer& t : rt) {
        const double end = std::max(start[t.src], start[t.dst]) + o.alpha +
                           std::max(send_load[t.src], recv_load[t.dst]) * o.beta;
        res.rank_finish[t.src] = std::max(res.rank_finish[t.src], end);
        res.rank_finish[t.dst] = std::max(res.rank_finish[t.dst], end);
        for (int c = t.chunk; c < t.chunk + t.count; ++c)
          rd(t.dst, c) = std::max(rd(t.dst, c), end);
        if (pre) res.pre_arrival_time = std::max(res.pre_arrival_time, end);
      }
      // A rank is busy until all of its messages of the round are done.
      for (const Transfer& t : rt) {
        free_at[t.src] = std::max(free_at[t.src], res.rank_finish[t.src]);
        free_at[t.dst] = std::max(free_at[t.dst], res.rank_finish[t.dst]);
      }
    }
  }
  res.time = 0.0;
  for (int r = 0; r < n; ++r) res.time = std::max(res.time, res.rank_finish[r]);
  for (double b : sent_total) res.max_bytes_sent = std::max(res.max_bytes_sent, b);
  return res;
}

}  // namespace core
}  // namespace stragg
