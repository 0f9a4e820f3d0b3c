// shrink_group and split_group on stragg: torch calls Backend::shrink / Backend::split on the
// parent; the parent hands the request to the callback its creator installed (stragg/_regroup.py:
// the survivors agree through the store, then a new StraggBackend with its own transport and
// inner Gloo/NCCL is built over them). Here: the checks that need no Python, and retiring the
// parent.
#include <c10/util/Exception.h>

#include <algorithm>
#include <set>

#include "backend/dist_error.h"
#include "backend/stragg_backend.h"
#include "backend/text.h"

namespace stragg {

c10::intrusive_ptr<c10d::Backend> StraggBackend::shrink(
    const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
    const c10::intrusive_ptr<Options>& /*opts_override: stragg's settings stay the parent's*/) {
  const std::string where = "stragg: rank " + std::to_string(getRank()) + ": shrink_group: ";
  TORCH_CHECK(regroup_, where, "this group was not created by stragg's Python creator");
  TORCH_CHECK_VALUE(shrink_flags == 0 || shrink_flags == 1, where, "shrink_flags ", shrink_flags,
                    " is neither SHRINK_DEFAULT (0) nor SHRINK_ABORT (1)");
  std::set<int64_t> excluded;
  for (int64_t r : ranks_to_exclude) {
    TORCH_CHECK_VALUE(r >= 0 && r < getSize(), where, "rank ", r,
                      " in ranks_to_exclude is not in this group of ", getSize(), " ranks");
    TORCH_CHECK_VALUE(excluded.insert(r).second, where, "rank ", r,
                      " appears twice in ranks_to_exclude ", bracketed(ranks_to_exclude));
  }
  TORCH_CHECK_VALUE(!excluded.empty(), where, "ranks_to_exclude is empty");
  TORCH_CHECK_VALUE(static_cast<int>(excluded.size()) < getSize(), where,
                    "ranks_to_exclude ", bracketed(ranks_to_exclude), " excludes all ", getSize(),
                    " ranks of the group");
  TORCH_CHECK(!excluded.count(getRank()), where, "this rank is in ranks_to_exclude ",
              bracketed(ranks_to_exclude),
              "; only the survivors call shrink_group (an excluded rank just stops using the group)");
  RegroupRequest request;
  request.kind = RegroupRequest::Kind::Shrink;
  request.ranks.assign(excluded.begin(), excluded.end());
  request.flags = shrink_flags;
  return regroup_(*this, request);
}

c10::intrusive_ptr<c10d::Backend> StraggBackend::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  const std::string where = "stragg: rank " + std::to_string(getRank()) + ": split_group: ";
  TORCH_CHECK(regroup_, where, "this group was not created by stragg's Python creator");
  std::set<int> seen;
  for (int r : ranks) {
    TORCH_CHECK_VALUE(r >= 0 && r < getSize(), where, "rank ", r, " is not in this group of ",
                      getSize(), " ranks");
    TORCH_CHECK_VALUE(seen.insert(r).second, where, "rank ", r, " appears twice");
  }
  if (!seen.count(getRank())) return {};  // not a member: nothing to build, nobody to meet
  RegroupRequest request;
  request.kind = RegroupRequest::Kind::Split;
  request.ranks.assign(ranks.begin(), ranks.end());
  request.store = store;
  request.timeout = opts ? opts->timeout : timeout_;
  request.group_name = opts ? opts->group_name : "";
  return regroup_(*this, request);
}

c10::intrusive_ptr<c10d::Backend::Options> StraggBackend::getBackendOptions() {
  auto opts = c10::make_intrusive<Options>("stragg", timeout_);
  opts->group_name = getGroupUid();
  return opts;
}

void StraggBackend::retire(bool abort, const std::string& why) {
  // The session's first abort reason is the one every later op (here and on an excluded rank
  // that is alive) raises with.
  if (abort) {
    session_->abort(why);
    this->abort();  // the CUDA path and the inner backends
  } else {
    shutdown();  // runs the queued calls to completion (each bounded by its timeout)
  }
}

}  // namespace stragg
