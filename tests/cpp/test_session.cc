// The session without torch: threads play the ranks of one group over the in-process shared
// memory transport (same host), an in-memory rendezvous stands in for the c10d store.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "session/session.h"
#include "test_util.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

SessionOptions options(int rank, int size, Settings settings = Settings{},
                       std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  SessionOptions o;
  o.rank = rank;
  o.size = size;
  o.timeout = timeout;
  o.group_name = "test";
  settings.shm_slot_bytes = 8192;  // small slots: larger calls stream through many pieces
  o.settings = settings;
  return o;
}

// Submits an all_reduce and returns a future that holds its error (nullptr: success).
std::future<std::exception_ptr> submit(Session& s, void* data, size_t numel, DType dtype,
                                       ReduceOp op = ReduceOp::Sum,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto promise = std::make_shared<std::promise<std::exception_ptr>>();
  AllreduceCall call;
  call.data = data;
  call.numel = numel;
  call.dtype = dtype;
  call.op = op;
  call.timeout = timeout;
  call.done = [promise](std::exception_ptr e) { promise->set_value(e); };
  s.submit(std::move(call));
  return promise->get_future();
}

std::string message(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "";
}

double value(int rank, size_t i) { return static_cast<double>((rank * 7 + i * 3) % 23) - 11; }

TEST(Session, SumAndMaxMatchTheReferenceAndAreBitwiseIdentical) {
  const int n = 4;
  InMemoryRendezvous rdv;
  const std::vector<size_t> sizes = {0, 1, 7, 5003, 200000};
  std::vector<std::vector<std::vector<float>>> out(n);
  std::vector<std::vector<CallRecord>> records(n);
  run_ranks(n, [&](int r) {
    Session s(rdv, options(r, n));
    EXPECT_EQ(s.transport_name(), "shm");
    EXPECT_EQ(s.path(), AllreducePath::Executor);
    std::vector<std::vector<float>> bufs;
    for (size_t numel : sizes) {
      std::vector<float> b(numel);
      for (size_t i = 0; i < numel; ++i) b[i] = static_cast<float>(value(r, i));
      bufs.push_back(b);
    }
    std::vector<std::future<std::exception_ptr>> done;
    for (auto& b : bufs) done.push_back(submit(s, b.data(), b.size(), DType::Float32));
    std::vector<float> mx(100);
    for (size_t i = 0; i < mx.size(); ++i) mx[i] = static_cast<float>(value(r, i));
    done.push_back(submit(s, mx.data(), mx.size(), DType::Float32, ReduceOp::Max));
    for (auto& f : done) EXPECT_EQ(f.get(), nullptr);
    bufs.push_back(mx);
    out[r] = bufs;
    records[r] = s.recent_calls();
    auto stats = s.stats();
    EXPECT_EQ(stats["allreduce_calls"], static_cast<int64_t>(sizes.size() + 1));
    // The transport's own counters (Transport::stats) are part of the session's.
    EXPECT_GT(stats["shm_slot_bytes"], 0);
    EXPECT_EQ(stats["shm_peers"], n - 1);
    EXPECT_EQ(stats["tcp_peers"], 0);
  });
  for (size_t c = 0; c < sizes.size(); ++c) {
    for (size_t i = 0; i < sizes[c]; ++i) {
      double ref = 0;
      for (int r = 0; r < n; ++r) ref += value(r, i);
      ASSERT_EQ(out[0][c][i], static_cast<float>(ref)) << "call " << c << " element " << i;
    }
  }
  for (size_t i = 0; i < 100; ++i) {
    double ref = value(0, i);
    for (int r = 1; r < n; ++r) ref = std::max(ref, value(r, i));
    ASSERT_EQ(out[0][sizes.size()][i], static_cast<float>(ref));
  }
  for (int r = 1; r < n; ++r) {
    for (size_t c = 0; c < out[0].size(); ++c) {
      if (out[0][c].empty()) continue;  // memcmp of null pointers is undefined
      ASSERT_EQ(0, std::memcmp(out[r][c].data(), out[0][c].data(), out[0][c].size() * 4))
          << "rank " << r << " call " << c;
    }
  }
  // Records: one per call, in issue order, with what ran.
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(records[r].size(), sizes.size() + 1);
    for (size_t c = 0; c < records[r].size(); ++c) {
      EXPECT_EQ(records[r][c].seq, c);
      EXPECT_TRUE(records[r][c].ok);
      EXPECT_FALSE(records[r][c].algorithm.empty());
      EXPECT_EQ(records[r][c].algorithm, records[0][c].algorithm);
    }
  }
}

