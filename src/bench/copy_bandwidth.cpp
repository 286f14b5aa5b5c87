#include "bench/copy_bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

namespace fp8kv::bench {

double host_copy_bytes_per_s(size_t bytes, int reps) {
  bytes = std::max<size_t>(bytes, 1 << 20);
  reps = std::max(reps, 1);
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  // Touch both buffers in parallel (first touch places the pages).
#pragma omp parallel for schedule(static)
  for (long i = 0; i < static_cast<long>(bytes); i += 4096) src[i] = static_cast<char>(i), dst[i] = 0;
  auto copy = [&] {
#pragma omp parallel
    {
      const size_t n = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
      const size_t chunk = (bytes + n - 1) / n, b = std::min(bytes, t * chunk), e = std::min(bytes, b + chunk);
      if (e > b) std::memcpy(dst.get() + b, src.get() + b, e - b);
    }
  };
  copy();  // warm-up
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    copy();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return 2.0 * static_cast<double>(bytes) / s[s.size() / 2];
}

}  // namespace fp8kv::bench
