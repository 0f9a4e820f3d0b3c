// StragglAR designs found offline for n <= 255 (csrc/core/stragglar_designs.inc, written by
// csrc/core/tools/stragglar_search.py): look-up and expansion at generation time.
#include "core/stragglar_internal.h"

namespace stragg {
namespace core {
namespace stragglar_impl {
namespace {
#include "core/stragglar_designs.inc"
}  // namespace

bool load_design(int n, CirculantDesign& d) {
  const int m = n - 1;
  const char* enc = nullptr;
  for (const auto& e : kStragglarDesigns)
    if (e.n == n) {
      d.A = e.max_age;
      enc = e.beta;
      break;
    }
  if (!enc) return false;
  d.beta.assign(m, 0);
  for (int y = 1; y < m; ++y) d.beta[y] = enc[y - 1] - '0';
  return complete_send_ages(m, d);
}

}  // namespace stragglar_impl
}  // namespace core
}  // namespace stragg
