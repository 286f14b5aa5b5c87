// Decode-shaped linear (ops.h gemv_bf16): y[T][N] (+)= x[T][K] W[N][K]^T
// (+ bias) for T <= 8 rows, bf16 inputs, fp32 accumulation and output. At
// these shapes the GEMM is a weight stream: one warp per output column n
// reads W's row n once in 16-byte chunks (4 in flight per lane) and
// multiplies it with all T rows of x (which stay in L1/L2); a warp shuffle
// reduction finishes the dot products. docs/cuda_backend.md "GEMV for decode rows".
#include <cuda_bf16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/ops.h"
#include "backend/cuda/ops/act.cuh"
#include "backend/cuda/linear/gemv_common.cuh"
#include "backend/cuda/ops/launch.cuh"

namespace fp8kv::cuda {

namespace {

using namespace gemv;  // kWarps, bf16x8_to_f32, stream_chunks, warp_sum, ... (gemv_common.cuh)

// One warp's part of the dot products of W's row w (chunks = K / 8 16-byte
// chunks, 0 for a dead warp) with the T rows of x: the lane's chunks are
// first, first + 32 S, ... (first = sub * 32 + lane); the result is
// warp-reduced (every lane holds it). Waits for the inputs (PDL) after the
// first weight loads.
template <int T, int S>
__device__ __forceinline__ void warp_dot(const uint16_t* __restrict__ x, const uint4* __restrict__ w, int64_t chunks,
                                         int64_t K, int64_t first, float (&acc)[T]) {
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  stream_chunks<S>(w, chunks, first, [&](int64_t c, const uint4& wc) {
    float wf[8];
    bf16x8_to_f32(wc, wf);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float xf[8];
      bf16x8_to_f32(__ldg(reinterpret_cast<const uint4*>(x + t * K) + c), xf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[t] = fmaf(xf[i], wf[i], acc[t]);
    }
  });
  warp_sum(acc);
}

// S warps share one output column n (split K, for shapes with few columns
// and / or long rows: o_proj, qkv, down at the 8B shape, where one warp per
// column left too few bytes in flight): warp sub = 0..S-1 of column n
// takes the 16-byte chunks sub * 32 + lane + j * 32 * S, and the S partial
// sums are added in fixed order (sub 0, 1, ...) through shared memory, so the
// result is deterministic. S = 1 is the one-warp-per-column kernel, bitwise
// unchanged. The weight loads are double-buffered: the next kUnroll chunks
// are in flight while the current ones are multiplied.
template <int T, int S>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ W, const float* __restrict__ bias,
                float* __restrict__ y, int64_t N, int64_t K, bool accumulate) {
  static_assert(kWarps % S == 0, "S must divide the warps of a block");
  constexpr int kCols = kWarps / S;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp % S;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kCols + warp / S;
  const bool live = n < N;
  if constexpr (S == 1) {
    if (!live) {
      wait_for_inputs();
      return;
    }
  }
  float acc[T];
  warp_dot<T, S>(x, reinterpret_cast<const uint4*>(W + (live ? n : 0) * K), live ? K / 8 : 0, K,
                 static_cast<int64_t>(sub) * 32 + lane, acc);
  if constexpr (S > 1) {
    __shared__ float part[kWarps][T];
    split_publish(part, acc, lane, warp);
    if (sub != 0 || !live) return;
    split_gather<S>(part, acc, warp);
  }
  if (lane == 0) store_column(acc, bias, y, N, n, accumulate);
}

// The gate|up GEMV with the gated activation fused (T rows): W = [gate; up]
// ([2I][K]); a block's warps 0-3 compute gate columns j0..j0+3 and warps 4-7
// the up columns I + j0..I + j0 + 3 (one warp per column, as gemv_kernel<T,
// 1>: the same sums, bitwise), and the block writes out[t][j] =
// bf16(act(gate + b) * (up + b)) with the activation kernel's element math
// (ops_act.cuh). Saves the activation kernel and the fp32 gate|up round trip.
template <int T, Activation A>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_gated_act_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ W,
                          const float* __restrict__ bias, __nv_bfloat16* __restrict__ out, int64_t I, int64_t K) {
  constexpr int kCols = kWarps / 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kCols + (warp % kCols);
  const bool live = j < I;
  const int64_t n = (warp < kCols ? 0 : I) + (live ? j : 0);
  float acc[T];
  warp_dot<T, 1>(x, reinterpret_cast<const uint4*>(W + n * K), live ? K / 8 : 0, K, lane, acc);
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

// ---- tensor-core variant (T = 2..8) --------------------------------------------
//
// At T rows the SIMT kernel spends ~T x 17 instructions per 16-byte weight
// chunk (x conversion + fmaf per row), which makes it issue-bound near T = 8.
// Here one mma.sync.m16n8k16 (bf16 in, fp32 accumulate: the products are
// exact, as in cuBLASLt) does 16 x 8 x 16 multiply-adds. A block of 8 warps
// owns 16 output columns n; warp w takes K chunks of 32 (w, w + 8, ...), so
// the warps split K and a shared-memory sum in fixed warp order finishes.
//
// Fragments are loaded straight from global memory with 16-byte loads: lane
// (g = lane / 4, q = lane % 4) reads W rows n0 + g and n0 + g + 8 and x row
// t = g at k = kc + 8q .. 8q + 7. The dot product does not care which k a
// fragment slot stands for as long as A and B agree, so the mma's k slots
// (2q, 2q+1, 2q+8, 2q+9) are mapped to real k (8q, 8q+1, 8q+2, 8q+3) in the
// first mma and (8q+4 .. 8q+7) in the second, for W and x alike.
constexpr int kMmaWarps = 8;
constexpr int kMmaUnroll = 4;

__global__ void __launch_bounds__(kMmaWarps * 32)
    gemv_mma_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ W, const float* __restrict__ bias,
                    float* __restrict__ y, int64_t N, int64_t K, int T, bool accumulate) {
  __shared__ float red[kMmaWarps][32][4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t r0 = n0 + g, r1 = n0 + g + 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const uint4* w0 = reinterpret_cast<const uint4*>(W + (r0 < N ? r0 : 0) * K);
  const uint4* w1 = reinterpret_cast<const uint4*>(W + (r1 < N ? r1 : 0) * K);
  const uint4* xr = reinterpret_cast<const uint4*>(x + (g < T ? g : 0) * K);
  const bool ok0 = r0 < N, ok1 = r1 < N, okx = g < T;
  const int64_t chunks = (K + 31) / 32;  // of 32 k; the last may be partial (K % 8 == 0)
  const int64_t k8 = K / 8;              // 16-byte pieces per row
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint4 a[kMmaUnroll], b[kMmaUnroll], xv[kMmaUnroll];
  auto load_w = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kMmaWarps;
      const int64_t piece = c * 4 + q;  // 16-byte piece index along k
      const bool in = c < chunks && piece < k8;
      a[u] = in && ok0 ? __ldcs(w0 + piece) : zero;
      b[u] = in && ok1 ? __ldcs(w1 + piece) : zero;
    }
  };
  load_w(warp);
  wait_for_inputs();
  for (int64_t c0 = warp; c0 < chunks; c0 += kMmaWarps * kMmaUnroll) {
    if (c0 != warp) load_w(c0);
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kMmaWarps;
      const int64_t piece = c * 4 + q;
      xv[u] = c < chunks && piece < k8 && okx ? __ldg(xr + piece) : zero;
    }
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      mma_bf16_16816(d, a[u].x, b[u].x, a[u].y, b[u].y, xv[u].x, xv[u].y);
      mma_bf16_16816(d, a[u].z, b[u].z, a[u].w, b[u].w, xv[u].z, xv[u].w);
    }
  }
  // d[0] = (n0 + g, t = 2q), d[1] = (n0 + g, 2q + 1), d[2] = (n0 + g + 8, 2q), d[3] = (n0 + g + 8, 2q + 1).
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][lane][i] = d[i];
  __syncthreads();
  if (threadIdx.x < 128) {
    const int l = threadIdx.x >> 2, i = threadIdx.x & 3;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) v += red[w][l][i];
    const int64_t n = n0 + (l >> 2) + (i >= 2 ? 8 : 0);
    const int t = 2 * (l & 3) + (i & 1);
    if (t < T && n < N) {
      if (bias) v += bias[n];
      if (accumulate) v += y[t * N + n];
      y[t * N + n] = v;
    }
  }
}

