// The collectives stragg does not run itself: each goes to the inner backend of its tensors'
// device (Gloo for CPU, NCCL for CUDA), created by the Python creator from the same store.
#include "backend/stragg_backend.h"

namespace stragg {

c10::intrusive_ptr<c10d::Work> StraggBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  return inner_for(tensors, "broadcast").broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  return inner_for(tensors, "reduce").reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_for(inputs, "all_gather").allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::_allgather_base(at::Tensor& output,
                                                              at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  return inner_for(input.device().type(), "all_gather_into_tensor")
      ._allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_for(inputs, "all_gather_coalesced").allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_for(inputs, "all_gather_into_tensor_coalesced")
      .allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return inner_for(inputs, "gather").gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return inner_for(outputs, "scatter").scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return inner_for(outputs, "reduce_scatter").reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return inner_for(input.device().type(), "reduce_scatter_tensor")
      ._reduce_scatter_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return inner_for(inputs, "reduce_scatter_tensor_coalesced")
      .reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return inner_for(input.device().type(), "all_to_all_single")
      .alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  return inner_for(inputs, "all_to_all").alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                   int tag) {
  return inner_for(tensors, "send").send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                   int tag) {
  return inner_for(tensors, "recv").recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                            int tag) {
  return inner_for(tensors, "recv").recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::barrier(const c10d::BarrierOptions& opts) {
  return inner_for(cpu_inner_ ? c10::DeviceType::CPU : c10::DeviceType::CUDA, "barrier")
      .barrier(opts);
}

void StraggBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  inner_for(c10::DeviceType::CPU, "monitored_barrier").monitoredBarrier(opts, wait_all_ranks);
}

void StraggBackend::setSequenceNumberForGroup() {
  if (cpu_inner_) cpu_inner_->setSequenceNumberForGroup();
}

uint64_t StraggBackend::getSequenceNumberForGroup() {
  return cpu_inner_ ? cpu_inner_->getSequenceNumberForGroup() : 0;
}

}  // namespace stragg