TEST(Session, AverageAndPremulAreAppliedAroundTheSum) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<std::vector<double>> out(n);
  run_ranks(n, [&](int r) {
    Session s(rdv, options(r, n));
    std::vector<double> avg(10, r + 1.0), pre(10, r + 1.0);
    auto promise_avg = std::make_shared<std::promise<std::exception_ptr>>();
    AllreduceCall a;
    a.data = avg.data();
    a.numel = avg.size();
    a.dtype = DType::Float64;
    a.average = true;
    a.timeout = std::chrono::seconds(60);
    a.done = [promise_avg](std::exception_ptr e) { promise_avg->set_value(e); };
    s.submit(std::move(a));
    auto promise_pre = std::make_shared<std::promise<std::exception_ptr>>();
    AllreduceCall p;
    p.data = pre.data();
    p.numel = pre.size();
    p.dtype = DType::Float64;
    p.premul = true;
    p.premul_factor = 0.5;
    p.timeout = std::chrono::seconds(60);
    p.done = [promise_pre](std::exception_ptr e) { promise_pre->set_value(e); };
    s.submit(std::move(p));
    EXPECT_EQ(promise_avg->get_future().get(), nullptr);
    EXPECT_EQ(promise_pre->get_future().get(), nullptr);
    out[r] = {avg[0], pre[0]};
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r][0], 2.0);  // (1 + 2 + 3) / 3
    EXPECT_EQ(out[r][1], 3.0);  // 0.5 * (1 + 2 + 3)
  }
}

TEST(Session, SettingsThatMustMatchAreCheckedAtSetup) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.algo = r == 2 ? Algorithm::Rhd : Algorithm::Ring;
    try {
      Session session(rdv, options(r, n, s));
    } catch (const SettingsError& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r].find("STRAGG_ALGO mismatch"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("'rhd'"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("'ring'"), std::string::npos) << errors[r];
  }
}

TEST(Session, ConfiguredStragglerRunsStragglar) {
  const int n = 4;
  InMemoryRendezvous rdv;
  std::vector<std::string> algos(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.straggler = Straggler::of_rank(2);
    Session session(rdv, options(r, n, s));
    std::vector<float> b(1000, 1.0f);
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(submit(session, b.data(), b.size(), DType::Float32).get(), nullptr);
    EXPECT_EQ(b[0], 4.0f);
    algos[r] = session.recent_calls().back().algorithm;
    EXPECT_EQ(session.recent_calls().back().straggler, 2);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(algos[r], "stragglar");
}

TEST(Session, ProfilerFindsAPersistentStraggler) {
  // n = 4 and 1 MiB: there StragglAR's post-arrival rounds (4 of s/3) beat RHD's (1.5 s) under the
  // model, so the planner runs it for the profiled straggler (at n = 3 and for small calls the
  // model prefers Ring / recursive doubling even for a late rank; see the next test).
  const int n = 4;
  InMemoryRendezvous rdv;
  std::vector<int> found(n, -1);
  std::vector<std::string> last_algo(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.profile_every = 4;
    s.profile_window = 8;
    s.probe_every = 0;
    // The plan check times the move and may undo it on a loaded machine (under ASan it did):
    // this test is about the profiler's verdict and the planner acting on it.
    s.plan_check = false;
    Session session(rdv, options(r, n, s));
    std::vector<float> b(1 << 18, 1.0f);
    for (int call = 0; call < 24; ++call) {
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      EXPECT_EQ(submit(session, b.data(), b.size(), DType::Float32).get(), nullptr);
    }
    bool enabled = false;
    found[r] = session.profiler_summary(&enabled).straggler;
    EXPECT_TRUE(enabled);
    last_algo[r] = session.recent_calls().back().algorithm;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(found[r], 1) << "rank " << r;
    EXPECT_EQ(last_algo[r], "stragglar") << "rank " << r;
  }
}

TEST(Session, DynamicStragglerIsAgreedPerCall) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<int> agreed(n, -2);
  run_ranks(n, [&](int r) {
    Settings s;
    s.straggler = Straggler::dynamic();
    s.dynamic_window_us = 0;  // go without the last rank at once
    Session session(rdv, options(r, n, s));
    std::vector<float> b(4096, 1.0f);
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(submit(session, b.data(), b.size(), DType::Float32).get(), nullptr);
    EXPECT_EQ(b[0], 3.0f);
    agreed[r] = session.recent_calls().back().straggler;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(agreed[r], 0) << "rank " << r;
}

TEST(Session, MissingRankIsNamedAtTheTimeout) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.profile = false;
    Session session(rdv, options(r, n, s));
    if (r == 2) return;  // never calls all_reduce (its session drains nothing)
    std::vector<float> b(64, 1.0f);
    errors[r] = message(
        submit(session, b.data(), b.size(), DType::Float32, ReduceOp::Sum,
               std::chrono::milliseconds(300))
            .get());
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("rank 2 has not called all_reduce #0"), std::string::npos)
        << errors[r];
  }
}

