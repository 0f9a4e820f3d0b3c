// Readable table printer for schedules.
//
//   step rnd phase      | r0        r1        ...
//   0    0   pre_rs     | >1:c3+    <0:c3+ >2:c1+
// ">1:c3" = send chunk 3 to rank 1; "<0:c3+" = receive chunk 3 from rank 0 and reduce ("=" copy).
// A run of chunks prints as c3..5.
#include <algorithm>
#include <sstream>

#include "core/ir.h"

namespace stragg {
namespace core {

namespace {

std::string chunk_label(int chunk, int count) {
  std::string s = "c" + std::to_string(chunk);
  if (count > 1) s += ".." + std::to_string(chunk + count - 1);
  return s;
}

}  // namespace

std::string summary(const Schedule& s) {
  std::ostringstream os;
  os << s.algorithm << " " << to_string(s.collective) << ": n=" << s.n
     << " chunks=" << s.num_chunks;
  if (s.segments > 1) os << " segments=" << s.segments;
  os << " steps=" << s.num_steps() << " rounds=" << s.num_rounds();
  if (!s.stragglers.empty()) {
    os << " stragglers=[";
    for (size_t i = 0; i < s.stragglers.size(); ++i) os << (i ? "," : "") << s.stragglers[i];
    os << "] post-arrival rounds=" << s.num_post_arrival_rounds();
  }
  return os.str();
}

std::string to_table(const Schedule& s, int max_steps) {
  std::vector<std::vector<std::string>> cells;  // [step][rank]
  const int rows = max_steps < 0 ? s.num_steps() : std::min(max_steps, s.num_steps());
  size_t width = 4;
  std::vector<Transfer> scratch;
  for (int i = 0; i < rows; ++i) {
    std::vector<std::string> row(s.n);
    for (const Transfer& t : s.transfers_of(i, scratch)) {
      std::string send = ">" + std::to_string(t.dst) + ":" + chunk_label(t.chunk, t.count);
      std::string recv = "<" + std::to_string(t.src) + ":" + chunk_label(t.chunk, t.count) +
                         (t.op == RecvAction::kCopy          ? "="
                          : t.op == RecvAction::kReduceFirst ? "+<"
                                                             : "+");
      row[t.src] = row[t.src].empty() ? send : send + " " + row[t.src];
      row[t.dst] = row[t.dst].empty() ? recv : row[t.dst] + " " + recv;
    }
    for (const auto& c : row) width = std::max(width, c.size());
    cells.push_back(std::move(row));
  }
  size_t phase_w = 5;
  for (const auto& p : s.phases) phase_w = std::max(phase_w, p.size());

  std::ostringstream os;
  os << summary(s) << "\n";
  auto pad = [](const std::string& x, size_t w) {
    return x.size() >= w ? x : x + std::string(w - x.size(), ' ');
  };
  os << pad("step", 5) << pad("rnd", 5) << pad("phase", phase_w + 1) << "|";
  for (int r = 0; r < s.n; ++r) os << " " << pad("r" + std::to_string(r), width);
  os << "\n";
  for (int i = 0; i < rows; ++i) {
    const Step& st = s.steps[i];
    std::string phase = s.phases[st.phase] + (st.pre_arrival ? "*" : "");
    os << pad(std::to_string(i), 5) << pad(std::to_string(st.round), 5) << pad(phase, phase_w + 1)
       << "|";
    for (int r = 0; r < s.n; ++r) os << " " << pad(cells[i][r].empty() ? "." : cells[i][r], width);
    os << "\n";
  }
  if (rows < s.num_steps()) os << "... (" << s.num_steps() - rows << " more steps)\n";
  os << "(>p:cX send chunk X to p; <p:cX+ receive and reduce; <p:cX= receive and copy; "
        "* pre-arrival)\n";
  return os.str();
}

}  // namespace core
}  // namespace stragg
