// RMSNorm (+ residual, + Gemma sandwich post-norm) and the attention input
// prep (per-head QK-norm + RoPE). Formulas as backend/cpu/ops.cpp, with
// explicit IEEE mul/add (no contraction) where the CPU has none.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/attention/kv_quant.cuh"
#include "backend/cuda/ops/ops.h"
#include "backend/cuda/ops/launch.cuh"
#include "backend/cuda/ops/norm.cuh"
#include "backend/cuda/ops/qkv.cuh"

namespace fp8kv::cuda {

namespace {

// Block-wide sum of x^2 over a row of n elements.
__device__ float row_sumsq(const float* x, int n, NormReduce::TempStorage& tmp, float* bcast) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
  const float total = NormReduce(tmp).Sum(ss);
  if (threadIdx.x == 0) *bcast = total;
  __syncthreads();
  const float r = *bcast;
  __syncthreads();  // tmp / bcast reused by the next call
  return r;
}

__global__ void rmsnorm_residual_kernel(float* h, const float* __restrict__ delta,
                                        const float* __restrict__ delta_w, const float* __restrict__ w, float eps,
                                        int n, void* out, bool out_bf16) {
  __shared__ NormReduce::TempStorage tmp;
  __shared__ float bcast;
  // The next kernel may be scheduled now (a PDL-launched GEMV prefetches its
  // weights); it still waits for this grid to finish (ops_launch.cuh). Then
  // wait for the previous kernel's h / delta.
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.x;
  float* hr = h + r * n;
  if (delta) {
    const float* dr = delta + r * n;
    if (delta_w) {
      const float inv = inv_rms(row_sumsq(dr, n, tmp, &bcast), n, eps);
      for (int i = threadIdx.x; i < n; i += blockDim.x) hr[i] = __fadd_rn(hr[i], __fmul_rn(__fmul_rn(dr[i], inv), delta_w[i]));
    } else {
      for (int i = threadIdx.x; i < n; i += blockDim.x) hr[i] = __fadd_rn(hr[i], dr[i]);
    }
    __syncthreads();  // row_sumsq below reads elements written by other threads
  }
  const float inv = inv_rms(row_sumsq(hr, n, tmp, &bcast), n, eps);
  // out may alias h: each element is read then written by the same thread.
  if (out_bf16) {
    __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out) + r * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(hr[i], inv), w[i]));
  } else {
    float* o = static_cast<float*>(out) + r * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = __fmul_rn(__fmul_rn(hr[i], inv), w[i]);
  }
}

// The same arithmetic as rmsnorm_residual_kernel, with the row held in
// registers: thread j owns elements j, j + 256, ... (the loop kernel's
// assignment, so each thread's fp32 sums and the block reduction see the same
// values in the same order: bitwise the same output), and every load of the
// row is issued at once instead of once per pass. At decode (one row of 4096
// per token) the loop kernel is three dependent passes of 16 loads each on
// one SM; this is one round trip per pass. n <= kPer * kNormThreads. The row
// math is ops_norm.cuh rmsnorm_residual_row.
template <int kPer>
__global__ void rmsnorm_residual_reg_kernel(float* h, const float* __restrict__ delta,
                                            const float* __restrict__ delta_w, const float* __restrict__ w,
                                            float eps, int n, void* out, bool out_bf16) {
  __shared__ NormReduce::TempStorage tmp;
  __shared__ float bcast;
  // The next kernel may be scheduled now (a PDL-launched GEMV prefetches its
  // weights); it still waits for this grid to finish (ops_launch.cuh). Then
  // wait for the previous kernel's h / delta.
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.x;
  void* out_row = out_bf16 ? static_cast<void*>(static_cast<__nv_bfloat16*>(out) + r * n)
                           : static_cast<void*>(static_cast<float*>(out) + r * n);
  rmsnorm_residual_row<kPer>(h + r * n, delta ? delta + r * n : nullptr, delta_w, w, eps, n, out_row, out_bf16,
                                    tmp, bcast);
}

