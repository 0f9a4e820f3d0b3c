// stragg._core: torch-free Python bindings (pybind11) of the schedule library (user-facing API:
// python/stragg/schedule.py, python/stragg/sim.py) and of the settings table
// (settings_module.cc; python/stragg/_config.py).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/closed_forms.h"
#include "core/generators.h"
#include "core/ir.h"
#include "core/simulator.h"
#include "core/verifier.h"

namespace py = pybind11;
using namespace stragg::core;

void bind_settings(py::module_& m);  // settings_module.cc

namespace {

py::dict transfer_dict(const Transfer& t) {
  py::dict d;
  d["src"] = t.src;
  d["dst"] = t.dst;
  d["chunk"] = t.chunk;
  d["count"] = t.count;
  d["op"] = to_string(t.op);
  return d;
}

py::list steps_list(const Schedule& s) {
  py::list out;
  std::vector<Transfer> scratch;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const Step& st = s.steps[i];
    py::dict d;
    d["round"] = st.round;
    d["phase"] = s.phases[st.phase];
    d["pre_arrival"] = st.pre_arrival;
    d["reconfigure"] = st.reconfigure;
    py::list ts;
    for (const Transfer& t : s.transfers_of(i, scratch)) ts.append(transfer_dict(t));
    d["transfers"] = ts;
    out.append(d);
  }
  return out;
}

