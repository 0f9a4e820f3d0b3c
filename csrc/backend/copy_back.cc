// copy_back.h: the result written back into the caller's tensors.
#include "backend/copy_back.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <string>

#include "common/error.h"

namespace stragg {

namespace {

// Writes `result` (shaped like `out`) into `out`. An expanded `out` (stride-0 dimensions: its
// elements share memory) gets the one value its shared elements can hold, which is well defined
// when the result agrees along those dimensions (as it does when every rank expanded alike);
// otherwise, or for other self-overlapping layouts, a stragg::Error says why.
void write_result(const at::Tensor& out, const at::Tensor& result, int rank) {
  // TooHard: strided layouts torch does not analyse; copy_ refuses only a certain overlap.
  if (at::has_internal_overlap(out) != at::MemOverlap::Yes) {
    out.copy_(result);
    return;
  }
  at::Tensor target = out;
  at::Tensor first = result;
  for (int64_t d = 0; d < out.dim(); ++d) {
    if (out.stride(d) == 0 && out.size(d) > 1) {
      target = target.narrow(d, 0, 1);
      first = first.narrow(d, 0, 1);
    }
  }
  const std::string where = "stragg: rank " + std::to_string(rank) + ": all_reduce: ";
  if (at::has_internal_overlap(target) == at::MemOverlap::Yes) {
    throw Error(where +
                "the tensor's elements overlap in memory in a way that cannot hold the "
                "result (not a plain expand()); clone() it first");
  }
  const at::Tensor whole = first.expand_as(result).contiguous();
  const at::Tensor want = result.contiguous();
  if (!at::equal(whole.view(at::kByte), want.view(at::kByte))) {
    throw Error(where + "the tensor is expanded (stride 0) but the result differs along the " +
                "expanded dimensions (the ranks did not expand their tensors alike), so this " +
                "rank's tensor cannot hold it; clone() it first");
  }
  target.copy_(first);
}

}  // namespace

void copy_back(const at::Tensor& buffer, const std::vector<at::Tensor>& outputs, int rank) {
  if (outputs.size() == 1) {
    const at::Tensor& out = outputs[0];
    write_result(out, out.is_complex() ? at::view_as_complex(buffer) : buffer.view(out.sizes()),
                 rank);
    return;
  }
  int64_t offset = 0;
  for (const auto& out : outputs) {
    const int64_t n = out.numel();
    write_result(out, buffer.narrow(0, offset, n).view(out.sizes()), rank);
    offset += n;
  }
}

}  // namespace stragg
