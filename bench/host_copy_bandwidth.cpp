// Host memory ceiling for CPU-backend roofline numbers in docs/PERF.md:
// best of 5 single-thread memcpy of 512 MiB, counting read + write.
//   g++ -O2 -o /tmp/host_copy_bandwidth bench/host_copy_bandwidth.cpp && /tmp/host_copy_bandwidth
#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <vector>
int main() {
  const size_t n = size_t(512) << 20;  // 512 MiB, far beyond any cache
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n / s / 1e9);  // read + write
  }
  std::printf("memcpy %.1f GB/s (read+write, 1 thread)\n", best);
}
