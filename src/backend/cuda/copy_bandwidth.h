// Device-to-device copy bandwidth, measured in the same run as a benchmark:
// the ceiling `fp8kv bench` reports floor_fraction against (docs/bench.md),
// the device twin of bench/copy_bandwidth.h's host copy. It lives in the CUDA
// library because src/bench/ builds without CUDA; bench_linear and
// bench_prefill_gemm use it too.
#pragma once
#include <cstddef>

namespace fp8kv::cuda {

// cudaMemcpyAsync device-to-device of `bytes` (default 1 GiB: well past the
// H200's 60 MB L2), timed with CUDA events, median of `reps` after two
// warm-ups. Returns (bytes read + bytes written) per second. Throws
// std::runtime_error (naming the call) when no device or an allocation fails.
double d2d_copy_bytes_per_s(size_t bytes = size_t{1} << 30, int reps = 10);

}  // namespace fp8kv::cuda
