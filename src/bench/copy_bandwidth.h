// Copy bandwidth measured in the same run as a benchmark: the ceiling that
// floor_fraction is relative to (docs/bench.md). Counted as bytes read plus
// bytes written per second, as device-to-device copy figures are quoted.
#pragma once
#include <cstddef>

namespace fp8kv::bench {

// Host: memcpy of `bytes` (well past the last-level cache) split over the
// OpenMP threads, median of `reps` timed copies after one warm-up.
double host_copy_bytes_per_s(size_t bytes = size_t{512} << 20, int reps = 7);

}  // namespace fp8kv::bench
