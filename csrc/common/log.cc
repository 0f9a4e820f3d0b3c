#include "common/log.h"

#include <atomic>
#include <memory>
#include <mutex>

namespace stragg {
namespace {

// Never destroyed: threads that outlive main() (the heartbeat thread of a transport whose group
// was never destroyed, hearing its peers exit) may still log while static destructors run; a
// destroyed slot crashed them (SIGSEGV at exit in the training benchmark).
std::mutex& sink_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

std::shared_ptr<LogSink>& sink_slot() {
  static auto* sink = new std::shared_ptr<LogSink>;
  return *sink;
}

// Set when this library's static objects are destroyed (the process is exiting): from then on
// messages are dropped, since the sink forwards to c10 logging, whose statics go next.
std::atomic<bool> exiting{false};
struct ExitMark {
  ~ExitMark() { exiting.store(true); }
} exit_mark;

void emit(LogLevel level, const std::string& message) {
  if (exiting.load()) return;
  std::shared_ptr<LogSink> sink;
  {
    std::lock_guard<std::mutex> lock(sink_mutex());
    sink = sink_slot();
  }
  if (sink && *sink) (*sink)(level, message);
}

}  // namespace

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  sink_slot() = sink ? std::make_shared<LogSink>(std::move(sink)) : nullptr;
}

void log_info(const std::string& message) { emit(LogLevel::Info, message); }
void log_warning(const std::string& message) { emit(LogLevel::Warning, message); }

}  // namespace stragg
