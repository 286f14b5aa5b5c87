// What the bf16 and the fp8 decode GEMVs (gemv.cu, gemv_fp8.cu) share: the
// block shape, the PDL wait of the weight-streaming kernels, the bf16 ->
// fp32 unpacking of a 16-byte chunk, the bf16 mma.sync, the SIMT kernels'
// weight stream, warp and split-K sums and column store, and the host
// dispatch from run-time rows / split to the kernels' template arguments.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "backend/cuda/ops/launch.cuh"

namespace fp8kv::cuda::gemv {

constexpr int kWarps = 8;   // per block
constexpr int kUnroll = 4;  // 16-byte weight chunks in flight per lane

// The GEMV kernels are launched as programmatic dependents (launch.cuh): a
// block may start while the previous kernel still runs (when that kernel
// triggered early: the norm, RoPE and activation kernels do), loads its
// first weight tiles (W never depends on an earlier kernel), and only then
// waits (pdl_wait) before it reads x or y. After the wait it triggers its
// own dependents (the next norm / RoPE / activation kernel, PDL-launched
// with the GEMV on), which wait for this grid in turn.
__device__ __forceinline__ void wait_for_inputs() {
  pdl_wait();
  pdl_trigger();
}

__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// The SIMT kernels' weight stream: body(c, chunk) for this lane's 16-byte
// chunks c = first, first + 32 S, ... (< chunks) of w, in order. The loads
// are double-buffered: the next kUnroll chunks are in flight while the
// current ones are used. Waits for the inputs (PDL) after the first loads.
template <int S, class Body>
__device__ __forceinline__ void stream_chunks(const uint4* w, int64_t chunks, int64_t first, Body&& body) {
  constexpr int64_t kStride = 32 * S;            // between a lane's consecutive chunks
  constexpr int64_t kBatch = kStride * kUnroll;  // chunks per loop iteration (all S warps)
  uint4 cur[kUnroll], nxt[kUnroll];
  auto load_w = [&](uint4(&v)[kUnroll], int64_t c0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * kStride;
      // Streamed once: do not keep W in L1.
      v[u] = c < chunks ? __ldcs(w + c) : make_uint4(0, 0, 0, 0);
    }
  };
  load_w(cur, first);
  wait_for_inputs();
  for (int64_t c0 = first; c0 < chunks; c0 += kBatch) {
    load_w(nxt, c0 + kBatch);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * kStride;
      if (c >= chunks) break;
      body(c, cur[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = nxt[u];
  }
}

// d += A B for one mma.sync.m16n8k16 (bf16 in, fp32 accumulate): a0..a3 the
// A fragment (rows g / g + 8, k slots 2q.. / 2q + 8..), b0, b1 the B
// fragment (column g), lane = 4 g + q (the PTX ISA's fragment layout).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// acc[t] summed over the warp (every lane holds the sums).
template <int T>
__device__ __forceinline__ void warp_sum(float (&acc)[T]) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  }
}

// Split K (S warps per column: warp = its warp sub, sub = 0..S-1), in two
// halves around the kernel's return of the warps that are done: each warp's
// sums into the shared `part` (lane 0), then the block's barrier ...
template <int T>
__device__ __forceinline__ void split_publish(float (&part)[kWarps][T], const float (&acc)[T], int lane, int warp) {
  if (lane == 0) {
#pragma unroll
    for (int t = 0; t < T; ++t) part[warp][t] = acc[t];
  }
  __syncthreads();
}

// ... and in sub 0's warp the S sums added in fixed order (sub 0, 1, ...).
template <int S, int T>
__device__ __forceinline__ void split_gather(const float (&part)[kWarps][T], float (&acc)[T], int warp) {
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float v = part[warp][t];
#pragma unroll
    for (int s = 1; s < S; ++s) v += part[warp + s][t];
    acc[t] = v;
  }
}

// Column n of y[T][N] = acc (+ bias[n]) (+ y when accumulating).
template <int T>
__device__ __forceinline__ void store_column(const float (&acc)[T], const float* __restrict__ bias,
                                             float* __restrict__ y, int64_t N, int64_t n, bool accumulate) {
  const float b = bias ? bias[n] : 0.0f;
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float v = acc[t] + b;
    if (accumulate) v += y[t * N + n];
    y[t * N + n] = v;
  }
}

// f(std::integral_constant<int, T>{}) for T = rows (1..8; others: nothing).
template <class F>
void for_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: break;
  }
}

// f(std::integral_constant<int, S>{}) for S = split (1, 2, 4 or 8; else
// std::invalid_argument naming `what`).
template <class F>
void for_split(int split, const char* what, F&& f) {
  switch (split) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default:
      throw std::invalid_argument(std::string("cuda::") + what + ": split must be 1, 2, 4 or 8, got " +
                                  std::to_string(split));
  }
}

}  // namespace fp8kv::cuda::gemv
