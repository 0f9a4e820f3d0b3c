// Small helpers both transports use: error text, rank prefixes, setup-record fields, rounding.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace stragg::transport {

// strerror(err) as a string.
std::string errno_text(int err);

// "stragg: rank <rank>: ", the start of every error message a transport raises.
std::string rank_prefix(int rank);

// The fields of a setup record ("a|b|c"): empty fields are kept, a trailing separator is not.
std::vector<std::string> split(const std::string& s, char sep);

// "rank 3" or "ranks [1, 2]".
std::string join_ranks(const std::vector<int>& ranks);

inline size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

}  // namespace stragg::transport
