// The Device interface (device.h) on the CUDA runtime and the kernels of reduce_kernels.cu.
#pragma once

#include "kernels/device.h"

namespace stragg::gpu {

// The process's CUDA device layer (stateless: the current device is CUDA's per-thread one).
// Errors throw stragg::Error "<call>: <cuda error name> (<description>)".
Device& cuda_device();

}  // namespace stragg::gpu
