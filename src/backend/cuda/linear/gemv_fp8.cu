// Linear layers on fp8 (e4m3) weights, W8A16 (ops.h "fp8 weights"): the
// decode GEMV that streams the e4m3 bytes and applies each 128-column
// group's scale in registers, and the row-slice dequantization to bf16 that
// the cuBLASLt path past the GEMV rows reads. docs/cuda_backend.md "FP8
// weights".
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/linear/gemv_common.cuh"
#include "backend/cuda/ops/act.cuh"
#include "backend/cuda/ops/launch.cuh"
#include "backend/cuda/ops/ops.h"

namespace fp8kv::cuda {

namespace {

using namespace gemv;  // kWarps, kUnroll, wait_for_inputs, bf16x8_to_f32, warp_sum, ... (gemv_common.cuh)
constexpr int kChunk = 16;  // e4m3 weights per 16-byte load

// Four e4m3 bytes (little-endian in w) -> four floats (exact: every e4m3
// value is an f16 value, and every f16 value an f32 value).
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t w, float* f) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

struct ScaleIndex {
  const float* __restrict__ s;
  int shift;
  int64_t ld;
  int k_step;
  // The scale of chunk c (16 columns, inside one 128-column group) of row n.
  __device__ __forceinline__ float at(int64_t n, int64_t c) const {
    return __ldg(s + (n >> shift) * ld + (c >> 3) * k_step);
  }
};

// One warp's part of output column n: lane takes chunks first, first +
// kStride, ... (kStride = 32 S: the S warps of a column interleave); per
// chunk the 16 products with each x row summed in fp32, then that sum times
// the chunk's scale added to the row's accumulator (one fmaf). acc[t]: the
// lane's partial sums (the caller reduces over lanes and warps).
template <int T, int S>
__device__ __forceinline__ void fp8_warp_dot(const uint16_t* __restrict__ x, const uint8_t* __restrict__ W,
                                             const ScaleIndex& sc, int64_t n, int64_t chunks, int64_t K,
                                             int64_t first, float (&acc)[T]) {
  constexpr int64_t kStride = 32 * S;
  constexpr int64_t kBatch = kStride * kUnroll;
  const uint4* w = reinterpret_cast<const uint4*>(W + n * K);
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  // A chunk's weights and its scale travel together: both are loaded one
  // batch ahead (and the first batch before the PDL wait: neither depends
  // on an earlier kernel).
  uint4 cur[kUnroll], nxt[kUnroll];
  float s_cur[kUnroll], s_nxt[kUnroll];
  auto load_w = [&](uint4(&v)[kUnroll], float(&sv)[kUnroll], int64_t c0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * kStride;
      v[u] = c < chunks ? __ldcs(w + c) : make_uint4(0, 0, 0, 0);  // streamed once
      sv[u] = c < chunks ? sc.at(n, c) : 0.0f;
    }
  };
  load_w(cur, s_cur, first);
  wait_for_inputs();
  for (int64_t c0 = first; c0 < chunks; c0 += kBatch) {
    load_w(nxt, s_nxt, c0 + kBatch);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * kStride;
      if (c >= chunks) break;
      float wf[kChunk];
      e4m3x4_to_f32(cur[u].x, wf);
      e4m3x4_to_f32(cur[u].y, wf + 4);
      e4m3x4_to_f32(cur[u].z, wf + 8);
      e4m3x4_to_f32(cur[u].w, wf + 12);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const uint4* xr = reinterpret_cast<const uint4*>(x + t * K) + 2 * c;
        float xf[2][8];
        bf16x8_to_f32(__ldg(xr), xf[0]);
        bf16x8_to_f32(__ldg(xr + 1), xf[1]);
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < kChunk; ++i) p = fmaf(xf[i / 8][i % 8], wf[i], p);
        acc[t] = fmaf(p, s_cur[u], acc[t]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      cur[u] = nxt[u];
      s_cur[u] = s_nxt[u];
    }
  }
  warp_sum(acc);
}

