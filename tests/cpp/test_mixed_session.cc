// Group setup picks the transport from the host layout (group_setup.cc), tested with sessions
// whose rank threads play several hosts (common/host_identity.h: ScopedHostIdentity) and talk
// TCP over 127.0.0.1: shm on one host, TCP when every rank is alone on its host, the mixed
// transport otherwise; forcing values and their errors; the per-peer stats; the dynamic
// straggler on a store board (the mixed transport has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/host_identity.h"
#include "plan/link_probe.h"
#include "session/session.h"
#include "test_util.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

SessionOptions options(int rank, int size, Settings settings = Settings{}) {
  SessionOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = std::chrono::seconds(60);
  o.group_name = "mixed-test";
  settings.tcp_host = "127.0.0.1";
  settings.shm_slot_bytes = 8192;
  settings.profile = false;
  o.settings = settings;
  return o;
}

std::exception_ptr all_reduce(Session& s, std::vector<float>& b) {
  std::promise<std::exception_ptr> done;
  AllreduceCall call;
  call.data = b.data();
  call.numel = b.size();
  call.dtype = DType::Float32;
  call.timeout = std::chrono::seconds(60);
  call.done = [&done](std::exception_ptr e) { done.set_value(e); };
  s.submit(std::move(call));
  return done.get_future().get();
}

float value(int rank, size_t i) { return static_cast<float>((rank * 5 + i * 3) % 19); }

// Every rank of `letters` (one host letter per rank) builds a session and all_reduces once;
// returns the transport names, after checking the results (exact, bitwise identical).
std::vector<std::string> run_layout(const std::string& letters, Settings settings = Settings{},
                                    std::vector<std::map<std::string, int64_t>>* stats = nullptr) {
  const int n = static_cast<int>(letters.size());
  const size_t numel = 30001;
  InMemoryRendezvous rdv;
  std::vector<std::string> names(n);
  std::vector<std::vector<float>> out(n);
  if (stats) stats->assign(n, {});
  run_ranks(n, [&](int r) {
    ScopedHostIdentity host(std::string("host-") + letters[r]);
    Session s(rdv, options(r, n, settings));
    names[r] = s.transport_name();
    out[r].resize(numel);
    for (size_t i = 0; i < numel; ++i) out[r][i] = value(r, i);
    EXPECT_EQ(all_reduce(s, out[r]), nullptr) << "rank " << r;
    if (stats) (*stats)[r] = s.stats();
  });
  for (size_t i = 0; i < numel; ++i) {
    float ref = 0;
    for (int r = 0; r < n; ++r) ref += value(r, i);
    EXPECT_EQ(out[0][i], ref) << letters << " element " << i;
    if (out[0][i] != ref) break;
  }
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(0, std::memcmp(out[r].data(), out[0].data(), numel * sizeof(float)))
        << letters << ": rank " << r << " differs";
  }
  return names;
}

TEST(MixedSession, AutoPicksTheTransportFromTheHostLayout) {
  using V = std::vector<std::string>;
  EXPECT_EQ(run_layout("AAA"), (V{"shm", "shm", "shm"}));
  EXPECT_EQ(run_layout("ABC"), (V{"tcp", "tcp", "tcp"}));
  EXPECT_EQ(run_layout("AABB"), (V(4, "mixed")));
  EXPECT_EQ(run_layout("ABABB"), (V(5, "mixed")));
  EXPECT_EQ(run_layout("AAB"), (V(3, "mixed")));  // rank 2 alone, ranks 0 and 1 share
}