py::list rank_program_list(const Schedule& s, int rank) {
  py::list out;
  for (const RankOp& op : s.rank_program(rank)) {
    py::dict d;
    d["step"] = op.step;
    d["round"] = op.round;
    d["phase"] = s.phases[op.phase];
    d["pre_arrival"] = op.pre_arrival;
    d["send"] = op.has_send ? py::object(py::make_tuple(op.send_peer, op.send_chunk, op.send_count))
                            : py::object(py::none());
    d["recv"] = op.has_recv ? py::object(py::make_tuple(op.recv_peer, op.recv_chunk, op.recv_count,
                                                        to_string(op.recv_action)))
                            : py::object(py::none());
    out.append(d);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "stragg schedule library (torch-free): IR, generators, verifier, simulator";
  py::register_exception<ScheduleError>(m, "ScheduleError", PyExc_ValueError);

  py::class_<Schedule>(m, "Schedule")
      .def_readonly("algorithm", &Schedule::algorithm)
      .def_property_readonly("collective", [](const Schedule& s) { return std::string(to_string(s.collective)); })
      .def_readonly("n", &Schedule::n)
      .def_readonly("num_chunks", &Schedule::num_chunks)
      .def_readonly("segments", &Schedule::segments)
      .def_readonly("chunk_weights", &Schedule::chunk_weights)
      .def_readonly("chunk_owner", &Schedule::chunk_owner)
      .def_readonly("phases", &Schedule::phases)
      .def_readonly("stragglers", &Schedule::stragglers)
      .def_readonly("rank_slowdown", &Schedule::rank_slowdown)
      .def_readonly("params_json", &Schedule::params_json)
      .def_property_readonly("num_steps", &Schedule::num_steps)
      .def_property_readonly("num_rounds", &Schedule::num_rounds)
      .def_property_readonly("num_post_arrival_rounds", &Schedule::num_post_arrival_rounds)
      .def_property_readonly("compact", &Schedule::is_compact)
      .def("expanded", &Schedule::expanded)
      .def("steps", &steps_list)
      .def("rank_program", &rank_program_list, py::arg("rank"))
      .def("chunk_ranges",
           [](const Schedule& s, int64_t num_elements) {
             std::vector<std::pair<int64_t, int64_t>> out;
             for (const ElementRange& r : s.chunk_ranges(num_elements)) out.push_back({r.offset, r.length});
             return out;
           },
           py::arg("num_elements"))
      .def("verify",
           [](const Schedule& s) {
             VerifyResult r = verify(s);
             return py::make_tuple(r.ok, r.error);
           })
      .def("to_json", [](const Schedule& s, int indent) { return to_json(s, indent); },
           py::arg("indent") = -1)
      .def("table", [](const Schedule& s, int max_steps) { return to_table(s, max_steps); },
           py::arg("max_steps") = -1)
      .def("summary", [](const Schedule& s) { return summary(s); });

  m.def("build", [](const std::string& algo, int n, const std::string& params) {
          py::gil_scoped_release release;
          return build(algo, n, params);
        },
        py::arg("algo"), py::arg("n"), py::arg("params_json") = "{}");
  m.def("from_json", &schedule_from_json, py::arg("text"));
  m.def("algorithm_names", &algorithm_names);
  m.def("stragglar_round_lower_bound", &stragglar_round_lower_bound, py::arg("n"));
  m.def("stragglar_construction", &stragglar_construction, py::arg("n"),
        "Which construction builds stragglar(n, .) (see csrc/core/stragglar.cc).");

  m.def(
      "simulate",
      [](const Schedule& s, double nbytes, double alpha, double beta, std::vector<double> arrival,
         std::vector<double> slowdown, const std::string& mode, bool ring_topology,
         double hop_delay, double reconfig_delay, std::vector<bool> reconfigure,
         std::vector<int> host_of, double local_alpha, double local_beta) {
        SimOptions o;
        o.nbytes = nbytes;
        o.alpha = alpha;
        o.beta = beta;
        o.arrival = std::move(arrival);
        o.slowdown = std::move(slowdown);
        o.mode = sim_mode_from_string(mode);
        o.ring_topology = ring_topology;
        o.hop_delay = hop_delay;
        o.reconfig_delay = reconfig_delay;
        o.reconfigure = std::move(reconfigure);
        o.host_of = std::move(host_of);
        o.local_alpha = local_alpha;
        o.local_beta = local_beta;
        SimResult r = simulate(s, o);
        py::dict d;
        d["time"] = r.time;
        d["pre_arrival_time"] = r.pre_arrival_time;
        d["rank_finish"] = r.rank_finish;
        d["round_end"] = r.round_end;
        d["max_bytes_sent"] = r.max_bytes_sent;
        d["rounds"] = r.rounds;
        return d;
      },
      py::arg("schedule"), py::arg("nbytes"), py::arg("alpha"), py::arg("beta"),
      py::arg("arrival") = std::vector<double>{}, py::arg("slowdown") = std::vector<double>{},
      py::arg("mode") = "lockstep", py::arg("ring_topology") = false, py::arg("hop_delay") = 0.0,
      py::arg("reconfig_delay") = 0.0, py::arg("reconfigure") = std::vector<bool>{},
      py::arg("host_of") = std::vector<int>{}, py::arg("local_alpha") = 0.0,
      py::arg("local_beta") = 0.0);

  bind_settings(m);

  py::module_ cf = m.def_submodule("closed_form", "closed-form costs from the papers");
  cf.def("ring", &closed_form::ring);
  cf.def("rhd", &closed_form::rhd);
  cf.def("direct", &closed_form::direct);
  cf.def("stragglar_best", &closed_form::stragglar_best);
  cf.def("stragglar_worst", &closed_form::stragglar_worst);
  cf.def("stragglar_reduce_scatter", &closed_form::stragglar_reduce_scatter);
  cf.def("stragglar_critical_delay", &closed_form::stragglar_critical_delay);
  cf.def("stragglar_critical_delay_approx", &closed_form::stragglar_critical_delay_approx);
  cf.def("bcast_best", &closed_form::bcast_best);
  cf.def("bcast_worst", &closed_form::bcast_worst);
  cf.def("optcc_t0", &closed_form::optcc_t0);
  cf.def("optcc_single_limit", &closed_form::optcc_single_limit);
  cf.def("optcc_multi_limit", &closed_form::optcc_multi_limit);
  cf.def("optcc_single_lower_bound", &closed_form::optcc_single_lower_bound);
  cf.def("optcc_multi_lower_bound", &closed_form::optcc_multi_lower_bound);
  cf.def("optcc_single_finite", &closed_form::optcc_single_finite);
  cf.def("sc_choose", [](int n, double m, double a, double b, double d, double r) {
    closed_form::ShortCircuitChoice c = closed_form::sc_choose(n, m, a, b, d, r);
    py::dict out;
    out["tau_rs"] = c.tau_rs;
    out["tau_ag"] = c.tau_ag;
    out["time"] = c.time;
    out["ring_time"] = c.ring_time;
    return out;
  });
}