std::future<std::exception_ptr> barrier(Session& s, std::chrono::milliseconds timeout =
                                                            std::chrono::seconds(60)) {
  auto promise = std::make_shared<std::promise<std::exception_ptr>>();
  s.barrier(timeout, [promise](std::exception_ptr e) { promise->set_value(e); });
  return promise->get_future();
}

// A barrier runs behind the calls queued before it, and no rank leaves it before the last one
// entered; it is neither an all_reduce record nor an all_reduce count.
TEST(Session, BarrierWaitsForEveryRankAndForTheQueuedCalls) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::atomic<int> entered{0};
  std::vector<int> entered_when_left(n, -1);
  std::vector<int> call_done_first(n, 0);  // not vector<bool>: ranks write their own entries
  std::vector<std::map<std::string, int64_t>> stats(n);
  std::vector<size_t> records(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.profile = false;
    Session session(rdv, options(r, n, s));
    std::this_thread::sleep_for(std::chrono::milliseconds(50 * r));
    entered.fetch_add(1);
    EXPECT_EQ(barrier(session).get(), nullptr);
    entered_when_left[r] = entered.load();
    // A large call (queued on the worker) and a barrier behind it.
    std::vector<float> b(1 << 18, 1.0f);
    std::atomic<bool> call_done{false};
    auto promise = std::make_shared<std::promise<std::exception_ptr>>();
    AllreduceCall call;
    call.data = b.data();
    call.numel = b.size();
    call.timeout = std::chrono::seconds(60);
    call.done = [&call_done, promise](std::exception_ptr e) {
      call_done.store(true);
      promise->set_value(e);
    };
    session.submit(std::move(call));
    EXPECT_EQ(barrier(session).get(), nullptr);
    call_done_first[r] = call_done.load() ? 1 : 0;
    EXPECT_EQ(promise->get_future().get(), nullptr);
    EXPECT_EQ(b[0], static_cast<float>(n));
    stats[r] = session.stats();
    records[r] = session.recent_calls().size();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(entered_when_left[r], n) << "rank " << r << " left before every rank entered";
    EXPECT_TRUE(call_done_first[r]) << "rank " << r;
    EXPECT_EQ(stats[r]["barrier_calls"], 2) << "rank " << r;
    EXPECT_EQ(stats[r]["allreduce_calls"], 1) << "rank " << r;
    EXPECT_EQ(records[r], 1u) << "rank " << r;
  }
}

