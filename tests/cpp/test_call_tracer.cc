// The session's CallTracer hooks (session/call_tracer.h) without torch: threads play the ranks
// over the in-process shared memory transport. What a tracer hears, in which order, with which
// record: the straggler's plan has no pre-arrival steps, the others' have; dynamic mode agrees
// first; a call without a tracer runs as before.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "session/session.h"
#include "test_util.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

// Writes down every hook as "name" (plus what the record says where it matters).
class Recorder final : public CallTracer {
 public:
  std::vector<std::string> heard;
  uint64_t seq = 0;
  std::string plan;
  int straggler = -2;

  void queued(const CallRecord& r) override {
    heard.push_back("queued");
    seq = r.seq;
  }
  void agreement_begin(const CallRecord&) override { heard.push_back("agreement_begin"); }
  void agreement_end(const CallRecord&) override { heard.push_back("agreement_end"); }
  void run_begin(const CallRecord& r, bool pre_arrival) override {
    heard.push_back(pre_arrival ? "run_begin pre" : "run_begin");
    plan = r.schedule_name;
    straggler = r.straggler;
  }
  void pre_arrival_end(const CallRecord&) override { heard.push_back("pre_arrival_end"); }
  void run_end(const CallRecord&, bool ok) override {
    heard.push_back(ok ? "run_end ok" : "run_end failed");
  }
};

SessionOptions options(int rank, int size, Settings settings) {
  SessionOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = std::chrono::seconds(60);
  o.group_name = "test";
  o.settings = settings;
  return o;
}

// One all_reduce of `numel` ones, traced by `tracer` (may be null); returns its error.
std::exception_ptr all_reduce(Session& s, std::vector<float>& b, std::shared_ptr<Recorder> tracer) {
  auto promise = std::make_shared<std::promise<std::exception_ptr>>();
  AllreduceCall call;
  call.data = b.data();
  call.numel = b.size();
  call.timeout = std::chrono::seconds(60);
  call.tracer = std::move(tracer);
  call.done = [promise](std::exception_ptr e) { promise->set_value(e); };
  s.submit(std::move(call));
  return promise->get_future().get();
}

TEST(CallTracer, StragglarRanksOnTimeHearTheirPreArrivalStepsEnd) {
  const int n = 4, late = 2;
  InMemoryRendezvous rdv;
  std::vector<std::shared_ptr<Recorder>> rec(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.algo = Algorithm::Stragglar;
    s.straggler = Straggler::of_rank(late);
    Session session(rdv, options(r, n, s));
    std::vector<float> b(1 << 16, 1.0f);  // above the inline size: runs on the worker
    EXPECT_EQ(all_reduce(session, b, nullptr), nullptr);  // untraced: call #0
    EXPECT_EQ(b[0], 4.0f);
    b.assign(b.size(), 1.0f);
    rec[r] = std::make_shared<Recorder>();
    if (r == late) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(all_reduce(session, b, rec[r]), nullptr);
    EXPECT_EQ(b[0], 4.0f);
  });
  for (int r = 0; r < n; ++r) {
    const std::vector<std::string> want =
        r == late ? std::vector<std::string>{"queued", "run_begin", "run_end ok"}
                  : std::vector<std::string>{"queued", "run_begin pre", "pre_arrival_end",
                                             "run_end ok"};
    EXPECT_EQ(rec[r]->heard, want) << "rank " << r;
    EXPECT_EQ(rec[r]->seq, 1u) << "rank " << r;
    EXPECT_EQ(rec[r]->plan.rfind("stragglar", 0), 0u) << "rank " << r << ": " << rec[r]->plan;
    EXPECT_EQ(rec[r]->straggler, late) << "rank " << r;
  }
}

TEST(CallTracer, DynamicModeAgreesBeforeTheRun) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<std::shared_ptr<Recorder>> rec(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.straggler = Straggler::dynamic();
    s.dynamic_window_us = 0;
    Session session(rdv, options(r, n, s));
    std::vector<float> b(4096, 1.0f);
    rec[r] = std::make_shared<Recorder>();
    EXPECT_EQ(all_reduce(session, b, rec[r]), nullptr);
    EXPECT_EQ(b[0], 3.0f);
  });
  for (int r = 0; r < n; ++r) {
    const auto& h = rec[r]->heard;
    ASSERT_GE(h.size(), 4u) << "rank " << r;
    EXPECT_EQ(h[0], "queued");
    EXPECT_EQ(h[1], "agreement_begin");
    EXPECT_EQ(h[2], "agreement_end");
    EXPECT_EQ(h[3].rfind("run_begin", 0), 0u) << h[3];
    EXPECT_EQ(h.back(), "run_end ok");
  }
}

}  // namespace
}  // namespace stragg