TEST(MixedSession, StatsNameEachPeersTransport) {
  std::vector<std::map<std::string, int64_t>> stats;
  run_layout("ABAB", Settings{}, &stats);
  // Rank 1 shares host B with rank 3.
  EXPECT_EQ(stats[1]["peer_transport.3"], 1);  // shm
  EXPECT_EQ(stats[1]["peer_transport.0"], 2);  // tcp
  EXPECT_EQ(stats[1]["peer_transport.2"], 2);
  EXPECT_EQ(stats[1].count("peer_transport.1"), 0u);
  EXPECT_EQ(stats[1]["shm_peers"], 1);
  EXPECT_EQ(stats[1]["tcp_peers"], 2);
  EXPECT_EQ(stats[1]["host_index"], 1);
  EXPECT_EQ(stats[0]["host_index"], 0);
  EXPECT_EQ(stats[1]["hosts"], 2);
  std::vector<std::map<std::string, int64_t>> tcp;
  run_layout("AB", Settings{}, &tcp);
  EXPECT_EQ(tcp[0]["peer_transport.1"], 2);
  EXPECT_EQ(tcp[0]["tcp_peers"], 1);
  EXPECT_EQ(tcp[0].count("hosts"), 0u);
}

TEST(MixedSession, MixedCanBeForcedOnAnyLayout) {
  Settings s;
  s.transport = TransportChoice::Mixed;
  EXPECT_EQ(run_layout("AAA", s), std::vector<std::string>(3, "mixed"));  // all peers over shm
  EXPECT_EQ(run_layout("AB", s), std::vector<std::string>(2, "mixed"));   // all over TCP
}

// Setup on every rank of `letters` that is expected to fail; returns the messages.
std::vector<std::string> failing_setup(const std::string& letters, const Settings& settings,
                                       bool with_address) {
  const int n = static_cast<int>(letters.size());
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    ScopedHostIdentity host(std::string("host-") + letters[r]);
    SessionOptions o = options(r, n, settings);
    if (!with_address) o.settings.tcp_host.clear();  // and no store host: no address
    try {
      Session s(rdv, o);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  return errors;
}

TEST(MixedSession, ForcingAnImpossibleTransportRaisesOnEveryRank) {
  Settings mixed;
  mixed.transport = TransportChoice::Mixed;
  auto errors = failing_setup("AAB", mixed, false);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[r], "stragg: rank " + std::to_string(r) +
                             ": STRAGG_TRANSPORT=mixed needs every rank's address: set "
                             "STRAGG_TCP_HOST (or use a TCPStore / MASTER_ADDR, whose route "
                             "picks it)");
  }
  Settings shm;
  shm.transport = TransportChoice::Shm;
  errors = failing_setup("ABA", shm, true);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("STRAGG_TRANSPORT=shm but the ranks are not on one host"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("ranks per host: [[0, 2], [1]]"), std::string::npos) << errors[r];
  }
}

TEST(MixedSession, WithoutAddressesAutoFallsBackToGlooAcrossHosts) {
  InMemoryRendezvous rdv;
  std::vector<std::string> names(4);
  run_ranks(4, [&](int r) {
    ScopedHostIdentity host(std::string("host-") + "AABB"[r]);
    SessionOptions o = options(r, 4);
    o.settings.tcp_host.clear();
    Session s(rdv, o);
    names[r] = s.transport_name();
  });
  EXPECT_EQ(names, std::vector<std::string>(4, "gloo"));
}

