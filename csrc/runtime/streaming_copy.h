// Copies that bypass the caches on their way to memory (no torch here).
//
// A plain copy into a buffer that is not in the caches first reads every destination line
// (read-for-ownership) and only then overwrites it: a copy of b bytes moves 3b through memory
// instead of 2b. Non-temporal stores write whole lines without reading them, at the price of
// evicting the destination from the caches. The executor uses them for the copying receives of
// all_reduces large enough not to fit in the caches anyway (STRAGG_STREAMING_BYTES).
#pragma once

#include <cstddef>

namespace stragg {

// dst[0, len) = src[0, len), dst's aligned part written with non-temporal stores and fenced
// (visible to other threads, in order with later stores, when this returns). The ranges must
// not overlap. A plain memcpy where the CPU has no such stores.
void copy_streaming(void* dst, const void* src, size_t len);

}  // namespace stragg