template <int T, int S>
void launch(const uint16_t* x, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
            cudaStream_t stream) {
  constexpr int kCols = kWarps / S;
  const int64_t blocks = (W.rows + kCols - 1) / kCols;
  launch_pdl(true, gemv_kernel<T, S>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), stream, x, W.data, bias,
             y, W.rows, W.cols, accumulate);
}

}  // namespace

bool gemv_bf16_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W) {
  return T >= 1 && T <= kGemvMaxRows && W.cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W.data) % 16 == 0 && W.rows <= (int64_t{1} << 31) * kWarps;
}

namespace {

void check_fits(const char* what, const uint16_t* x, int64_t T, const DeviceMatrix& W) {
  if (!gemv_bf16_fits(x, T, W))
    throw std::invalid_argument(std::string("cuda::") + what + ": needs 1 <= T <= " + std::to_string(kGemvMaxRows) +
                                ", K % 8 == 0 and 16-byte aligned x and W (T=" + std::to_string(T) +
                                " K=" + std::to_string(W.cols) + ")");
}

}  // namespace

void gemv_bf16(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
               cudaStream_t stream) {
  check_fits("gemv_bf16", x, T, W);
  if (T >= kGemvMmaMinRows)
    gemv_bf16_mma(x, T, W, bias, y, accumulate, stream);
  else
    gemv_bf16_simt(x, T, W, bias, y, accumulate, stream);
}

