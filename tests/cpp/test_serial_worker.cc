// The worker both all_reduce paths share: order, errors, drain and cancel on stop.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
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

// Inline: the caller runs the job when the worker is idle; jobs submitted while it runs wait
// behind it; a busy worker refuses the claim; stopping from inside an inline job returns.
TEST(SerialWorker, InlineJobsKeepIssueOrder) {
  SerialWorker w;
  std::vector<int> order;
  std::mutex mu;
  auto record = [&](int i) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(i);
  };
  ASSERT_TRUE(w.claim_inline());
  EXPECT_FALSE(w.claim_inline());  // one turn at a time
  std::promise<void> queued_done;
  SerialWorker::Job first;
  first.run = [&] {
    EXPECT_TRUE(w.on_worker_thread());
    SerialWorker::Job second;  // submitted while the inline job runs: must wait for it
    second.run = [&] { record(2); };
    second.finish = [&](std::exception_ptr) { queued_done.set_value(); };
    ASSERT_TRUE(w.submit(std::move(second)));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    record(1);
  };
  std::exception_ptr first_error;
  first.finish = [&](std::exception_ptr e) { first_error = e; };
  w.run_claimed(first);
  EXPECT_FALSE(w.on_worker_thread());
  queued_done.get_future().wait();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(first_error, nullptr);
  // The worker gives its turn back just after the job's finish ran.
  while (w.busy()) std::this_thread::yield();
  // Errors of an inline job reach its finish, on the calling thread.
  ASSERT_TRUE(w.claim_inline());
  SerialWorker::Job failing;
  failing.run = [] { throw std::runtime_error("inline failed"); };
  std::string what;
  failing.finish = [&](std::exception_ptr e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    }
  };
  w.run_claimed(failing);
  EXPECT_EQ(what, "inline failed");
  // An inline job that stops the worker (an abort from inside a call) does not deadlock.
  ASSERT_TRUE(w.claim_inline());
  SerialWorker::Job stopper;
  stopper.run = [&] { w.stop(false, "aborted from inside"); };
  w.run_claimed(stopper);
  EXPECT_TRUE(w.stopped());
  EXPECT_FALSE(w.claim_inline());
}

TEST(SerialWorker, StopDrainsOrCancels) {
  for (bool drain : {true, false}) {
    SerialWorker w;
    std::promise<void> release, started;
    auto gate = release.get_future().share();
    std::atomic<int> ran{0}, cancelled{0};
    std::string why;
    for (int i = 0; i < 4; ++i) {
      SerialWorker::Job job;
      job.run = [&ran, &started, gate, i] {
        if (i == 0) {
          started.set_value();
          gate.wait();  // holds the worker so the others stay queued
        }
        ran.fetch_add(1);
      };
      job.cancel = [&cancelled, &why](const std::string& w) {
        cancelled.fetch_add(1);
        why = w;
      };
      ASSERT_TRUE(w.submit(std::move(job)));
    }
    started.get_future().wait();  // job 0 runs: the other three are queued
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

// A job's closures may hold the last reference to the worker's owner (a Work keeping its process
// group alive): releasing them destroys the worker on its own thread. That must neither call
// std::terminate (a joinable thread destroyed) nor touch the freed worker.
TEST(SerialWorker, MayBeDestroyedByItsOwnJob) {
  for (int i = 0; i < 50; ++i) {
    auto owner = std::make_shared<SerialWorker>();
    std::promise<void> destroyed;
    struct Holder {  // signals once the closure holding the last reference is released
      Holder(std::shared_ptr<SerialWorker> w, std::promise<void>* d) : worker(std::move(w)), done(d) {}
      Holder(const Holder&) = delete;
      std::shared_ptr<SerialWorker> worker;
      std::promise<void>* done;
      ~Holder() {
        worker.reset();
        done->set_value();
      }
    };
    auto holder = std::make_shared<Holder>(owner, &destroyed);
    std::weak_ptr<SerialWorker> weak = owner;
    std::promise<void> go;
    std::shared_future<void> gate = go.get_future().share();
    SerialWorker::Job job;
    job.run = [gate] { gate.wait(); };
    job.finish = [holder](std::exception_ptr) {};
    ASSERT_TRUE(owner->submit(std::move(job)));
    holder.reset();
    owner.reset();  // the job's closure now holds the last reference
    go.set_value();
    destroyed.get_future().wait();
    EXPECT_TRUE(weak.expired());
  }
}

}  // namespace
}  // namespace stragg