// rmsnorm_residual_reg_kernel's row, then the row quantized as
// quantize_rows_e4m3 would quantize the out it writes (w8a8_quant.cu, the
// same operations): each element y = rmsnorm(h) * w, rounded to bf16 when
// out_bf16; per group (128 columns, or the whole row) amax = fmaxf from 0
// over |y| (order-free, a NaN ignored), scale = amax / 448 (IEEE division;
// 1 without a positive amax), code = e4m3_satfinite(y / scale). Thread j's
// element i = j + 256 k lies in group i / 128 = 2k + j / 128: warps 0-3 hold
// group 2k, warps 4-7 group 2k + 1. No padding rows (T_pad = T), codes rows
// of n bytes, group 128 needs n % 128 == 0.
template <int kPer>
__global__ void rmsnorm_residual_e4m3_kernel(float* h, const float* __restrict__ delta, const float* __restrict__ w,
                                             float eps, int n, bool out_bf16, bool group128, uint8_t* codes,
                                             W8a8ScaleOut so) {
  __shared__ NormReduce::TempStorage tmp;
  __shared__ float bcast;
  __shared__ float red[kPer][kNormThreads / 32];
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.x;
  float hv[kPer];
  const float inv = residual_row_inv<kPer>(h + r * n, delta ? delta + r * n : nullptr, nullptr, eps, n, hv, tmp, bcast);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    float y = 0.0f;
    if (i < n) {
      y = __fmul_rn(__fmul_rn(hv[j], inv), w[i]);
      if (out_bf16) y = __bfloat162float(__float2bfloat16_rn(y));
    }
    hv[j] = y;
    float a = fabsf(y);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (lane == 0) red[j][warp] = a;
  }
  __syncthreads();
  float row_amax = 0.0f;
  if (!group128) {
#pragma unroll
    for (int j = 0; j < kPer; ++j)
#pragma unroll
      for (int q = 0; q < kNormThreads / 32; ++q) row_amax = fmaxf(row_amax, red[j][q]);
  }
  uint8_t* out = codes + r * n;
  const int half = warp / 4;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    if (i >= n) break;
    float amax = row_amax;
    if (group128) {
      amax = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) amax = fmaxf(amax, red[j][half * 4 + q]);
    }
    const float s = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    out[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(hv[j], s), __NV_SATFINITE, __NV_E4M3));
    if (group128 && (threadIdx.x & 127) == 0) so.main[static_cast<int64_t>(i / 128) * so.n_main + r] = s;
    if (!group128 && threadIdx.x == 0 && j == 0) so.main[r] = s;
  }
}

__global__ void rmsnorm_rows_kernel(const float* __restrict__ h, const int32_t* __restrict__ row_index,
                                    const float* __restrict__ w, float eps, int n, __nv_bfloat16* __restrict__ out) {
  __shared__ NormReduce::TempStorage tmp;
  __shared__ float bcast;
  const int64_t src = row_index ? row_index[blockIdx.x] : blockIdx.x;
  const float* hr = h + src * n;
  const float inv = inv_rms(row_sumsq(hr, n, tmp, &bcast), n, eps);
  __nv_bfloat16* o = out + static_cast<int64_t>(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(hr[i], inv), w[i]));
}

// ---- qkv prep ----------------------------------------------------------------

// One block per token and head group (blockIdx.y); cos/sin for the token in
// shared memory, then one warp per head (q heads, then k heads, then v heads).
// The per-head math is ops_qkv.cuh qkv_prep_head.
__global__ void qkv_prep_kernel(QkvPrepArgs a) {
  __shared__ float cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2];
  __shared__ float buf[kPrepWarps][kMaxHeadDim];
  pdl_trigger();
  pdl_wait();  // the qkv GEMV's output (ops_launch.cuh)
  const int t = blockIdx.x;
  qkv_prep_rope_table(a, t, cs, sn);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nq = a.num_q_heads, nk = a.k_in ? a.num_kv_heads : 0, nv = a.v_in ? a.num_kv_heads : 0;
  for (int hh = blockIdx.y * kPrepWarps + warp; hh < nq + nk + nv; hh += gridDim.y * kPrepWarps)
    qkv_prep_head(a, t, hh, lane, buf[warp], cs, sn);
}

}  // namespace

void rmsnorm_residual(float* h, const float* delta, const float* delta_w, const float* w, float eps, int64_t rows,
                      int n, void* out, bool out_bf16, cudaStream_t stream) {
  if (rows == 0) return;
  if (!h || !w || !out || n <= 0 || rows < 0 || (delta_w && !delta))
    throw std::invalid_argument("cuda::rmsnorm_residual: bad arguments");
  const dim3 g(static_cast<unsigned>(rows)), b(kNormThreads);
  const bool pdl = pdl_small_kernels();
  if (n <= 8 * kNormThreads)
    launch_pdl(pdl, rmsnorm_residual_reg_kernel<8>, g, b, stream, h, delta, delta_w, w, eps, n, out, out_bf16);
  else if (n <= 16 * kNormThreads)
    launch_pdl(pdl, rmsnorm_residual_reg_kernel<16>, g, b, stream, h, delta, delta_w, w, eps, n, out, out_bf16);
  else if (n <= 32 * kNormThreads)
    launch_pdl(pdl, rmsnorm_residual_reg_kernel<32>, g, b, stream, h, delta, delta_w, w, eps, n, out, out_bf16);
  else
    launch_pdl(pdl, rmsnorm_residual_kernel, g, b, stream, h, delta, delta_w, w, eps, n, out, out_bf16);
}

