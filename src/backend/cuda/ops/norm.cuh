// One row of the residual add + RMSNorm with the row held in registers, for
// the norm kernel (ops/norm.cu rmsnorm_residual_reg_kernel). A GEMV with
// the norm fused in (measured and deleted: docs/cuda_backend.md "Deleted
// variants") would share it.
#pragma once

#include <cuda_bf16.h>

#include <cub/block/block_reduce.cuh>

#include "backend/cuda/ops/ops.h"

namespace fp8kv::cuda {

constexpr int kNormThreads = 256;
using NormReduce = cub::BlockReduce<float, kNormThreads>;

// 1 / sqrt(ss / n + eps) with IEEE division and square root (rmsnorm_cpu).
__device__ __forceinline__ float inv_rms(float ss, int n, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(n)), eps)));
}

// Row hr [n] (fp32, in place) of a block of kNormThreads threads:
//   if dr:  d = dr, and if delta_w: d = rmsnorm(d) * delta_w; hr += d
// leaves the row in hv (thread j owns elements j, j + 256, ...; zero past n)
// and returns 1 / rms(hr). Its fp32 sums and the block reduction see the
// same values in the same order for every kPer that fits n (n <= kPer *
// kNormThreads), so the bits do not depend on kPer. tmp / bcast are free
// again on return.
template <int kPer>
__device__ __forceinline__ float residual_row_inv(float* hr, const float* __restrict__ dr,
                                                  const float* __restrict__ delta_w, float eps, int n,
                                                  float (&hv)[kPer], NormReduce::TempStorage& tmp, float& bcast) {
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    hv[j] = i < n ? hr[i] : 0.0f;
  }
  if (dr) {
    float dv[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kNormThreads;
      dv[j] = i < n ? dr[i] : 0.0f;
    }
    if (delta_w) {
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (threadIdx.x + j * kNormThreads < n) ss += dv[j] * dv[j];
      const float total = NormReduce(tmp).Sum(ss);
      if (threadIdx.x == 0) bcast = total;
      __syncthreads();
      const float inv = inv_rms(bcast, n, eps);
      __syncthreads();  // tmp / bcast reused below
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = threadIdx.x + j * kNormThreads;
        if (i < n) hv[j] = __fadd_rn(hv[j], __fmul_rn(__fmul_rn(dv[j], inv), delta_w[i]));
      }
    } else {
#pragma unroll
      for (int j = 0; j < kPer; ++j) hv[j] = __fadd_rn(hv[j], dv[j]);
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kNormThreads;
      if (i < n) hr[i] = hv[j];
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (threadIdx.x + j * kNormThreads < n) ss += hv[j] * hv[j];
  const float total = NormReduce(tmp).Sum(ss);
  if (threadIdx.x == 0) bcast = total;
  __syncthreads();
  const float inv = inv_rms(bcast, n, eps);
  __syncthreads();  // tmp / bcast free for the caller
  return inv;
}

// residual_row_inv, then out = rmsnorm(hr) * w (bf16 when out_bf16, else
// fp32; may alias hr).
template <int kPer>
__device__ __forceinline__ void rmsnorm_residual_row(float* hr, const float* __restrict__ dr,
                                                     const float* __restrict__ delta_w, const float* __restrict__ w,
                                                     float eps, int n, void* out_row, bool out_bf16,
                                                     NormReduce::TempStorage& tmp, float& bcast) {
  float hv[kPer];
  const float inv = residual_row_inv<kPer>(hr, dr, delta_w, eps, n, hv, tmp, bcast);
  // out may alias h: h's element i was written above by this same thread.
  if (out_bf16) {
    __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out_row);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kNormThreads;
      if (i < n) o[i] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(hv[j], inv), w[i]));
    }
  } else {
    float* o = static_cast<float*>(out_row);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * kNormThreads;
      if (i < n) o[i] = __fmul_rn(__fmul_rn(hv[j], inv), w[i]);
    }
  }
}

}  // namespace fp8kv::cuda
