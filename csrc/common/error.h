// Errors raised by the torch-free runtime. The backend turns them into Python RuntimeErrors.
#pragma once

#include <stdexcept>
#include <string>

namespace stragg {

// Every failure in stragg's runtime is a stragg::Error. The message names the rank, the
// operation and what went wrong (e.g. which peer is missing or which field mismatched).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A peer did not make progress before the deadline, or died.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};

// The rendezvous store failed (connection refused, reset or closed; not a timeout). The message
// names the store and the underlying error.
class StoreError : public Error {
 public:
  explicit StoreError(const std::string& what) : Error(what) {}
};

}  // namespace stragg