// S warps per output column n (K split as gemv.cu's SIMT kernel; the S
// partial sums are added in fixed order through shared memory).
template <int T, int S>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_fp8_kernel(const uint16_t* __restrict__ x, const uint8_t* __restrict__ W, ScaleIndex sc,
                    const float* __restrict__ bias, float* __restrict__ y, int64_t N, int64_t K, bool accumulate) {
  static_assert(kWarps % S == 0, "S must divide the warps of a block");
  constexpr int kCols = kWarps / S;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp % S;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kCols + warp / S;
  const bool live = n < N;
  float acc[T];
  fp8_warp_dot<T, S>(x, W, sc, live ? n : 0, live ? K / kChunk : 0, K, static_cast<int64_t>(sub) * 32 + lane, acc);
  if constexpr (S > 1) {
    __shared__ float part[kWarps][T];
    split_publish(part, acc, lane, warp);
    if (sub != 0) return;
    split_gather<S>(part, acc, warp);
  }
  if (lane == 0 && live) store_column(acc, bias, y, N, n, accumulate);
}

// The gate|up GEMV with the gated activation fused (gemv.cu's
// gemv_gated_act_kernel on fp8 weights): warps 0-3 of a block compute gate
// columns j0..j0+3 and warps 4-7 the up columns I + j0.., one warp per
// column (gemv_fp8_kernel<T, 1>'s sums, bitwise), and the block writes
// out[t][j] = bf16(act(gate + b) * (up + b)) with the activation kernel's
// element math.
template <int T, Activation A>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_fp8_gated_act_kernel(const uint16_t* __restrict__ x, const uint8_t* __restrict__ W, ScaleIndex sc,
                              const float* __restrict__ bias, __nv_bfloat16* __restrict__ out, int64_t I, int64_t K) {
  constexpr int kCols = kWarps / 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kCols + (warp % kCols);
  const bool live = j < I;
  const int64_t n = (warp < kCols ? 0 : I) + (live ? j : 0);
  float acc[T];
  fp8_warp_dot<T, 1>(x, W, sc, n, live ? K / kChunk : 0, K, lane, acc);
  __shared__ float part[kWarps][T];
  if (lane == 0) {
    const float b = bias && live ? bias[n] : 0.0f;
#pragma unroll
    for (int t = 0; t < T; ++t) part[warp][t] = acc[t] + b;
  }
  __syncthreads();
  if (threadIdx.x < kCols * T) {
    const int c = threadIdx.x % kCols, t = threadIdx.x / kCols;
    const int64_t jj = static_cast<int64_t>(blockIdx.x) * kCols + c;
    if (jj < I) out[t * I + jj] = __float2bfloat16_rn(gated_act_value<A>(part[c][t], part[kCols + c][t]));
  }
}

ScaleIndex scale_index(const DeviceMatrix& W) {
  return ScaleIndex{W.scale, W.scale_row_shift, W.scale_ld, W.scale_k_step};
}

template <int T, int S>
void launch(const uint16_t* x, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
            cudaStream_t stream) {
  constexpr int kCols = kWarps / S;
  const int64_t blocks = (W.rows + kCols - 1) / kCols;
  launch_pdl(true, gemv_fp8_kernel<T, S>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), stream, x, W.fp8,
             scale_index(W), bias, y, W.rows, W.cols, accumulate);
}

// The split for an fp8 row: gemv_simt_auto_split's rule on the row's
// 16-byte chunks (K / 16 of them here, K / 8 for bf16): enough warps to fill
// the GPU twice while each lane keeps at least 4 chunks.
int fp8_split(int64_t N, int64_t K) { return gemv_simt_auto_split(N, K / 2); }

// Thread i converts 16 consecutive elements of the slice (K % 16 == 0).
__global__ void dequant_kernel(const uint8_t* __restrict__ W, ScaleIndex sc, int64_t K, int64_t r0, int64_t n,
                               __nv_bfloat16* __restrict__ out) {
  const int64_t per_row = K / kChunk;
  const int64_t total = n * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = i % per_row;
    const uint4 q = __ldcs(reinterpret_cast<const uint4*>(W + (r0 + r) * K) + c);
    const float s = sc.at(r0 + r, c);
    float f[kChunk];
    e4m3x4_to_f32(q.x, f);
    e4m3x4_to_f32(q.y, f + 4);
    e4m3x4_to_f32(q.z, f + 8);
    e4m3x4_to_f32(q.w, f + 12);
    uint32_t o[kChunk / 2];
#pragma unroll
    for (int j = 0; j < kChunk / 2; ++j) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f[2 * j], s), __fmul_rn(f[2 * j + 1], s));
      o[j] = *reinterpret_cast<const uint32_t*>(&b);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + r * K) + 2 * c;
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

}  // namespace

