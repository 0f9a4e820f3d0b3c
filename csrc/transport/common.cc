#include "transport/common.h"

#include <cstring>
#include <sstream>

#include "common/rendezvous.h"

namespace stragg::transport {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

std::string rank_prefix(int rank) { return "stragg: rank " + std::to_string(rank) + ": "; }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

std::string join_ranks(const std::vector<int>& ranks) { return ranks_list(ranks); }

}  // namespace stragg::transport
