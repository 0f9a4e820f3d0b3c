// Turns CUDA runtime errors into text and stragg::Error (kernels/ and the backend's CUDA path; no
// torch here).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.h"

namespace stragg::gpu {

// "<cuda error name> (<description>)".
inline std::string cuda_error_text(cudaError_t rc) {
  return std::string(cudaGetErrorName(rc)) + " (" + cudaGetErrorString(rc) + ")";
}

// Throws stragg::Error "<what>: <cuda error name> (<description>)" unless rc is cudaSuccess.
inline void cuda_check(cudaError_t rc, const std::string& what) {
  if (rc == cudaSuccess) return;
  throw Error(what + ": " + cuda_error_text(rc));
}

}  // namespace stragg::gpu
