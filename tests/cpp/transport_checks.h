// Checks every Transport must pass, shared by the shm and tcp test suites: a ring all_reduce is
// exact and bitwise identical across ranks, and mismatched collectives raise on every rank.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/executor.h"
#include "plan/planner.h"
#include "transport/transport.h"
#include "test_util.h"

namespace stragg::testing {

// Builds rank r's transport (a collective call: every rank makes one).
using MakeTransport = std::function<std::unique_ptr<Transport>(Rendezvous&, int rank, int size)>;

inline float ring_input_value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 0.5 + (i % 97) * 0.25);
}

// Ring all_reduce (SUM, float32) of `numel` elements on `size` ranks, twice in a row (state
// carries over between collectives): matches a float64 reference and is bitwise identical.
inline void check_ring_allreduce(int size, size_t numel, const MakeTransport& make) {
  InMemoryRendezvous rdv;
  std::vector<std::vector<float>> out(size);
  std::vector<std::string> errors(size);
  run_ranks(size, [&](int r) {
    try {
      auto t = make(rdv, r, size);
      Executor ex(*t);
      std::vector<float> buf(numel);
      for (size_t i = 0; i < numel; ++i) buf[i] = ring_input_value(r, i);
      for (uint64_t seq = 0; seq < 2; ++seq) {
        std::vector<float> work = buf;
        CollectiveSpec spec;
        spec.seq = seq;
        spec.numel = numel;
        ex.run(*ring_allreduce_plan(r, size, numel), spec, work.data(), std::chrono::seconds(60));
        out[r] = work;
      }
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < size; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (size_t i = 0; i < numel; ++i) {
    double ref = 0;
    for (int r = 0; r < size; ++r) ref += ring_input_value(r, i);
    ASSERT_NEAR(out[0][i], ref, 1e-4 * std::fabs(ref) + 1e-5) << "element " << i;
  }
  for (int r = 1; r < size; ++r) {
    ASSERT_EQ(out[r].size(), numel);
    if (numel == 0) continue;
    ASSERT_EQ(0, std::memcmp(out[r].data(), out[0].data(), numel * sizeof(float)))
        << "rank " << r << " differs from rank 0";
  }
}

// Rank 2 passes a different numel: every rank must raise naming the mismatch.
inline void check_numel_mismatch_raises_everywhere(int size, const MakeTransport& make) {
  InMemoryRendezvous rdv;
  std::vector<std::string> errors(size);
  run_ranks(size, [&](int r) {
    auto t = make(rdv, r, size);
    Executor ex(*t);
    const size_t numel = (r == 2) ? 100 : 200;
    std::vector<float> buf(numel, 1.0f);
    CollectiveSpec spec;
    spec.numel = numel;
    try {
      ex.run(*ring_allreduce_plan(r, size, numel), spec, buf.data(), std::chrono::seconds(20));
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_NE(errors[r].find("mismatch"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("numel"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

}  // namespace stragg::testing
