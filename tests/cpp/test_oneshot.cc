// The one-shot all_reduce (Executor::run_oneshot over the shm transport's OneshotArea): results
// equal the rank-order fold on every rank, buffers are reused safely call after call, mixed with
// schedule runs, and every failure (mismatches, a missing rank, a bad size) names what happened.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "plan/planner.h"
#include "runtime/executor.h"
#include "runtime/reduce.h"
#include "test_util.h"
#include "transport/shm/shm_transport.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

ShmOptions with_oneshot(size_t bytes) {
  ShmOptions o;
  o.oneshot_bytes = bytes;
  return o;
}

// Rank r's input for call k: distinct, non-trivial values (sums are not exact in float).
template <class T>
std::vector<T> input(int r, int k, size_t numel) {
  std::vector<T> v(numel);
  for (size_t i = 0; i < numel; ++i) {
    v[i] = static_cast<T>(((r + 1) * 7919 + k * 104729 + static_cast<int>(i) * 31) % 1000) /
           static_cast<T>(7);
  }
  return v;
}

// The expected result: inputs folded left to right in rank order with the same kernels.
template <class T>
std::vector<T> fold(int n, int k, size_t numel, DType dt, ReduceOp op) {
  std::vector<T> acc = input<T>(0, k, numel);
  for (int q = 1; q < n; ++q) {
    const auto x = input<T>(q, k, numel);
    if (numel > 0) reduce_into(dt, op, acc.data(), x.data(), numel);
  }
  return acc;
}

template <class T>
void check_calls(int n, DType dt, ReduceOp op, const std::vector<size_t>& sizes, int calls) {
  InMemoryRendezvous rdv;
  std::vector<std::vector<std::vector<T>>> out(n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "os", r, n, with_oneshot(16384));
    Executor ex(t);
    for (int k = 0; k < calls; ++k) {
      const size_t numel = sizes[static_cast<size_t>(k) % sizes.size()];
      auto buf = input<T>(r, k, numel);
      CollectiveSpec spec;
      spec.seq = static_cast<uint64_t>(k);
      spec.numel = numel;
      spec.dtype = dt;
      spec.op = op;
      ex.run_oneshot(spec, buf.data(), static_cast<uint64_t>(k), std::chrono::seconds(20));
      out[r].push_back(std::move(buf));
    }
  });
  for (int k = 0; k < calls; ++k) {
    const size_t numel = sizes[static_cast<size_t>(k) % sizes.size()];
    const auto want = fold<T>(n, k, numel, dt, op);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(out[r][k].size(), numel);
      // (memcmp on an empty vector's data() would pass it a null pointer)
      if (numel > 0) {
        ASSERT_EQ(std::memcmp(out[r][k].data(), want.data(), numel * sizeof(T)), 0)
            << "n " << n << " call " << k << " rank " << r;
      }
    }
  }
}

TEST(Oneshot, FloatSumIsTheRankOrderFoldOnEveryRank) {
  for (int n : {1, 2, 3, 4, 8}) check_calls<float>(n, DType::Float32, ReduceOp::Sum, {1000}, 5);
}

TEST(Oneshot, OtherTypesAndOps) {
  check_calls<double>(4, DType::Float64, ReduceOp::Max, {3, 2048}, 4);
  check_calls<int32_t>(3, DType::Int32, ReduceOp::Min, {17, 4096}, 4);
  check_calls<int64_t>(5, DType::Int64, ReduceOp::Prod, {9}, 3);
}

TEST(Oneshot, ManyCallsReuseTheTwoBuffersSafely) {
  // Sizes change from call to call (0 and the full capacity included): a rank that rewrote a
  // buffer a slower peer still reads would show up as a wrong result (and under TSan as a race).
  check_calls<float>(4, DType::Float32, ReduceOp::Sum, {1, 4096, 0, 37, 2500}, 300);
}

TEST(Oneshot, InterleavesWithScheduleRuns) {
  const int n = 4;
  InMemoryRendezvous rdv;
  std::vector<std::vector<float>> out(n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "mix", r, n, with_oneshot(4096));
    Executor ex(t);
    uint64_t oneshots = 0;
    for (int k = 0; k < 40; ++k) {
      auto buf = input<float>(r, k, 500);
      CollectiveSpec spec;
      spec.seq = static_cast<uint64_t>(k);
      spec.numel = buf.size();
      if (k % 3 == 0) {
        ex.run(*small_allreduce_schedule(r, n, buf.size()), spec, buf.data(),
               std::chrono::seconds(20));
      } else {
        ex.run_oneshot(spec, buf.data(), oneshots++, std::chrono::seconds(20));
      }
      out[r].insert(out[r].end(), buf.begin(), buf.end());
    }
  });
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(std::memcmp(out[r].data(), out[0].data(), out[0].size() * sizeof(float)), 0) << r;
  }
  // The one-shot calls are the fold; spot-check one.
  const auto want = fold<float>(n, 1, 500, DType::Float32, ReduceOp::Sum);
  EXPECT_EQ(std::memcmp(out[0].data() + 500, want.data(), 500 * sizeof(float)), 0);
}

