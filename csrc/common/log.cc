#include "common/log.h"

#include <memory>
#include <mutex>

namespace stragg {
namespace {

std::mutex& sink_mutex() {
  static std::mutex mu;
  return mu;
}

std::shared_ptr<LogSink>& sink_slot() {
  static std::shared_ptr<LogSink> sink;
  return sink;
}

void emit(LogLevel level, const std::string& message) {
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
