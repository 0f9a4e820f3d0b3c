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
  if (!o.host_of.empty()) {
    if (static_cast<int>(o.host_of.size()) != s.n)
      throw ScheduleError("simulate: host_of has " + std::to_string(o.host_of.size()) +
                          " entries, expected n=" + std::to_string(s.n));
    for (int h : o.host_of)
      if (h < 0 || h >= s.n) throw ScheduleError("simulate: host index out of range");
    if (o.mode == SimMode::kDataflow || o.ring_topology)
      throw ScheduleError("simulate: the two-level (host_of) model is lockstep only");
    if (!(o.local_alpha >= 0) || !(o.local_beta >= 0))
      throw ScheduleError("simulate: local_alpha and local_beta must be >= 0");
  }
}

// One simulation run: the inputs, the per-round scratch buffers and the result being built.
class Simulation {
 public:
  // Checks the options and precomputes the chunk prefix sums and the round spans.
  Simulation(const Schedule& s, const SimOptions& o)
      : s_(s),
        o_(o),
        n_(s.n),
        slow_(o.slowdown.empty() ? s.rank_slowdown : o.slowdown),
        arrival_(o.arrival.empty() ? std::vector<double>(s.n, 0.0) : o.arrival) {
    // Bytes of a chunk run (prefix sums over weights).
    prefix_.assign(s.num_chunks + 1, 0.0);
    for (int c = 0; c < s.num_chunks; ++c) prefix_[c + 1] = prefix_[c] + s.chunk_weights[c];
    scale_ = s.total_weight() > 0 ? o.nbytes / s.total_weight() : 0.0;
    spans_ = rounds_of(s);
    if (!o.reconfigure.empty() && o.reconfigure.size() != spans_.size())
      throw ScheduleError("simulate: reconfigure has " + std::to_string(o.reconfigure.size()) +
                          " entries, expected one per round (" + std::to_string(spans_.size()) +
                          ")");
    res_.rounds = static_cast<int>(spans_.size());
    res_.rank_finish = arrival_;
    sent_total_.assign(n_, 0.0);
    send_load_.resize(n_);
    recv_load_.resize(n_);
    if (!o.host_of.empty()) {
      nic_send_.resize(n_);  // host indices are < n
      nic_recv_.resize(n_);
    }
  }

  // Runs the model chosen by the options and returns the result.
  SimResult run() {
    if (o_.mode == SimMode::kLockstep)
      run_lockstep();
    else
      run_dataflow();
    res_.time = 0.0;
    for (int r = 0; r < n_; ++r) res_.time = std::max(res_.time, res_.rank_finish[r]);
    for (double b : sent_total_) res_.max_bytes_sent = std::max(res_.max_bytes_sent, b);
    return res_;
  }

 private:
  // Bytes of a transfer's chunk run.
  double bytes_of(const Transfer& t) const {
    return (prefix_[t.chunk + t.count] - prefix_[t.chunk]) * scale_;
  }
  // Link slowdown of a transfer: the slower endpoint's.
  double factor(const Transfer& t) const { return std::max(slow_[t.src], slow_[t.dst]); }

  // Transfers of one round (all its steps, in order; pattern steps expanded), O(n) memory.
  const std::vector<Transfer>& round_transfers(const RoundSpan& sp) {
    if (sp.end == sp.begin + 1) return s_.transfers_of(sp.begin, scratch_);
    round_buf_.clear();
    for (size_t i = sp.begin; i < sp.end; ++i) {
      const std::vector<Transfer>& t = s_.transfers_of(i, scratch_);
      round_buf_.insert(round_buf_.end(), t.begin(), t.end());
    }
    return round_buf_;
  }

  // Whether every step of the round is a pre-arrival step.
  bool all_pre_arrival(const RoundSpan& sp) const {
    bool pre = true;
    for (size_t i = sp.begin; i < sp.end; ++i) pre &= s_.steps[i].pre_arrival;
    return pre;
  }

  // Clears the per-rank port loads at the start of a round.
  void clear_loads() {
    std::fill(send_load_.begin(), send_load_.end(), 0.0);
    std::fill(recv_load_.begin(), recv_load_.end(), 0.0);
    std::fill(nic_send_.begin(), nic_send_.end(), 0.0);
    std::fill(nic_recv_.begin(), nic_recv_.end(), 0.0);
    crosses_network_ = false;
  }

  // Adds a transfer to its endpoints' port loads (their hosts' NICs between hosts, in the
  // two-level model) and to the sender's byte total.
  void add_load(const Transfer& t) {
    const double b = bytes_of(t);
    sent_total_[t.src] += b;
    if (!o_.host_of.empty()) {
      const int hs = o_.host_of[t.src], hd = o_.host_of[t.dst];
      if (hs == hd) {
        send_load_[t.src] += b;
        recv_load_[t.dst] += b;
      } else {
        nic_send_[hs] += b * factor(t);
        nic_recv_[hd] += b * factor(t);
        crosses_network_ = true;
      }
      return;
    }
    send_load_[t.src] += b * factor(t);
    recv_load_[t.dst] += b * factor(t);
  }