void gemv_bf16_mma(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
                   cudaStream_t stream) {
  check_fits("gemv_bf16_mma", x, T, W);
  const int64_t blocks = (W.rows + 15) / 16;
  launch_pdl(true, gemv_mma_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kMmaWarps * 32), stream, x, W.data, bias,
             y, W.rows, W.cols, static_cast<int>(T), accumulate);
}

void gemv_bf16_simt(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y,
                    bool accumulate, cudaStream_t stream) {
  gemv_bf16_simt_split(x, T, W, bias, y, accumulate, 1, stream);
}

int gemv_simt_auto_split(int64_t N, int64_t K) {
  // Enough warps for ~2 per-SM fills of 64 warps on 132 SMs, but at least 4
  // 16-byte chunks per lane (else the split only adds the reduction).
  int s = 1;
  while (s < 8 && N * s < 16384 && K / 8 / (32 * 2 * s) >= 4) s *= 2;
  return s;
}

void gemv_bf16_simt_split(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y,
                          bool accumulate, int split, cudaStream_t stream) {
  check_fits("gemv_bf16_simt", x, T, W);
  if (split <= 0) split = gemv_simt_auto_split(W.rows, W.cols);
  gemv::for_rows(T, [&](auto t) {
    gemv::for_split(split, "gemv_bf16_simt_split",
                    [&](auto sp) { launch<decltype(t)::value, decltype(sp)::value>(x, W, bias, y, accumulate, stream); });
  });
}

namespace {

template <int T>
void launch_gated_act(Activation act, const uint16_t* x, const DeviceMatrix& W, const float* bias, uint16_t* out,
                      cudaStream_t stream) {
  const int64_t I = W.rows / 2;
  const dim3 grid(static_cast<unsigned>((I + kWarps / 2 - 1) / (kWarps / 2))), block(kWarps * 32);
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  switch (act) {
    case Activation::silu:
      launch_pdl(true, gemv_gated_act_kernel<T, Activation::silu>, grid, block, stream, x, W.data, bias, o, I, W.cols);
      break;
    case Activation::gelu_tanh:
      launch_pdl(true, gemv_gated_act_kernel<T, Activation::gelu_tanh>, grid, block, stream, x, W.data, bias, o, I,
                 W.cols);
      break;
    case Activation::gelu:
      launch_pdl(true, gemv_gated_act_kernel<T, Activation::gelu>, grid, block, stream, x, W.data, bias, o, I, W.cols);
      break;
  }
}

}  // namespace

void gemv_gated_act_bf16(Activation act, const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias,
                         uint16_t* out, cudaStream_t stream) {
  check_fits("gemv_gated_act_bf16", x, T, W);
  if (W.rows % 2 != 0 || !out)
    throw std::invalid_argument("cuda::gemv_gated_act_bf16: W needs an even row count ([gate; up]) and out a buffer");
  switch (T) {
    case 1: launch_gated_act<1>(act, x, W, bias, out, stream); break;
    case 2: launch_gated_act<2>(act, x, W, bias, out, stream); break;
    default:
      throw std::invalid_argument("cuda::gemv_gated_act_bf16: takes 1 or 2 rows, got " + std::to_string(T));
  }
}

}  // namespace fp8kv::cuda
