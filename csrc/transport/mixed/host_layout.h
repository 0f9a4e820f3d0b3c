// Which ranks of a group share a host, worked out identically on every rank from every rank's
// host identity (common/host_identity.h, exchanged at setup). Hosts are numbered in the order
// of their lowest rank; the ranks of one host, in ascending order, get local ranks 0..k-1, the
// numbering of that host's shared-memory sub-group in the mixed transport.
#pragma once

#include <string>
#include <vector>

namespace stragg {

class HostLayout {
 public:
  // `identities[r]`: rank r's host identity (equal strings: same host). At least one rank.
  explicit HostLayout(const std::vector<std::string>& identities);

  int size() const { return static_cast<int>(host_of_.size()); }
  int num_hosts() const { return static_cast<int>(ranks_of_.size()); }
  int host_of(int rank) const { return host_of_[rank]; }
  int local_rank_of(int rank) const { return local_rank_of_[rank]; }
  // The ranks of host `host`, ascending (local rank i is ranks_on(host)[i]).
  const std::vector<int>& ranks_on(int host) const { return ranks_of_[host]; }
  bool same_host(int a, int b) const { return host_of_[a] == host_of_[b]; }

  bool all_on_one_host() const { return num_hosts() == 1; }
  bool every_rank_alone() const { return num_hosts() == size(); }

  // "[[0, 1], [2, 3]]": the ranks of each host, for logs and messages.
  std::string describe() const;

 private:
  std::vector<int> host_of_;
  std::vector<int> local_rank_of_;
  std::vector<std::vector<int>> ranks_of_;
};

}  // namespace stragg
