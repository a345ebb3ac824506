// The pseudo-random values of Backend::fill_random, one formula for the host and the
// device (a kernel includes this header too), so every backend fills the same weights.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln::ops {

// splitmix64: a counter-based generator, every bit of the input reaching every bit out.
KILN_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of the stream `seed`: about N(0, 1), the sum of the four 16-bit uniforms of one
// splitmix64 output (Irwin-Hall, variance 4/12) rescaled to unit variance. Bounded by
// +-2 sqrt(3), which dummy weights want anyway (no outliers to overflow bf16 sums).
KILN_HOST_DEVICE inline float unit_normal(uint64_t seed, uint64_t i) {
  const uint64_t h = splitmix64(seed ^ splitmix64(i));
  const float s = float(h & 0xffff) + float((h >> 16) & 0xffff) + float((h >> 32) & 0xffff) + float(h >> 48);
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

}  // namespace kiln::ops
