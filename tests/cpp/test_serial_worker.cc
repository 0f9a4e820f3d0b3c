// The worker both all_reduce paths share: order, errors, drain and cancel on stop.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <stdexcept>
#include <string>
#include <vector>

#include "session/serial_worker.h"

namespace stragg {
namespace {

TEST(SerialWorker, RunsJobsInOrderAndReportsErrors) {
  SerialWorker w;
  std::vector<int> order;
  std::vector<std::string> errors(3);
  std::promise<void> all;
  for (int i = 0; i < 3; ++i) {
    SerialWorker::Job job;
    job.run = [&order, i] {
      order.push_back(i);
      if (i == 1) throw std::runtime_error("job 1 failed");
    };
    job.finish = [&errors, &all, i](std::exception_ptr e) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          errors[i] = x.what();
        }
      }
      if (i == 2) all.set_value();
    };
    ASSERT_TRUE(w.submit(std::move(job)));
  }
  all.get_future().wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "job 1 failed");
  EXPECT_EQ(errors[2], "");
}

TEST(SerialWorker, StopDrainsOrCancels) {
  for (bool drain : {true, false}) {
    SerialWorker w;
    std::promise<void> release;
    auto gate = release.get_future().share();
    std::atomic<int> ran{0}, cancelled{0};
    std::string why;
    for (int i = 0; i < 4; ++i) {
      SerialWorker::Job job;
      job.run = [&ran, gate, i] {
        if (i == 0) gate.wait();  // holds the worker so the others stay queued
        ran.fetch_add(1);
      };
      job.cancel = [&cancelled, &why](const std::string& w) {
        cancelled.fetch_add(1);
        why = w;
      };
      ASSERT_TRUE(w.submit(std::move(job)));
    }
    while (!w.busy()) std::this_thread::yield();  // job 0 runs (held by the gate), 3 queued
    std::thread stopper([&] { w.stop(drain, "the group was shut down"); });
    while (!w.stopped()) std::this_thread::yield();
    release.set_value();
    stopper.join();
    EXPECT_EQ(ran.load(), drain ? 4 : 1);
    EXPECT_EQ(cancelled.load(), drain ? 0 : 3);
    if (!drain) {
      EXPECT_EQ(why, "the group was shut down");
    }
    EXPECT_FALSE(w.submit({}));  // no new jobs after stop
    EXPECT_EQ(w.pending(), 0u);
  }
}

}  // namespace
}  // namespace stragg
