// stragg._C: the Python face of the torch adapter (StraggBackend and what users read from it).
#include <c10/util/Logging.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/dist_error.h"
#include "backend/stragg_backend.h"
#include "common/log.h"

namespace py = pybind11;

namespace {

// The Python callable that builds shrunk / split groups (stragg/_regroup.py) as StraggBackend's
// Regroup: called with (parent, kind, ranks, flags, store, timeout, group_name). The callable is
// released under the GIL from whichever thread drops the last reference to the backend.
stragg::Regroup python_regroup(py::function fn) {
  std::shared_ptr<py::object> callable(new py::object(std::move(fn)), [](py::object* o) {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      delete o;
    } else {
      o->release();  // the interpreter is gone: nothing left to decrement
      delete o;
    }
  });
  return [callable](stragg::StraggBackend& parent,
                    const stragg::RegroupRequest& r) -> c10::intrusive_ptr<c10d::Backend> {
    py::gil_scoped_acquire gil;
    const bool shrink = r.kind == stragg::RegroupRequest::Kind::Shrink;
    py::object self = py::cast(c10::intrusive_ptr<stragg::StraggBackend>::reclaim_copy(&parent));
    py::object store = r.store ? py::cast(r.store) : py::object(py::none());
    py::object out = (*callable)(self, shrink ? "shrink" : "split", r.ranks, r.flags, store,
                                 r.timeout, r.group_name);
    if (out.is_none()) return {};
    return out.cast<c10::intrusive_ptr<stragg::StraggBackend>>();
  };
}

py::object rank_or_none(int r) { return r >= 0 ? py::object(py::int_(r)) : py::object(py::none()); }

py::dict call_record_dict(const stragg::CallRecord& r) {
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
  d["plan"] = r.schedule_name;  // the key Python has always read
  d["predicted_s"] = r.predicted_s;
  d["wire_seq"] = r.wire_seq;
  d["ok"] = r.ok;
  return d;
}

py::dict profiler_settings_dict(const stragg::ProfilerSettings& st) {
  py::dict set;
  set["enabled"] = st.enabled;
  set["every"] = st.exchange_every;
  set["window"] = st.window;
  set["adopt_share"] = st.adopt_share;
  set["drop_share"] = st.drop_share;
  set["patience"] = st.patience;
  set["min_gain_s"] = st.min_gain_s;
  set["noise_floor_s"] = st.noise_floor_s;
  return set;
}

py::dict profiler_summary_dict(const stragg::Session& session) {
  bool enabled = false;
  const stragg::ProfilerSummary s = session.profiler_summary(&enabled);
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
  d["straggler_share"] = s.straggler_share;    // the same two for the profiler's straggler
  d["straggler_gain_s"] = s.straggler_gain_s;  // (0 without one)
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
  py::dict applied;
  applied["straggler"] = rank_or_none(s.applied_straggler);
  py::dict degraded;
  for (const auto& sd : s.applied_degraded) degraded[py::int_(sd.rank)] = sd.factor;
  applied["degraded"] = degraded;
  applied["mode"] = s.applied_mode;
  d["applied"] = applied;
  py::dict corrections;
  for (const auto& [family, ratio] : s.corrections) corrections[py::str(family)] = ratio;
  d["model_corrections"] = corrections;
  py::list checks;
  for (const auto& c : s.plan_checks) {
    py::dict e;
    e["call"] = c.call;
    e["change"] = c.change;
    e["kept"] = c.kept;
    e["chosen"] = c.chosen;
    e["period_s"] = c.period_s;
    e["baseline_s"] = c.baseline_s;
    e["rounds"] = c.rounds;
    py::list arms;
    for (const auto& a : c.arms) {
      py::dict arm;
      arm["mode"] = a.mode;
      arm["s"] = a.score_s;
      arm["error_s"] = a.error_s;
      arm["calls"] = a.calls;
      arms.append(arm);
    }
    e["arms"] = arms;
    checks.append(e);
  }
  d["plan_checks"] = checks;
  py::dict probes;
  probes["campaigns"] = s.probe_campaigns;
  probes["slices"] = s.probe_slices;
  probes["seconds"] = s.probe_s;
  probes["transfer_bytes"] = s.probe_transfer_bytes;
  d["probes"] = probes;
  d["exchange_every"] = s.exchange_every;
  d["exchange_seconds"] = s.exchange_s;
  std::string source;
  const stragg::LinkModel link = session.link_model(&source);
  py::dict l;
  l["alpha_s"] = link.alpha_s;
  l["beta_s_per_byte"] = link.beta_s_per_byte;
  l["source"] = source;
  d["link"] = l;
  d["settings"] = profiler_settings_dict(session.profiler_settings());
  return d;
}

// Per rank: send/receive bandwidth (bytes/s, None if unknown) and slowdown; the degraded ranks.
py::dict link_analysis_dict(const stragg::Session& session) {
  const stragg::LinkAnalysis a = session.link_analysis();
  auto bw = [](double beta) -> py::object {
    return beta > 0 ? py::object(py::float_(1.0 / beta)) : py::object(py::none());
  };
  py::list ranks;
  for (size_t r = 0; r < a.slowdown.size(); ++r) {
    py::dict d;
    d["send_bytes_per_s"] = bw(a.send_beta[r]);
    d["recv_bytes_per_s"] = bw(a.recv_beta[r]);
    d["slowdown"] = a.slowdown[r];
    ranks.append(d);
  }
  py::dict degraded;
  for (const auto& s : a.degraded) degraded[py::int_(s.rank)] = s.factor;
  py::dict out;
  out["ranks"] = ranks;
  out["degraded"] = degraded;
  return out;
}

