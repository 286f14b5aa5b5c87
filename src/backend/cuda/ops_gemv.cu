// Decode-shaped linear (ops.h gemv_bf16): y[T][N] (+)= x[T][K] W[N][K]^T
// (+ bias) for T <= 8 rows, bf16 inputs, fp32 accumulation and output. At
// these shapes the GEMM is a weight stream: one warp per output column n
// reads W's row n once in 16-byte chunks (4 in flight per lane) and
// multiplies it with all T rows of x (which stay in L1/L2); a warp shuffle
// reduction finishes the dot products. docs/cuda_backend.md "GEMV".
#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"

namespace fp8kv::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

__device__ __forceinline__ void bf16x8_to_f32(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <int T>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ W, const float* __restrict__ bias,
                float* __restrict__ y, int64_t N, int64_t K, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  const uint4* w = reinterpret_cast<const uint4*>(W + n * K);
  const int64_t chunks = K / 8;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * 32;
      // Streamed once: do not keep W in L1.
      wv[u] = c < chunks ? __ldcs(w + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * 32;
      if (c >= chunks) break;
      float wf[8];
      bf16x8_to_f32(wv[u], wf);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float xf[8];
        bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(x + t * K) + c), xf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[t] = fmaf(xf[i], wf[i], acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  }
  if (lane == 0) {
    const float b = bias ? bias[n] : 0.0f;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = acc[t] + b;
      if (accumulate) v += y[t * N + n];
      y[t * N + n] = v;
    }
  }
}

template <int T>
void launch(const uint16_t* x, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
            cudaStream_t stream) {
  const int64_t blocks = (W.rows + kWarps - 1) / kWarps;
  gemv_kernel<T><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(x, W.data, bias, y, W.rows, W.cols,
                                                                           accumulate);
  FP8KV_CU_LAUNCH();
}

}  // namespace

bool gemv_bf16_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W) {
  return T >= 1 && T <= kGemvMaxRows && W.cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W.data) % 16 == 0 && W.rows <= (int64_t{1} << 31) * kWarps;
}

void gemv_bf16(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
               cudaStream_t stream) {
  if (!gemv_bf16_fits(x, T, W))
    throw std::invalid_argument("cuda::gemv_bf16: needs 1 <= T <= " + std::to_string(kGemvMaxRows) +
                                ", K % 8 == 0 and 16-byte aligned x and W (T=" + std::to_string(T) +
                                " K=" + std::to_string(W.cols) + ")");
  switch (T) {
    case 1: launch<1>(x, W, bias, y, accumulate, stream); break;
    case 2: launch<2>(x, W, bias, y, accumulate, stream); break;
    case 3: launch<3>(x, W, bias, y, accumulate, stream); break;
    case 4: launch<4>(x, W, bias, y, accumulate, stream); break;
    case 5: launch<5>(x, W, bias, y, accumulate, stream); break;
    case 6: launch<6>(x, W, bias, y, accumulate, stream); break;
    case 7: launch<7>(x, W, bias, y, accumulate, stream); break;
    case 8: launch<8>(x, W, bias, y, accumulate, stream); break;
  }
}

}  // namespace fp8kv::cuda