// Every rank runs the one-shot; rank 1's call differs as `bad` says.
std::vector<std::string> mismatch_errors(int n, const std::function<void(int, CollectiveSpec&)>& bad) {
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "mm", r, n, with_oneshot(4096));
    Executor ex(t);
    std::vector<double> buf(16, 1.0);
    CollectiveSpec spec;
    spec.numel = 10;
    spec.dtype = DType::Float64;
    bad(r, spec);
    try {
      ex.run_oneshot(spec, buf.data(), 0, std::chrono::seconds(20));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  return errors;
}

TEST(Oneshot, MismatchedNumelDtypeOpAreNamedOnEveryRank) {
  auto errors = mismatch_errors(3, [](int r, CollectiveSpec& s) {
    if (r == 1) s.numel = 11;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("mismatch with rank"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("numel"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("11 (rank 1)"), std::string::npos) << errors[r];
  }
  errors = mismatch_errors(2, [](int r, CollectiveSpec& s) {
    if (r == 1) {
      s.dtype = DType::Int64;
      s.op = ReduceOp::Max;
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("dtype float64 (rank 0) vs int64 (rank 1)"), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("op SUM (rank 0) vs MAX (rank 1)"), std::string::npos) << errors[r];
  }
  errors = mismatch_errors(2, [](int r, CollectiveSpec& s) {
    if (r == 1) s.seq = 5;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("sequence mismatch"), std::string::npos) << errors[r];
  }
}

TEST(Oneshot, PeerRunningAScheduleIsAMismatchNotAHang) {
  // Rank 1's call was too large for the one-shot (its numel differs): it runs recursive
  // doubling while the others wait in the one-shot. They notice its schedule and abort.
  const int n = 4;
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "sched", r, n, with_oneshot(4096));
    Executor ex(t);
    std::vector<float> buf(r == 1 ? 5000 : 100, 1.0f);
    CollectiveSpec spec;
    spec.numel = buf.size();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (r == 1) {
        ex.run(*small_allreduce_schedule(r, n, buf.size()), spec, buf.data(),
               std::chrono::seconds(30));
      } else {
        ex.run_oneshot(spec, buf.data(), 0, std::chrono::seconds(30));
      }
    } catch (const Error& e) {
      errors[r] = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "rank " << r;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[r].find("mismatch with rank 1: it runs this collective as a schedule"),
              std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

TEST(Oneshot, MissingRankTimesOutNamingIt) {
  InMemoryRendezvous rdv;
  const int n = 3;
  std::vector<std::string> errors(n);
  run_ranks(n, [&](int r) {
    ShmTransport t(rdv, "late", r, n, with_oneshot(4096));
    Executor ex(t);
    std::vector<float> buf(100, 1.0f);
    CollectiveSpec spec;
    spec.numel = buf.size();
    if (r == 1) {
      while (!t.abort_reason()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    try {
      ex.run_oneshot(spec, buf.data(), 0, std::chrono::milliseconds(500));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("rank 1 has not called all_reduce #0"), std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

TEST(Oneshot, TooLargeOrNoAreaIsAClearError) {
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    ShmTransport t(rdv, "big", r, 2, with_oneshot(4096));
    ShmTransport none(rdv, "none", r, 2, ShmOptions{});
    std::vector<float> buf(2000, 1.0f);
    CollectiveSpec spec;
    spec.numel = buf.size();  // 8000 bytes > 4096
    try {
      Executor ex(r == 0 ? static_cast<Transport&>(t) : static_cast<Transport&>(none));
      ex.run_oneshot(spec, buf.data(), 0, std::chrono::seconds(5));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("one-shot all_reduce of 8000 bytes needs"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("shm has 4096 bytes"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("shm has none"), std::string::npos) << errors[1];
}

TEST(Oneshot, DifferentSizesAcrossRanksFailAtSetup) {
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    try {
      ShmTransport t(rdv, "sz", r, 2, with_oneshot(r == 0 ? 4096 : 8192));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("STRAGG_ONESHOT_BYTES mismatch with rank"), std::string::npos)
        << errors[r];
  }
}

}  // namespace
}  // namespace stragg
