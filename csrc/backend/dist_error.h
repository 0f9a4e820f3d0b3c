// How errors of the torch-free layers reach Python (both all_reduce paths use this): a
// stragg::SettingsError becomes ValueError, a stragg::StoreError torch.distributed.DistStoreError,
// every other failure torch.distributed.DistBackendError (both RuntimeErrors); c10 errors pass
// through unchanged.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

#include "common/error.h"
#include "plan/settings.h"

namespace stragg {

// `where` is prepended when the message does not already start with "stragg: rank".
inline std::exception_ptr to_dist_error(std::exception_ptr error, const std::string& where = "") {
  if (!error) return error;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error&) {
    return error;
  } catch (const SettingsError& e) {
    try {
      C10_THROW_ERROR(ValueError, e.what());
    } catch (...) {
      return std::current_exception();
    }
  } catch (const StoreError& e) {
    try {
      C10_THROW_ERROR(DistStoreError, e.what());
    } catch (...) {
      return std::current_exception();
    }
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    const bool named = where.empty() || msg.rfind("stragg: rank", 0) == 0;
    try {
      C10_THROW_ERROR(DistBackendError, named ? msg : where + ": " + msg);
    } catch (...) {
      return std::current_exception();
    }
  }
  return error;
}

// Throws c10::DistBackendError (torch.distributed.DistBackendError) saying `msg`.
[[noreturn]] inline void throw_dist_error(const std::string& msg) {
  C10_THROW_ERROR(DistBackendError, msg);
}

// Runs fn and rethrows whatever it throws as to_dist_error does.
template <typename F>
auto rethrow_as_dist_error(F&& fn, const std::string& where = "") -> decltype(fn()) {
  try {
    return fn();
  } catch (...) {
    std::rethrow_exception(to_dist_error(std::current_exception(), where));
  }
}

// A DistBackendError (as torch raises it) carrying `msg`.
inline std::exception_ptr dist_error(const std::string& msg) {
  return to_dist_error(std::make_exception_ptr(Error(msg)));
}

}  // namespace stragg
