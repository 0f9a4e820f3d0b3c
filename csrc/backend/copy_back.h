// The result of an all_reduce written back into the caller's tensors, when the collective ran on
// a contiguous copy of them (a non-contiguous, complex or expanded tensor; the tensors of
// all_reduce_coalesced, flattened one after the other).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace stragg {

// Copies the contiguous `buffer` back into the caller's tensors (one tensor, possibly complex,
// non-contiguous or expanded; or several, flattened one after the other as allreduce_coalesced
// packs them). Throws stragg::Error naming `rank` when an expanded tensor cannot hold the result.
void copy_back(const at::Tensor& buffer, const std::vector<at::Tensor>& outputs, int rank);

}  // namespace stragg