TEST(Session, BarrierNamesTheMissingRankAndRefusesAfterAbort) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(n), later(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.profile = false;
    Session session(rdv, options(r, n, s));
    if (r == 2) return;  // never calls the barrier
    errors[r] = message(barrier(session, std::chrono::milliseconds(300)).get());
    try {
      barrier(session);
    } catch (const Error& e) {
      later[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("stragg: rank " + std::to_string(r) +
                             ": barrier before the first call"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("rank 2 has not called barrier before the first call"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(later[r].find("barrier on a process group that was aborted"), std::string::npos)
        << later[r];
  }
}

TEST(Session, AbortFailsQueuedCallsAndLaterCallsRaise) {
  const int n = 2;
  InMemoryRendezvous rdv;
  std::vector<std::string> first(n), later(n);
  run_ranks(n, [&](int r) {
    Session session(rdv, options(r, n));
    std::vector<float> b(64, 1.0f);
    EXPECT_EQ(submit(session, b.data(), b.size(), DType::Float32).get(), nullptr);
    if (r == 0) {
      session.abort("the user aborted the group");
      try {
        submit(session, b.data(), b.size(), DType::Float32);
      } catch (const Error& e) {
        later[r] = e.what();
      }
    } else {
      // Fails in the executor, or at submit when rank 0's abort arrived first.
      try {
        first[r] = message(submit(session, b.data(), b.size(), DType::Float32).get());
      } catch (const Error& e) {
        first[r] = e.what();
      }
    }
  });
  EXPECT_NE(later[0].find("aborted"), std::string::npos) << later[0];
  EXPECT_NE(first[1].find("the user aborted the group"), std::string::npos) << first[1];
}

// After an executor failure (here rank 1's numel differs) every rank refuses every later call at
// once, naming the original cause, and failure() says so for the adapter's other collectives.
TEST(Session, AfterAFailureEveryCallRaisesAtOnceWithTheOriginalCause) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<std::string> first(n), later(n), failure(n);
  run_ranks(n, [&](int r) {
    Session session(rdv, options(r, n));
    std::vector<float> b(r == 1 ? 65 : 64, 1.0f);
    try {  // fails in the executor, or at submit where a peer's abort arrived first
      first[r] = message(submit(session, b.data(), b.size(), DType::Float32).get());
    } catch (const Error& e) {
      first[r] = e.what();
    }
    EXPECT_TRUE(testing::eventually_true([&] { return session.failure().has_value(); }));
    failure[r] = session.failure().value_or("");
    const auto t0 = std::chrono::steady_clock::now();
    try {
      submit(session, b.data(), 64, DType::Float32);
    } catch (const Error& e) {
      later[r] = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "not at once";
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(first[r].find("mismatch"), std::string::npos) << first[r];
    EXPECT_EQ(failure[r].find("aborted: rank "), 0u) << failure[r];
    EXPECT_NE(failure[r].find("numel"), std::string::npos) << failure[r];
    EXPECT_EQ(later[r].find("stragg: rank " + std::to_string(r) +
                            ": all_reduce on a process group that was aborted: rank "),
              0u)
        << later[r];
    EXPECT_NE(later[r].find("mismatch"), std::string::npos) << later[r];
  }
}

// Without a transport (all_reduce delegated) abort() and shutdown() still fail later calls.
TEST(Session, DelegatePathRefusesCallsAfterAbortOrShutdown) {
  InMemoryRendezvous rdv;
  run_ranks(2, [&](int r) {
    Settings s;
    s.transport = TransportChoice::Gloo;
    Session session(rdv, options(r, 2, s));
    EXPECT_FALSE(session.failure().has_value());
    if (r == 0) {
      session.abort("the user aborted the group");
      EXPECT_EQ(session.failure().value_or(""), "aborted: rank 0: the user aborted the group");
    } else {
      session.shutdown("the process group was destroyed");
      EXPECT_EQ(session.failure().value_or(""), "shut down");
    }
    std::vector<float> b(4, 1.0f);
    EXPECT_THROW(submit(session, b.data(), b.size(), DType::Float32), Error);
  });
}

TEST(Session, ShutdownRunsTheCallsStillQueued) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<std::vector<float>> out(n);
  run_ranks(n, [&](int r) {
    auto session = std::make_unique<Session>(rdv, options(r, n));
    std::vector<std::vector<float>> bufs(6, std::vector<float>(10000, 1.0f));
    std::vector<std::future<std::exception_ptr>> done;
    for (auto& b : bufs) done.push_back(submit(*session, b.data(), b.size(), DType::Float32));
    session->shutdown("the process group was destroyed");
    for (auto& f : done) EXPECT_EQ(f.get(), nullptr);
    for (auto& b : bufs) out[r].push_back(b[9999]);
  });
  for (int r = 0; r < n; ++r) {
    for (float v : out[r]) EXPECT_EQ(v, 3.0f);
  }
}

TEST(Session, DelegatePathRunsTheCallersReduction) {
  const int n = 2;
  InMemoryRendezvous rdv;
  std::atomic<int> delegated{0};
  run_ranks(n, [&](int r) {
    Settings s;
    s.transport = TransportChoice::Gloo;
    Session session(rdv, options(r, n, s));
    EXPECT_EQ(session.path(), AllreducePath::Delegate);
    EXPECT_EQ(session.transport_name(), "gloo");
    std::vector<double> b(4, 3.0);
    auto promise = std::make_shared<std::promise<std::exception_ptr>>();
    AllreduceCall call;
    call.data = b.data();
    call.numel = b.size();
    call.dtype = DType::Float64;
    call.average = true;
    call.timeout = std::chrono::seconds(10);
    // Stands in for the inner Gloo backend: the sum of two ranks holding 3.0.
    call.delegate = [&delegated, &b] {
      delegated.fetch_add(1);
      for (double& x : b) x *= 2;
    };
    call.done = [promise](std::exception_ptr e) { promise->set_value(e); };
    session.submit(std::move(call));
    EXPECT_EQ(promise->get_future().get(), nullptr);
    EXPECT_EQ(b[0], 3.0);  // (3 + 3) / 2
    EXPECT_EQ(session.recent_calls().back().algorithm, "gloo");
  });
  EXPECT_EQ(delegated.load(), n);
}

TEST(Session, LinkProbeFillsTheMatrix) {
  const int n = 3;
  InMemoryRendezvous rdv;
  run_ranks(n, [&](int r) {
    Session session(rdv, options(r, n));
    std::promise<std::exception_ptr> p;
    session.measure_links([&p](std::exception_ptr e) { p.set_value(e); });
    EXPECT_EQ(p.get_future().get(), nullptr);
    const auto m = session.link_matrix();
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        const LinkModel& l = m[static_cast<size_t>(i) * n + j];
        if (i == j) {
          EXPECT_LT(l.alpha_s, 0);
        } else {
          EXPECT_GT(l.alpha_s, 0) << i << "->" << j;
          EXPECT_GT(l.beta_s_per_byte, 0) << i << "->" << j;
        }
      }
    }
    std::string source;
    session.link_model(&source);
    EXPECT_EQ(source, "measured");
  });
}

// The CUDA path's calls run in the session's order after a header exchange on the CPU transport.
TEST(Session, ExternalCallsAreOrderedAndTheirHeadersChecked) {
  const int n = 3;
  InMemoryRendezvous rdv;
  std::vector<std::vector<std::string>> order(n);
  std::vector<std::string> mismatch(n);
  run_ranks(n, [&](int r) {
    Settings s;
    s.straggler = Straggler::of_rank(1);
    Session session(rdv, options(r, n, s));
    std::vector<float> b(64, 1.0f);
    std::mutex mu;
    auto cpu = submit(session, b.data(), b.size(), DType::Float32);
    std::promise<std::exception_ptr> ext;
    ExternalCall call;
    call.numel = 1 << 20;
    call.dtype = DType::Float16;
    call.timeout = std::chrono::seconds(30);
    call.run = [&](const PlanChoice* choice, uint64_t seq) {
      std::lock_guard<std::mutex> lock(mu);
      ASSERT_NE(choice, nullptr);
      order[r].push_back("gpu #" + std::to_string(seq) + " " + choice->describe());
    };
    call.done = [&ext](std::exception_ptr e) { ext.set_value(e); };
    session.submit_external(call);
    EXPECT_EQ(cpu.get(), nullptr);
    EXPECT_EQ(ext.get_future().get(), nullptr);
    // A rank that disagrees on the dtype: every rank raises naming it.
    std::promise<std::exception_ptr> bad;
    ExternalCall wrong = call;
    wrong.dtype = r == 2 ? DType::BFloat16 : DType::Float16;
    wrong.run = [](const PlanChoice*, uint64_t) { ADD_FAILURE() << "ran despite the mismatch"; };
    wrong.done = [&bad](std::exception_ptr e) { bad.set_value(e); };
    session.submit_external(wrong);
    mismatch[r] = message(bad.get_future().get());
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(order[r].size(), 1u);
    EXPECT_EQ(order[r][0], "gpu #1 stragglar(1)") << r;  // after the CPU call #0
    // Every rank names the ranks and values (rank 2 is the odd one out).
    EXPECT_NE(mismatch[r].find("all_reduce #2 (gpu) mismatch with rank"), std::string::npos)
        << mismatch[r];
    EXPECT_NE(mismatch[r].find("dtype float16 (rank "), std::string::npos) << mismatch[r];
    EXPECT_NE(mismatch[r].find("vs bfloat16 (rank 2)"), std::string::npos) << mismatch[r];
  }
}

TEST(Session, OneRankRunsLocally) {
  InMemoryRendezvous rdv;
  Session s(rdv, options(0, 1));
  EXPECT_EQ(s.path(), AllreducePath::Local);
  EXPECT_EQ(s.transport_name(), "local");
  std::vector<int64_t> b = {4, -6};
  auto promise = std::make_shared<std::promise<std::exception_ptr>>();
  AllreduceCall call;
  call.data = b.data();
  call.numel = 2;
  call.dtype = DType::Int64;
  call.average = true;
  call.done = [promise](std::exception_ptr e) { promise->set_value(e); };
  s.submit(std::move(call));
  EXPECT_EQ(promise->get_future().get(), nullptr);
  EXPECT_EQ(b[0], 4);
  EXPECT_EQ(b[1], -6);
}

}  // namespace
}  // namespace stragg
