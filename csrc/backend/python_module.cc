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
  if (d.contains("dynamic_window_us")) {
    c.dynamic_window = std::chrono::microseconds(d["dynamic_window_us"].cast<int64_t>());
  }
  return c;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "stragg: straggler-aware all_reduce backend for torch.distributed (C++ core)";
  // The c10d Python types (Store, Backend) must be registered before ours derives from them.
  py::module_::import("torch.distributed");

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
          d["ok"] = r.ok;
          out.append(d);
        }
        return out;
      });
}
