// StragglAR designs found offline for n <= 255 (csrc/core/stragglar_designs.inc, written by
// csrc/core/tools/stragglar_search.py): look-up and expansion at generation time.
//
// An entry is a circulant design (receive age per position, stragglar_circulant.cc) for the
// rounds before `tail_from`, and from there on the explicit receives: per round and per
// non-straggler rank, the age of the chunk it receives ('.' for none). Senders are not stored:
// per round, a bipartite matching receivers -> free holders of their chunk (RoundMatcher) finds
// them, and one always exists because the search checked the per-round, per-chunk sender counts.
// An entry without a tail is a plain circulant design (the older form; make_schedule then adds a
// greedy tail and compares with the matching heuristic). An entry whose tail starts at round 0
// uses none of its circulant rounds; it keeps the design for stragglar_circulant.cc's greedy tail.
#include "core/stragglar_internal.h"

namespace stragg {
namespace core {
namespace stragglar_impl {
namespace {

#include "core/stragglar_designs.inc"

const StragglarDesignEntry* find_entry(int n) {
  for (const auto& e : kStragglarDesigns)
    if (e.n == n) return &e;
  return nullptr;
}

std::string bad(int n, const std::string& what) {
  return "stragglar: stored design for n=" + std::to_string(n) + " is invalid: " + what;
}

// Appends explicit rounds r0 .. r0 + rows - 1 (rows of m characters each).
void append_rows(Schedule& s, int phase, PropagationState& ps, int r0, const std::string& rows) {
  const int n = s.n, m = n - 1, sigma = n - 1;
  if (rows.size() % m != 0) throw ScheduleError(bad(n, "tail length not a multiple of n-1"));
  const int count = static_cast<int>(rows.size()) / m;
  std::vector<char> can_send(n, 0);
  for (int r = r0; r < r0 + count; ++r) {
    Step& st = s.add_step(phase);
    for (int g = 0; g < m; ++g) can_send[g] = g != r;
    can_send[sigma] = r >= m;
    if (r < m) add_exchange_with_straggler(st, r, sigma);
    RoundMatcher match(ps, n, can_send);
    for (int v = 0; v < m; ++v) {
      const int age = decode_age(rows[static_cast<size_t>(r - r0) * m + v]);
      if (age == 0) continue;
      const int c = r - age;
      if (age < 0 || c < 0 || c >= m || c >= r || (r < m && v == r) || ps.holds(v, c) ||
          !match.add(v, c))
        throw ScheduleError(bad(n, "round " + std::to_string(r) + ", rank " +
                                       std::to_string(v) + " cannot receive age " +
                                       std::to_string(age)));
    }
    std::vector<std::pair<int, int>> gains;
    match.for_each([&](int from, int to, int c) {
      st.transfers.push_back({from, to, c, 1, RecvAction::kCopy});
      gains.push_back({to, c});
    });
    for (auto [g, c] : gains) ps.give(g, c);
    if (r < m) record_exchange(ps, r, sigma, r);
  }
}

}  // namespace

int decode_age(char ch) {
  if (ch == '.') return 0;
  if (ch >= '1' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'z') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'Z') return ch - 'A' + 36;
  return -1;
}

bool parse_beta(int n, const std::string& beta, int max_age, CirculantDesign& d) {
  const int m = n - 1;
  if (static_cast<int>(beta.size()) != m - 1) return false;
  d.A = max_age;
  d.beta.assign(m, 0);
  for (int y = 1; y < m; ++y) d.beta[y] = decode_age(beta[y - 1]);
  return complete_send_ages(m, d);
}

void expand_design(Schedule& s, int phase, const std::string& beta, int max_age, int tail_from,
                   const std::string& tail) {
  const int n = s.n;
  PropagationState ps(n);
  if (!beta.empty()) {
    CirculantDesign d;
    if (!parse_beta(n, beta, max_age, d) || !check_design(n - 1, d))
      throw ScheduleError(bad(n, "circulant part is not a design"));
    append_circulant(s, phase, d, ps, tail_from);
  } else if (tail_from != 0) {  // nothing before the tail
    throw ScheduleError(bad(n, "no circulant part but tail_from != 0"));
  }
  append_rows(s, phase, ps, tail_from, tail);
  if (!ps.all_complete()) throw ScheduleError(bad(n, "chunks not fully propagated"));
}

bool load_design(int n, CirculantDesign& d) {
  const StragglarDesignEntry* e = find_entry(n);
  return e && e->beta[0] != '\0' && parse_beta(n, e->beta, e->max_age, d);
}

bool has_stored(int n) { return find_entry(n) != nullptr; }

bool append_stored(Schedule& s, int phase, std::string* construction) {
  const StragglarDesignEntry* e = find_entry(s.n);
  if (!e || e->tail[0] == '\0') return false;
  expand_design(s, phase, e->beta, e->max_age, e->tail_from, e->tail);
  if (construction) *construction = std::string("stored:") + e->construction;
  return true;
}

}  // namespace stragglar_impl
}  // namespace core
}  // namespace stragg
