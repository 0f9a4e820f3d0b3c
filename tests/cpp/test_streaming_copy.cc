// copy_streaming (non-temporal stores) and the executor runs that use it (STRAGG_STREAMING_BYTES).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "plan/planner.h"
#include "runtime/executor.h"
#include "runtime/lowered_schedule.h"
#include "runtime/step_sink.h"
#include "runtime/streaming_copy.h"
#include "test_util.h"
#include "transport/shm/shm_transport.h"

namespace stragg {
namespace {

using testing::InMemoryRendezvous;
using testing::run_ranks;

// Every alignment of source and destination (the stores need 16-byte alignment: the head before
// it and the tail after the last whole line are plain copies) and lengths around line multiples;
// the bytes just outside the destination stay as they were.
TEST(StreamingCopy, CopiesEveryAlignmentAndLengthAndNothingElse) {
  std::mt19937 rng(7);
  std::vector<uint8_t> src(5000), dst(5100), expect;
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t len : {0, 1, 15, 16, 17, 63, 64, 65, 79, 128, 129, 1000, 4099}) {
    for (size_t so = 0; so < 17; ++so) {
      for (size_t doff = 0; doff < 33; ++doff) {
        for (auto& b : dst) b = 0xA5;
        expect = dst;
        std::memcpy(expect.data() + doff, src.data() + so, len);
        copy_streaming(dst.data() + doff, src.data() + so, len);
        ASSERT_EQ(dst, expect) << "len " << len << ", src offset " << so << ", dst offset "
                               << doff;
      }
    }
  }
}

// A sink told to stream writes a copying receive exactly like one that is not, piece by piece
// at any offset, and leaves reducing receives to the reduction.
TEST(StreamingCopy, StepSinkStreamsCopiesAndStillReduces) {
  CollectiveSpec spec;
  spec.numel = 1000;
  LoweredOp copy_op;
  copy_op.peer = 1;
  copy_op.offset = 3;  // 12 bytes into the buffer: not 16-byte aligned
  copy_op.count = 900;
  LoweredOp reduce_op = copy_op;
  reduce_op.reduce = true;
  std::vector<float> incoming(900);
  for (size_t i = 0; i < incoming.size(); ++i) incoming[i] = static_cast<float>(i) * 0.5f;
  for (bool stream : {false, true}) {
    std::vector<float> buf(1000, 1.0f);
    StepSink copy(0, spec, 0, 0, copy_op, reinterpret_cast<uint8_t*>(buf.data()), stream);
    // Pieces of 1000 and 2600 bytes: the second starts mid-line.
    copy.on_data(0, incoming.data(), 1000);
    copy.on_data(1000, reinterpret_cast<const uint8_t*>(incoming.data()) + 1000, 2600);
    for (size_t i = 0; i < 1000; ++i) {
      const float want = i >= 3 && i < 903 ? incoming[i - 3] : 1.0f;
      ASSERT_EQ(buf[i], want) << "stream " << stream << " @" << i;
    }
    StepSink reduce(0, spec, 0, 0, reduce_op, reinterpret_cast<uint8_t*>(buf.data()), stream);
    reduce.on_data(0, incoming.data(), 3600);
    for (size_t i = 3; i < 903; ++i) ASSERT_EQ(buf[i], 2 * incoming[i - 3]) << i;
  }
}

// The same all_reduces with and without streaming copies: bitwise the same result on every rank
// (a copy is a copy), for Ring over shared memory at sizes and offsets that split lines.
TEST(StreamingCopy, RingResultsAreBitwiseTheSameWithAndWithoutIt) {
  const int n = 3;
  const std::vector<size_t> sizes = {1, 7, 1001, 100003};
  std::vector<std::vector<std::vector<float>>> out(2, std::vector<std::vector<float>>(n));
  for (int mode = 0; mode < 2; ++mode) {
    InMemoryRendezvous rdv;
    run_ranks(n, [&](int r) {
      ShmOptions opt;
      opt.slot_bytes = 8192;  // many pieces per message
      ShmTransport t(rdv, "stream" + std::to_string(mode), r, n, opt);
      Executor ex(t);
      ex.set_streaming_bytes(mode == 0 ? 0 : 1);
      uint64_t seq = 0;
      for (size_t numel : sizes) {
        std::vector<float> buf(numel);
        std::mt19937 rng(static_cast<unsigned>(r * 1000 + numel));
        std::uniform_real_distribution<float> dist(-1, 1);
        for (auto& x : buf) x = dist(rng);
        CollectiveSpec spec;
        spec.seq = seq++;
        spec.numel = numel;
        ex.run(*ring_allreduce_schedule(r, n, numel), spec, buf.data(), std::chrono::seconds(60));
        out[mode][r].insert(out[mode][r].end(), buf.begin(), buf.end());
      }
    });
  }
  const size_t total = out[0][0].size();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(out[1][r].size(), total);
    EXPECT_EQ(0, std::memcmp(out[1][r].data(), out[0][0].data(), total * sizeof(float)))
        << "rank " << r << " with streaming copies differs from rank 0 without";
  }
}

}  // namespace
}  // namespace stragg
