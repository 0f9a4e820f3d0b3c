#include "runtime/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: part of every x86-64 CPU
#endif

namespace stragg {

void copy_streaming(void* dst, const void* src, size_t len) {
#if defined(__x86_64__)
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  // Plain stores up to the first 16-byte boundary of dst (non-temporal stores must be aligned).
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (head > len) head = len;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  len -= head;
  size_t i = 0;
  for (; i + 64 <= len; i += 64) {  // one cache line per iteration
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, len - i);
  // Non-temporal stores are weakly ordered: without the fence, a later release store (the
  // slot's tail, the call's completion) could become visible before the data.
  _mm_sfence();
#else
  std::memcpy(dst, src, len);
#endif
}

}  // namespace stragg
