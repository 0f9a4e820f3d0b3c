// Logging for the torch-free layers (no torch here): they call log_info / log_warning; the torch
// adapter installs a sink that forwards to c10 logging (shown with TORCH_CPP_LOG_LEVEL=INFO),
// tests may install one that records. Without a sink, messages are dropped: library code never
// prints.
#pragma once

#include <functional>
#include <string>

namespace stragg {

enum class LogLevel { Info, Warning };

using LogSink = std::function<void(LogLevel, const std::string&)>;

// Replaces the process-wide sink (nullptr: drop messages). Thread-safe.
void set_log_sink(LogSink sink);

void log_info(const std::string& message);
void log_warning(const std::string& message);

}  // namespace stragg