  // Lockstep: rounds one after another, each waiting for the previous one and its ranks' arrival.
  void run_lockstep() {
    double clock = 0.0;
    for (size_t k = 0; k < spans_.size(); ++k) {
      const RoundSpan& sp = spans_[k];
      clear_loads();
      double start = clock;
      const bool pre = all_pre_arrival(sp);
      const std::vector<Transfer>& rt = round_transfers(sp);
      for (const Transfer& t : rt) {
        start = std::max({start, arrival_[t.src], arrival_[t.dst]});
        add_load(t);
      }
      bool reconf = !o_.reconfigure.empty() && o_.reconfigure[k];
      for (size_t i = sp.begin; i < sp.end; ++i) reconf |= s_.steps[i].reconfigure;
      const double end = start + lockstep_duration(rt, reconf);
      for (const Transfer& t : rt) {
        res_.rank_finish[t.src] = std::max(res_.rank_finish[t.src], end);
        res_.rank_finish[t.dst] = std::max(res_.rank_finish[t.dst], end);
      }
      res_.round_end.push_back(end);
      if (pre) res_.pre_arrival_time = end;
      clock = end;
    }
  }

  // Duration of a lockstep round whose port loads are filled in.
  double lockstep_duration(const std::vector<Transfer>& rt, bool reconf) const {
    if (!o_.host_of.empty()) {
      double nic = 0.0, local = 0.0;
      for (int r = 0; r < n_; ++r) {
        nic = std::max({nic, nic_send_[r], nic_recv_[r]});
        local = std::max({local, send_load_[r], recv_load_[r]});
      }
      const double alpha = crosses_network_ || rt.empty() ? o_.alpha : o_.local_alpha;
      return alpha + std::max(nic * o_.beta, local * o_.local_beta);
    }
    double duration = o_.alpha;
    if (o_.ring_topology && !reconf) {
      duration += static_ring_time(rt);
    } else {
      double port = 0.0;
      for (int r = 0; r < n_; ++r) port = std::max({port, send_load_[r], recv_load_[r]});
      duration += port * o_.beta;
      if (o_.ring_topology) duration += o_.hop_delay + o_.reconfig_delay;
    }
    return duration;
  }

  // Static ring: shortest-path routing, per-hop delay, congestion on the busiest link.
  double static_ring_time(const std::vector<Transfer>& rt) const {
    std::vector<double> cw(n_, 0.0), ccw(n_, 0.0);  // link i->i+1 and i->i-1
    int max_hops = 0;
    for (const Transfer& t : rt) {
      const int d = ((t.dst - t.src) % n_ + n_) % n_;
      const bool clockwise = d <= n_ - d;
      const int hops = clockwise ? d : n_ - d;
      max_hops = std::max(max_hops, hops);
      const double b = bytes_of(t) * factor(t);
      for (int h = 0; h < hops; ++h) {
        if (clockwise)
          cw[(t.src + h) % n_] += b;
        else
          ccw[((t.src - h) % n_ + n_) % n_] += b;
      }
    }
    double link = 0.0;
    for (int i = 0; i < n_; ++i) link = std::max({link, cw[i], ccw[i]});
    return max_hops * o_.hop_delay + link * o_.beta;
  }

  // Dataflow: per-rank port availability and per-(rank, chunk) data readiness.
  void run_dataflow() {
    free_at_ = arrival_;
    ready_.assign(static_cast<size_t>(n_) * s_.num_chunks, 0.0);
    start_.resize(n_);
    for (const RoundSpan& sp : spans_) {
      clear_loads();
      for (int r = 0; r < n_; ++r) start_[r] = free_at_[r];
      const bool pre = all_pre_arrival(sp);
      const std::vector<Transfer>& rt = round_transfers(sp);
      for (const Transfer& t : rt) {
        for (int c = t.chunk; c < t.chunk + t.count; ++c)
          start_[t.src] = std::max(start_[t.src], rd(t.src, c));
        add_load(t);
      }
      dataflow_finish_round(rt, pre);
    }
  }

  // Ends each message of a dataflow round, updates data readiness and the ranks' port times.
  void dataflow_finish_round(const std::vector<Transfer>& rt, bool pre) {
    for (const Transfer& t : rt) {
      const double end = std::max(start_[t.src], start_[t.dst]) + o_.alpha +
                         std::max(send_load_[t.src], recv_load_[t.dst]) * o_.beta;
      res_.rank_finish[t.src] = std::max(res_.rank_finish[t.src], end);
      res_.rank_finish[t.dst] = std::max(res_.rank_finish[t.dst], end);
      for (int c = t.chunk; c < t.chunk + t.count; ++c) rd(t.dst, c) = std::max(rd(t.dst, c), end);
      if (pre) res_.pre_arrival_time = std::max(res_.pre_arrival_time, end);
    }
    // A rank is busy until all of its messages of the round are done.
    for (const Transfer& t : rt) {
      free_at_[t.src] = std::max(free_at_[t.src], res_.rank_finish[t.src]);
      free_at_[t.dst] = std::max(free_at_[t.dst], res_.rank_finish[t.dst]);
    }
  }

  // Dataflow readiness time of chunk c on rank r.
  double& rd(int r, int c) { return ready_[static_cast<size_t>(r) * s_.num_chunks + c]; }

  const Schedule& s_;
  const SimOptions& o_;
  const int n_;
  const std::vector<double>& slow_;
  const std::vector<double> arrival_;
  std::vector<double> prefix_;
  double scale_ = 0.0;
  std::vector<RoundSpan> spans_;
  std::vector<Transfer> round_buf_, scratch_;
  SimResult res_;
  std::vector<double> sent_total_, send_load_, recv_load_;
  std::vector<double> nic_send_, nic_recv_;  // two-level model: per host
  bool crosses_network_ = false;             // the round has a transfer between hosts
  std::vector<double> free_at_, ready_, start_;  // dataflow state
};

}  // namespace

SimResult simulate(const Schedule& s, const SimOptions& o) {
  s.validate_structure();
  check_options(s, o);
  return Simulation(s, o).run();
}

}  // namespace core
}  // namespace stragg