void rmsnorm_residual_e4m3(float* h, const float* delta, const float* w, float eps, int64_t rows, int n,
                           bool out_bf16, int64_t group, uint8_t* codes, W8a8ScaleOut s, cudaStream_t stream) {
  if (rows == 0) return;
  if (!h || !w || !codes || !s.main || n <= 0 || rows < 0 || n % 16 != 0 || n > 32 * kNormThreads ||
      (group != 128 && group != n) || (group == 128 && n % 128 != 0) || s.n_main != rows ||
      reinterpret_cast<uintptr_t>(codes) % 16 != 0)
    throw std::invalid_argument("cuda::rmsnorm_residual_e4m3: bad arguments (rows=" + std::to_string(rows) +
                                " n=" + std::to_string(n) + " group=" + std::to_string(group) +
                                "; n % 16 == 0, n <= 8192, group 128 (n % 128 == 0) or n, one scale row per row)");
  const dim3 g(static_cast<unsigned>(rows)), b(kNormThreads);
  const bool pdl = pdl_small_kernels(), g128 = group == 128;
  if (n <= 8 * kNormThreads)
    launch_pdl(pdl, rmsnorm_residual_e4m3_kernel<8>, g, b, stream, h, delta, w, eps, n, out_bf16, g128, codes, s);
  else if (n <= 16 * kNormThreads)
    launch_pdl(pdl, rmsnorm_residual_e4m3_kernel<16>, g, b, stream, h, delta, w, eps, n, out_bf16, g128, codes, s);
  else
    launch_pdl(pdl, rmsnorm_residual_e4m3_kernel<32>, g, b, stream, h, delta, w, eps, n, out_bf16, g128, codes, s);
}

void rmsnorm_rows(const float* h, const int32_t* row_index, int num_rows, const float* w, float eps, int n,
                  uint16_t* out, cudaStream_t stream) {
  if (num_rows == 0) return;
  if (!h || !w || !out || n <= 0 || num_rows < 0) throw std::invalid_argument("cuda::rmsnorm_rows: bad arguments");
  rmsnorm_rows_kernel<<<num_rows, kNormThreads, 0, stream>>>(h, row_index, w, eps, n,
                                                             reinterpret_cast<__nv_bfloat16*>(out));
  FP8KV_CU_LAUNCH();
}

void qkv_prep(const QkvPrepArgs& a, cudaStream_t stream) {
  if (a.T == 0) return;
  const bool fused = a.store.k_cache != nullptr;
  if (fused && (!a.store.v_cache || !a.store.slots || !a.k_in || !a.v_in || a.store.capacity <= 0 ||
                (a.store.dtype != KvDtype::bf16 && (!a.store.k_scale || !a.store.v_scale))))
    throw std::invalid_argument("cuda::qkv_prep: a fused store needs both caches, slots, k/v inputs, capacity and "
                                "(fp8) scales");
  if (a.T < 0 || a.head_dim <= 0 || a.head_dim > kMaxHeadDim || a.num_q_heads < 0 || a.num_kv_heads < 0 ||
      !a.q_in || !a.q_out || (a.num_kv_heads > 0 && (!a.k_in || (!a.k_out && !fused))) ||
      (a.v_in && !a.v_out && !fused))
    throw std::invalid_argument("cuda::qkv_prep: bad arguments (head_dim " + std::to_string(a.head_dim) +
                                ", at most " + std::to_string(kMaxHeadDim) + ")");
  if (a.inv_freq && (a.rot_dim <= 0 || a.rot_dim > a.head_dim || a.rot_dim % 2 || !a.positions))
    throw std::invalid_argument("cuda::qkv_prep: bad rope rot_dim " + std::to_string(a.rot_dim));
  // Few tokens (decode): the heads are spread over blocks (one warp per
  // head) instead of 8 warps walking all heads of a token on one SM; each
  // head's arithmetic is unchanged. Many tokens: one block per token.
  const int heads = a.num_q_heads + (a.k_in ? a.num_kv_heads : 0) + (a.v_in ? a.num_kv_heads : 0);
  const unsigned gy = a.T < 64 ? static_cast<unsigned>(std::max(1, (heads + kPrepWarps - 1) / kPrepWarps)) : 1u;
  launch_pdl(pdl_small_kernels(), qkv_prep_kernel, dim3(static_cast<unsigned>(a.T), gy), dim3(kPrepWarps * 32), stream,
             a);
}

}  // namespace fp8kv::cuda