py::list link_matrix_list(const stragg::Session& session) {
  const int n = session.size();
  const auto m = session.link_matrix();
  py::list rows;
  for (int i = 0; i < n; ++i) {
    py::list row;
    for (int j = 0; j < n; ++j) {
      const auto& l = m[static_cast<size_t>(i) * n + j];
      row.append(l.alpha_s < 0 ? py::object(py::none())
                               : py::object(py::make_tuple(l.alpha_s, l.beta_s_per_byte)));
    }
    rows.append(row);
  }
  return rows;
}

// The runtime's log lines go to c10 logging (TORCH_CPP_LOG_LEVEL=INFO shows them).
void install_log_sink() {
  stragg::set_log_sink([](stragg::LogLevel level, const std::string& message) {
    if (level == stragg::LogLevel::Warning) {
      LOG(WARNING) << message;
    } else {
      LOG(INFO) << message;
    }
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "stragg: straggler-aware all_reduce backend for torch.distributed (C++ core)";
  // The c10d Python types (Store, Backend) must be registered before ours derives from them.
  py::module_::import("torch.distributed");
  install_log_sink();
#ifdef STRAGG_BACKEND_CUDA
  m.attr("cuda_allreduce_compiled") = true;  // CUDA all_reduce can run on stragg's GPU executor
#else
  m.attr("cuda_allreduce_compiled") = false;  // CUDA all_reduce is always delegated to NCCL
#endif
  // Flight recorder (backend/flight_recorder.h).
  m.def("_fr_enabled", [] { return stragg::FlightRecorder::get().enabled(); });
  m.def("_fr_size", [] { return stragg::FlightRecorder::get().size(); });
  m.def(
      "_fr_merge_dump",
      [](const py::bytes& torch_dump, bool include_collectives, bool only_active) {
        std::string in = torch_dump;
        std::string out;
        {
          py::gil_scoped_release no_gil;
          out = stragg::FlightRecorder::get().merge_dump(in, include_collectives, only_active);
        }
        return py::bytes(out);
      },
      py::arg("torch_dump"), py::arg("include_collectives") = true,
      py::arg("only_active") = false);
  using stragg::StraggBackend;
  py::class_<StraggBackend, c10d::Backend, c10::intrusive_ptr<StraggBackend>>(m, "StraggBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_name,
                       const std::vector<std::tuple<std::string, std::string, std::string>>& raw,
                       const std::string& store_host, const std::string& store_description,
                       bool store_hosted_by_rank0) {
             std::vector<stragg::SettingValue> values;
             for (const auto& [key, value, source] : raw) values.push_back({key, value, source});
             const stragg::Settings settings =
                 stragg::rethrow_as_dist_error([&] { return stragg::parse_settings(values); });
             py::gil_scoped_release no_gil;
             return c10::make_intrusive<StraggBackend>(
                 store, rank, size, timeout, group_name, settings,
                 stragg::StoreInfo{store_host, store_description, store_hosted_by_rank0});
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("group_name"), py::arg("settings"), py::arg("store_host") = "",
           py::arg("store_description") = "", py::arg("store_hosted_by_rank0") = false)
      .def("_attach_inner", &StraggBackend::attach_inner, py::arg("device"), py::arg("backend"))
      .def("_set_regroup",
           [](StraggBackend& b, py::function fn) { b.set_regroup(python_regroup(std::move(fn))); })
      .def("_retire", &StraggBackend::retire, py::arg("abort"), py::arg("why"),
           py::call_guard<py::gil_scoped_release>())
      .def("_announce_retired", &StraggBackend::announce_retired, py::arg("why"),
           py::call_guard<py::gil_scoped_release>())
      .def("_gone_peers", &StraggBackend::gone_peers)
      // torch's split_group deep-copies parent_backend.options; stragg's child takes the parent's
      // settings through the regroup callback, so there is nothing to copy.
      .def_property_readonly("options", [](const StraggBackend&) { return py::none(); })
      .def("_set_flight_recorder_ranks", &StraggBackend::set_flight_recorder_ranks,
           py::arg("global_ranks"))
      .def_property_readonly("transport",
                             [](const StraggBackend& b) { return b.session().transport_name(); })
      .def_property_readonly("algorithm",
                             [](const StraggBackend& b) { return b.session().algorithm_name(); })
      .def_property_readonly(
          "straggler", [](const StraggBackend& b) { return b.session().straggler().to_string(); })
      .def("stats", &StraggBackend::stats)
      .def("recent_calls",
           [](const StraggBackend& b) {
             py::list out;
             for (const auto& r : b.session().recent_calls()) out.append(call_record_dict(r));
             return out;
           })
      .def("profiler_summary",
           [](const StraggBackend& b) { return profiler_summary_dict(b.session()); })
      .def("measure_links", &StraggBackend::measure_links)
      .def("link_matrix", [](const StraggBackend& b) { return link_matrix_list(b.session()); })
      .def("link_analysis",
           [](const StraggBackend& b) { return link_analysis_dict(b.session()); })
      .def("dynamic_window_s", [](const StraggBackend& b, size_t bytes) {
        return std::chrono::duration<double>(b.session().dynamic_window_for(bytes)).count();
      });
}