bool gemv_fp8_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W) {
  return W.is_fp8() && W.scale && !W.fp8_padded() && T >= 1 && T <= kGemvMaxRows && W.cols % kChunk == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(W.fp8) % 16 == 0 &&
         W.rows <= (int64_t{1} << 31) * kWarps;
}

void gemv_fp8(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
              cudaStream_t stream) {
  if (!gemv_fp8_fits(x, T, W))
    throw std::invalid_argument("cuda::gemv_fp8: needs an fp8 W with scales, 1 <= T <= " +
                                std::to_string(kGemvMaxRows) + ", K % 16 == 0 and 16-byte aligned x and W (T=" +
                                std::to_string(T) + " K=" + std::to_string(W.cols) + ")");
  const int split = fp8_split(W.rows, W.cols);
  gemv::for_rows(T, [&](auto t) {
    gemv::for_split(split, "gemv_fp8",
                    [&](auto sp) { launch<decltype(t)::value, decltype(sp)::value>(x, W, bias, y, accumulate, stream); });
  });
}

bool gemv_fp8_gated_act_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W) {
  return T >= 1 && T <= kGemvGatedActMaxRows && gemv_fp8_fits(x, T, W) && W.rows % 2 == 0 &&
         fp8_split(W.rows, W.cols) == 1;
}

void gemv_fp8_gated_act(Activation act, const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias,
                        uint16_t* out, cudaStream_t stream) {
  if (!gemv_fp8_gated_act_fits(x, T, W) || !out)
    throw std::invalid_argument("cuda::gemv_fp8_gated_act: needs gemv_fp8_gated_act_fits (1 <= T <= " +
                                std::to_string(kGemvGatedActMaxRows) + ", an even row count, split 1) and out (T=" +
                                std::to_string(T) + " N=" + std::to_string(W.rows) + ")");
  const int64_t I = W.rows / 2;
  const dim3 grid(static_cast<unsigned>((I + kWarps / 2 - 1) / (kWarps / 2))), block(kWarps * 32);
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  gemv::for_rows(T, [&](auto t) {
    constexpr int kT = decltype(t)::value;
    if constexpr (kT <= kGemvGatedActMaxRows) {
      switch (act) {
        case Activation::silu:
          launch_pdl(true, gemv_fp8_gated_act_kernel<kT, Activation::silu>, grid, block, stream, x, W.fp8,
                     scale_index(W), bias, o, I, W.cols);
          break;
        case Activation::gelu_tanh:
          launch_pdl(true, gemv_fp8_gated_act_kernel<kT, Activation::gelu_tanh>, grid, block, stream, x, W.fp8,
                     scale_index(W), bias, o, I, W.cols);
          break;
        case Activation::gelu:
          launch_pdl(true, gemv_fp8_gated_act_kernel<kT, Activation::gelu>, grid, block, stream, x, W.fp8,
                     scale_index(W), bias, o, I, W.cols);
          break;
      }
    }
  });
}

void dequantize_fp8_rows_bf16(const DeviceMatrix& W, int64_t r0, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n == 0) return;
  if (!W.is_fp8() || !W.scale || W.fp8_padded() || !out || r0 < 0 || n < 0 || r0 + n > W.rows || W.cols % kChunk != 0 ||
      reinterpret_cast<uintptr_t>(W.fp8) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    throw std::invalid_argument("cuda::dequantize_fp8_rows_bf16: needs an fp8 W with scales, rows [" +
                                std::to_string(r0) + ", " + std::to_string(r0 + n) + ") of " +
                                std::to_string(W.rows) + ", K % 16 == 0 (K=" + std::to_string(W.cols) +
                                ") and 16-byte aligned buffers");
  const int64_t work = n * (W.cols / kChunk);
  const int64_t blocks = std::min<int64_t>((work + 255) / 256, 132 * 16);
  dequant_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(W.fp8, scale_index(W), W.cols, r0, n,
                                                                    reinterpret_cast<__nv_bfloat16*>(out));
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
