// stragg._C: the Python face of the torch-facing backend.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/stragg_backend.h"

namespace py = pybind11;

namespace {

stragg::BackendConfig config_from_dict(const py::dict& d) {
  stragg::BackendConfig c;
  if (d.contains("transport")) c.transport = d["transport"].cast<std::string>();
  if (d.contains("shm_slot_bytes")) c.shm.slot_bytes = d["shm_slot_bytes"].cast<size_t>();
  if (d.contains("shm_slots")) c.shm.num_slots = d["shm_slots"].cast<size_t>();
  if (d.contains("spin_us")) c.shm.spin_us = d["spin_us"].cast<int>();
  if (d.contains("yield_us")) c.shm.yield_us = d["yield_us"].cast<int>();
  if (d.contains("tcp_host")) c.tcp.advertise_host = d["tcp_host"].cast<std::string>();
  if (d.contains("tcp_store_host")) c.tcp_store_host = d["tcp_store_host"].cast<std::string>();
  if (d.contains("tcp_port")) c.tcp.port = d["tcp_port"].cast<uint16_t>();
  if (d.contains("tcp_staging_bytes")) c.tcp.staging_bytes = d["tcp_staging_bytes"].cast<size_t>();
  if (d.contains("algo")) c.planner.algo = d["algo"].cast<std::string>();
  if (d.contains("straggler")) c.planner.straggler = d["straggler"].cast<int>();
  if (d.contains("log_calls")) c.log_calls = d["log_calls"].cast<bool>();
  if (d.contains("cuda_allreduce")) c.cuda_allreduce = d["cuda_allreduce"].cast<std::string>();
  if (d.contains("dynamic_window_us")) {
    c.dynamic_window = std::chrono::microseconds(d["dynamic_window_us"].cast<int64_t>());
  }
  if (d.contains("alpha_s")) c.planner.alpha_s = d["alpha_s"].cast<double>();
  if (d.contains("beta_s_per_byte")) c.planner.beta_s_per_byte = d["beta_s_per_byte"].cast<double>();
  auto& p = c.profiler;
  if (d.contains("profile")) p.enabled = d["profile"].cast<bool>();
  if (d.contains("profile_every")) p.exchange_every = d["profile_every"].cast<int>();
  if (d.contains("profile_window")) p.window = d["profile_window"].cast<int>();
  if (d.contains("profile_adopt_share")) p.adopt_share = d["profile_adopt_share"].cast<double>();
  if (d.contains("profile_drop_share")) p.drop_share = d["profile_drop_share"].cast<double>();
  if (d.contains("profile_patience")) p.patience = d["profile_patience"].cast<int>();
  if (d.contains("profile_min_gain_s")) p.min_gain_s = d["profile_min_gain_s"].cast<double>();
  if (d.contains("profile_noise_floor_s")) {
    p.noise_floor_s = d["profile_noise_floor_s"].cast<double>();
  }
  if (d.contains("probe_every")) c.probe_every_exchanges = d["probe_every"].cast<int>();
  if (d.contains("probe_messages")) c.probe_messages = d["probe_messages"].cast<int>();
  if (d.contains("probe_bytes")) c.probe_bytes = d["probe_bytes"].cast<size_t>();
  return c;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "stragg: straggler-aware all_reduce backend for torch.distributed (C++ core)";
  // The c10d Python types (Store, Backend) must be registered before ours derives from them.
  py::module_::import("torch.distributed");
#ifdef STRAGG_BACKEND_CUDA
  m.attr("cuda_allreduce_compiled") = true;  // CUDA all_reduce can run on stragg's GPU executor
#else
  m.attr("cuda_allreduce_compiled") = false;  // CUDA all_reduce is always delegated to NCCL
#endif

  py::class_<stragg::StraggBackend, c10d::Backend, c10::intrusive_ptr<stragg::StraggBackend>>(
      m, "StraggBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_name,
                       const py::dict& config) {
             auto cfg = config_from_dict(config);
             py::gil_scoped_release no_gil;
             return c10::make_intrusive<stragg::StraggBackend>(store, rank, size, timeout,
                                                               group_name, cfg);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("group_name"), py::arg("config"))
      .def("_attach_inner", &stragg::StraggBackend::attach_inner, py::arg("device"),
           py::arg("backend"))
      .def_property_readonly("transport", &stragg::StraggBackend::transport_name)
      .def_property_readonly("algorithm", &stragg::StraggBackend::algorithm)
      .def_property_readonly("straggler", &stragg::StraggBackend::straggler)
      .def("stats", &stragg::StraggBackend::stats)
      .def("recent_calls", [](const stragg::StraggBackend& b) {
        py::list out;
        for (const auto& r : b.recent_calls()) {
          py::dict d;
          d["seq"] = r.seq;
          d["numel"] = r.numel;
          d["bytes"] = r.bytes;
          d["algorithm"] = r.algorithm;
          d["straggler"] = r.straggler;
          d["queued_s"] = r.queued_s;
          d["agreement_s"] = r.agreement_s;
          d["run_s"] = r.run_s;
          d["wait_s"] = r.wait_s;
          d["pre_arrival_s"] = r.pre_arrival_s;
          d["window_s"] = r.window_s;
          d["wire_seq"] = r.wire_seq;
          d["ok"] = r.ok;
          out.append(d);
        }
        return out;
      })
      .def("profiler_summary",
           [](const stragg::StraggBackend& b) {
             bool enabled = false;
             stragg::ProfilerSummary s = b.profiler_summary(&enabled);
             auto rank_or_none = [](int r) -> py::object {
               return r >= 0 ? py::object(py::int_(r)) : py::object(py::none());
             };
             py::dict d;
             d["enabled"] = enabled;
             d["n"] = s.n;
             d["calls"] = s.calls;
             d["exchanges"] = s.exchanges;
             d["straggler"] = rank_or_none(s.straggler);
             d["candidate"] = rank_or_none(s.candidate);
             d["candidate_share"] = s.candidate_share;
             d["median_delay_s"] = s.median_delay_s;
             d["critical_delay_s"] = s.critical_delay_s;
             d["predicted_gain_s"] = s.predicted_gain_s;
             d["last_counts"] = s.last_counts;
             d["window_last_counts"] = s.window_last_counts;
             d["delays_s"] = s.recent_delays_s;
             d["last_ranks"] = s.recent_last;
             py::list decisions;
             for (const auto& dec : s.decisions) {
               py::dict e;
               e["call"] = dec.call;
               e["straggler"] = rank_or_none(dec.straggler);
               e["reason"] = dec.reason;
               decisions.append(e);
             }
             d["decisions"] = decisions;
             std::string source;
             const stragg::LinkModel link = b.link_model(&source);
             py::dict l;
             l["alpha_s"] = link.alpha_s;
             l["beta_s_per_byte"] = link.beta_s_per_byte;
             l["source"] = source;
             d["link"] = l;
             const auto& st = b.profiler_settings();
             py::dict set;
             set["enabled"] = st.enabled;
             set["every"] = st.exchange_every;
             set["window"] = st.window;
             set["adopt_share"] = st.adopt_share;
             set["drop_share"] = st.drop_share;
             set["patience"] = st.patience;
             set["min_gain_s"] = st.min_gain_s;
             set["noise_floor_s"] = st.noise_floor_s;
             d["settings"] = set;
             return d;
           })
      .def("measure_links", &stragg::StraggBackend::measure_links)
      .def("link_matrix",
           [](const stragg::StraggBackend& b) {
             const int n = b.getSize();
             const auto m = b.link_matrix();
             py::list rows;
             for (int i = 0; i < n; ++i) {
               py::list row;
               for (int j = 0; j < n; ++j) {
                 const auto& l = m[static_cast<size_t>(i) * n + j];
                 if (l.alpha_s < 0) {
                   row.append(py::none());
                 } else {
                   row.append(py::make_tuple(l.alpha_s, l.beta_s_per_byte));
                 }
               }
               rows.append(row);
             }
             return rows;
           })
      .def("dynamic_window_s", [](const stragg::StraggBackend& b, size_t bytes) {
        return std::chrono::duration<double>(b.dynamic_window_for(bytes)).count();
      });
}
