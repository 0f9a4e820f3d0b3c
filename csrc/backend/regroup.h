// What a stragg group hands its creator in shrink_group and split_group (regroup.cc): the
// request, and the callback (stragg/_regroup.py's, installed by the Python creator) that builds
// the new backend from it.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stragg {

class StraggBackend;

// What torch asks of a parent group in shrink_group (Backend::shrink) and split_group
// (Backend::split). The new backend is built by whoever created the parent (the Python creator,
// stragg/_regroup.py: it knows the parent's store, settings and inner backends).
struct RegroupRequest {
  enum class Kind { Shrink, Split };
  Kind kind = Kind::Shrink;
  // Shrink: the parent ranks to exclude (sorted); Split: the new group's members (parent ranks,
  // in the order that numbers them).
  std::vector<int64_t> ranks;
  int flags = 0;  // Shrink: SHRINK_DEFAULT (0) or SHRINK_ABORT (1)
  // Split: torch's store for the new group, its timeout and name.
  c10::intrusive_ptr<c10d::Store> store;
  std::chrono::milliseconds timeout{0};
  std::string group_name;
};
// Returns the new backend; null for a split that leaves this rank out.
using Regroup =
    std::function<c10::intrusive_ptr<c10d::Backend>(StraggBackend&, const RegroupRequest&)>;

}  // namespace stragg
