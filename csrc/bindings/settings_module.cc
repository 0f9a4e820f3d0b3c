// stragg._core's settings functions: the one table and the one parser (csrc/plan/settings.h),
// for python/stragg/_config.py (environment, set_policy, profiler.configure, pg_options),
// stragg.info and the size arguments of the CLIs.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "plan/settings.h"

namespace py = pybind11;

void bind_settings(py::module_& m) {
  py::register_exception<stragg::SettingsError>(m, "SettingsError", PyExc_ValueError);
  m.def("settings_table", [] {
    py::list rows;
    for (const stragg::SettingInfo& i : stragg::settings_table()) {
      py::dict d;
      d["key"] = i.key;
      d["env"] = i.env;
      d["type"] = i.type;
      d["default"] = i.default_text;
      d["accepted"] = i.accepted;
      d["meaning"] = i.meaning;
      d["must_match"] = i.must_match;
      rows.append(d);
    }
    return rows;
  });
  // [(key, raw, source), ...] -> {key: canonical text} of every setting (defaults included).
  // Raises SettingsError (a ValueError) naming the source, the value and what is accepted.
  m.def(
      "parse_settings",
      [](const std::vector<std::tuple<std::string, std::string, std::string>>& values) {
        std::vector<stragg::SettingValue> v;
        for (const auto& [key, raw, source] : values) v.push_back({key, raw, source});
        const stragg::Settings s = stragg::parse_settings(v);
        py::dict out;
        for (const stragg::SettingInfo& i : stragg::settings_table()) {
          out[py::str(i.key)] = stragg::setting_text(s, i.key);
        }
        return out;
      },
      py::arg("values"));
  m.def("parse_size", &stragg::parse_size, py::arg("text"), py::arg("what") = "size");
  m.def("format_size", &stragg::format_size, py::arg("bytes"));
}