// The link probes measure every link, but only the links between hosts describe the network:
// the analysis (degraded ranks, reference model) leaves the host mates' shared memory out.
TEST(MixedSession, LinkAnalysisLooksAtLinksBetweenHostsOnly) {
  const int n = 4;
  const std::string letters = "AAAB";  // rank 3 alone on host B
  InMemoryRendezvous rdv;
  std::vector<LinkAnalysis> analysis(n);
  std::vector<std::vector<LinkModel>> matrix(n);
  run_ranks(n, [&](int r) {
    ScopedHostIdentity host(std::string("host-") + letters[r]);
    Session s(rdv, options(r, n));
    std::promise<std::exception_ptr> done;
    s.measure_links([&done](std::exception_ptr e) { done.set_value(e); });
    EXPECT_EQ(done.get_future().get(), nullptr);
    analysis[r] = s.link_analysis();
    matrix[r] = s.link_matrix();
  });
  const auto& m = matrix[0];
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      EXPECT_GE(m[i * n + j].alpha_s, 0) << i << " -> " << j << " not measured";
    }
  }
  const LinkAnalysis& a = analysis[0];
  for (int r = 0; r < 3; ++r) {  // host A's only links off the host go to rank 3
    EXPECT_EQ(a.send_beta[r], m[r * n + 3].beta_s_per_byte) << "rank " << r;
    EXPECT_EQ(a.recv_beta[r], m[3 * n + r].beta_s_per_byte) << "rank " << r;
  }
  // Rank 3's send side: the lower median (the 2nd of 3) of its links to host A.
  std::vector<double> from_3;
  for (int j = 0; j < 3; ++j) from_3.push_back(m[3 * n + j].beta_s_per_byte);
  std::sort(from_3.begin(), from_3.end());
  EXPECT_EQ(a.send_beta[3], from_3[1]);
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(analysis[r].send_beta, a.send_beta) << "ranks disagree";
    EXPECT_EQ(analysis[r].degraded.size(), a.degraded.size());
  }
}

// An arrival board shared by the rank threads (the backend's stands on the c10d store).
class SharedBoard {
 public:
  class View final : public ArrivalBoard {
   public:
    View(SharedBoard& b, int rank) : b_(b), rank_(rank) {}
    int arrive(uint64_t seq) override {
      std::lock_guard<std::mutex> lock(b_.mu_);
      auto& a = b_.arrivals_[seq];
      a.push_back(rank_);
      return static_cast<int>(a.size()) - 1;
    }
    int missing_rank(uint64_t seq) override {
      std::lock_guard<std::mutex> lock(b_.mu_);
      const auto& a = b_.arrivals_[seq];
      if (static_cast<int>(a.size()) < b_.n_ - 1) return -1;
      for (int q = 0; q < b_.n_; ++q) {
        if (std::find(a.begin(), a.end(), q) == a.end()) return q;
      }
      return -1;
    }
    int decide(uint64_t seq, int proposal) override {
      std::lock_guard<std::mutex> lock(b_.mu_);
      return b_.decisions_.emplace(seq, proposal).first->second;
    }
    std::optional<int> decision(uint64_t seq) override {
      std::lock_guard<std::mutex> lock(b_.mu_);
      auto it = b_.decisions_.find(seq);
      if (it == b_.decisions_.end()) return std::nullopt;
      return it->second;
    }
    std::chrono::microseconds poll_interval() const override {
      return std::chrono::microseconds(1000);
    }

   private:
    SharedBoard& b_;
    int rank_;
  };
  explicit SharedBoard(int n) : n_(n) {}

 private:
  int n_;
  std::mutex mu_;
  std::map<uint64_t, std::vector<int>> arrivals_;
  std::map<uint64_t, int> decisions_;
};

TEST(MixedSession, DynamicStragglerIsAgreedOnTheStoreBoard) {
  const int n = 4;
  InMemoryRendezvous rdv;
  SharedBoard board(n);
  std::vector<int> agreed(n, -2);
  run_ranks(n, [&](int r) {
    ScopedHostIdentity host(std::string("host-") + "AABB"[r]);
    Settings s;
    s.straggler = Straggler::dynamic();
    s.dynamic_window_us = 0;  // go without the last rank at once
    SessionOptions o = options(r, n, s);
    o.make_store_board = [&board, r] { return std::make_unique<SharedBoard::View>(board, r); };
    Session session(rdv, o);
    EXPECT_EQ(session.transport_name(), "mixed");
    std::vector<float> b(4096, 1.0f);
    if (r == 3) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(all_reduce(session, b), nullptr);
    EXPECT_EQ(b[0], 4.0f);
    agreed[r] = session.recent_calls().back().straggler;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(agreed[r], 3) << "rank " << r;
}

}  // namespace
}  // namespace stragg
