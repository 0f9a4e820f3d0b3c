// Turns CUDA runtime errors into stragg::Error (internal to kernels/; no torch here).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.h"

namespace stragg::gpu {

// Throws stragg::Error "<what>: <cuda error name> (<description>)" unless rc is cudaSuccess.
inline void cuda_check(cudaError_t rc, const std::string& what) {
  if (rc == cudaSuccess) return;
  throw Error(what + ": " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
}

}  // namespace stragg::gpu
