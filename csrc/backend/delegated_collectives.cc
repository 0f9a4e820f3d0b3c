// The collectives stragg does not run itself: each goes to the inner backend of its tensors'
// device (Gloo for CPU, NCCL for CUDA), created by the Python creator from the same store.
// inner_for() refuses them at once on a group that was aborted or shut down; delegated() wraps
// the inner Work so that an abort while it runs, or its own failure, is total (delegated_work.h).
// (barrier is stragg's own on a group with CPU tensors: stragg_backend.cc.)
#include "backend/delegated_work.h"
#include "backend/stragg_backend.h"

#include <string>

namespace stragg {

namespace {

// What the flight recorder records for a list of tensors per rank (all_gather's outputs,
// reduce_scatter's inputs): one tensor shaped like their stack, [n, *shape] (as torch's Gloo
// records them, and as torch's analyzer checks their numel against the group size).
std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  if (!FlightRecorder::get().enabled()) return out;
  for (const auto& l : lists) {
    if (l.empty()) continue;
    std::vector<int64_t> shape{static_cast<int64_t>(l.size())};
    for (int64_t d : l[0].sizes()) shape.push_back(d);
    out.push_back(at::empty(shape, l[0].options().device(at::kMeta)));
  }
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> StraggBackend::delegated(c10::intrusive_ptr<c10d::Work> inner,
                                                        const char* op,
                                                        const std::vector<at::Tensor>& inputs,
                                                        const std::vector<at::Tensor>& outputs,
                                                        bool is_p2p) {
  Session* session = session_.get();
  if (!fr_group_) {
    return c10::make_intrusive<DelegatedWork>(
        std::move(inner), getRank(), op, [session] { return session->failure(); },
        [session](const std::string& cause) {
          if (!session->failure()) session->abort(cause);
        });
  }
  // Flight recorder: the entry ends with the inner Work's future or wait(); a failure seen by
  // wait() writes the dump. Point-to-point operations are not recorded (as torch's Gloo does
  // not): torch's analyzer matches them by collective sequence number, and send/recv between
  // disjoint pairs of ranks then read as mismatches. Their failure still writes the dump.
  const int64_t fr_id = is_p2p ? -1 : fr_record(op, inputs, outputs, timeout_, false);
  try {
    inner->getFuture()->addCallback([fr_id](c10::ivalue::Future& f) {
      FlightRecorder::get().finished(fr_id, f.hasError() ? f.tryRetrieveErrorMessage() : "");
    });
  } catch (const c10::Error&) {
    // no future: nothing to watch
  }
  std::shared_ptr<FrGroup> group = fr_group_;
  return c10::make_intrusive<DelegatedWork>(
      std::move(inner), getRank(), op,
      [session, group, fr_id] {
        auto why = session->failure();  // the group aborted while it ran: dump too
        if (why) {
          FlightRecorder::get().finished(fr_id, *why);
          FlightRecorder::get().on_failure(group, *why);
        }
        return why;
      },
      [session, group, fr_id](const std::string& cause) {
        FlightRecorder::get().finished(fr_id, cause);
        FlightRecorder::get().on_failure(group, cause);
        if (!session->failure()) session->abort(cause);
      },
      [fr_id] { FlightRecorder::get().finished(fr_id, ""); });
}

c10::intrusive_ptr<c10d::Work> StraggBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  return delegated(inner_for(tensors, "broadcast").broadcast(tensors, opts), "broadcast",
                   tensors, tensors);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  return delegated(inner_for(tensors, "reduce").reduce(tensors, opts), "reduce", tensors,
                   tensors);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return delegated(inner_for(inputs, "all_gather").allgather(outputs, inputs, opts),
                   "all_gather", inputs, flatten(outputs));
}

c10::intrusive_ptr<c10d::Work> StraggBackend::_allgather_base(at::Tensor& output,
                                                              at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  return delegated(inner_for(input.device().type(), "all_gather_into_tensor")
                       ._allgather_base(output, input, opts),
                   "all_gather_into_tensor", {input}, {output});
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return delegated(
      inner_for(inputs, "all_gather_coalesced").allgather_coalesced(outputs, inputs, opts),
      "all_gather_coalesced", inputs, flatten(outputs));
}

c10::intrusive_ptr<c10d::Work> StraggBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return delegated(inner_for(inputs, "all_gather_into_tensor_coalesced")
                       .allgather_into_tensor_coalesced(outputs, inputs, opts),
                   "all_gather_into_tensor_coalesced", inputs, outputs);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return delegated(inner_for(inputs, "gather").gather(outputs, inputs, opts), "gather", inputs,
                   flatten(outputs));
}

c10::intrusive_ptr<c10d::Work> StraggBackend::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return delegated(inner_for(outputs, "scatter").scatter(outputs, inputs, opts), "scatter",
                   flatten(inputs), outputs);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return delegated(inner_for(outputs, "reduce_scatter").reduce_scatter(outputs, inputs, opts),
                   "reduce_scatter", flatten(inputs), outputs);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return delegated(inner_for(input.device().type(), "reduce_scatter_tensor")
                       ._reduce_scatter_base(output, input, opts),
                   "reduce_scatter_tensor", {input}, {output});
}

c10::intrusive_ptr<c10d::Work> StraggBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return delegated(inner_for(inputs, "reduce_scatter_tensor_coalesced")
                       .reduce_scatter_tensor_coalesced(outputs, inputs, opts),
                   "reduce_scatter_tensor_coalesced", inputs, outputs);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
  return delegated(inner_for(input.device().type(), "all_to_all_single")
                       .alltoall_base(output, input, output_split_sizes, input_split_sizes, opts),
                   "all_to_all_single", {input}, {output});
}

c10::intrusive_ptr<c10d::Work> StraggBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  return delegated(inner_for(inputs, "all_to_all").alltoall(outputs, inputs, opts),
                   "all_to_all", inputs, outputs);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                   int tag) {
  return delegated(inner_for(tensors, "send").send(tensors, dst_rank, tag), "send", tensors,
                   tensors, true);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                   int tag) {
  return delegated(inner_for(tensors, "recv").recv(tensors, src_rank, tag), "recv", tensors,
                   tensors, true);
}

c10::intrusive_ptr<c10d::Work> StraggBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                            int tag) {
  return delegated(inner_for(tensors, "recv").recvAnysource(tensors, tag), "recv",
                   tensors, tensors, true);
}

void StraggBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  try {
    inner_for(c10::DeviceType::CPU, "monitored_barrier").monitoredBarrier(opts, wait_all_ranks);
  } catch (const c10::Error& e) {
    if (!session_->failure()) {
      const std::string msg = e.msg();
      session_->abort("monitored_barrier failed: " + msg.substr(0, msg.find('\n')));
    }
    throw;
  }
}

void StraggBackend::setSequenceNumberForGroup() {
  if (cpu_inner_) cpu_inner_->setSequenceNumberForGroup();
}

uint64_t StraggBackend::getSequenceNumberForGroup() {
  return cpu_inner_ ? cpu_inner_->getSequenceNumberForGroup() : 0;
}

}  // namespace stragg
