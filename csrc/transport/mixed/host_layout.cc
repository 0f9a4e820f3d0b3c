#include "transport/mixed/host_layout.h"

#include <map>

#include "common/error.h"

namespace stragg {

HostLayout::HostLayout(const std::vector<std::string>& identities) {
  if (identities.empty()) throw Error("stragg: host layout of an empty group");
  std::map<std::string, int> index;
  for (const std::string& id : identities) {
    auto it = index.find(id);
    if (it == index.end()) {
      it = index.emplace(id, static_cast<int>(ranks_of_.size())).first;
      ranks_of_.emplace_back();
    }
    const int host = it->second;
    host_of_.push_back(host);
    local_rank_of_.push_back(static_cast<int>(ranks_of_[host].size()));
    ranks_of_[host].push_back(static_cast<int>(host_of_.size()) - 1);
  }
}

std::string HostLayout::describe() const {
  std::string out = "[";
  for (size_t h = 0; h < ranks_of_.size(); ++h) {
    out += h ? ", [" : "[";
    for (size_t i = 0; i < ranks_of_[h].size(); ++i) {
      out += (i ? ", " : "") + std::to_string(ranks_of_[h][i]);
    }
    out += "]";
  }
  return out + "]";
}

}  // namespace stragg
