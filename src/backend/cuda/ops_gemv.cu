// Decode-shaped linear (ops.h gemv_bf16): y[T][N] (+)= x[T][K] W[N][K]^T
// (+ bias) for T <= 8 rows, bf16 inputs, fp32 accumulation and output. At
// these shapes the GEMM is a weight stream: one warp per output column n
// reads W's row n once in 16-byte chunks (4 in flight per lane) and
// multiplies it with all T rows of x (which stay in L1/L2); a warp shuffle
// reduction finishes the dot products. docs/cuda_backend.md "GEMV".
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_launch.cuh"

namespace fp8kv::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;

// Both kernels are launched as programmatic dependents (ops_launch.cuh): a
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

template <int T>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ W, const float* __restrict__ bias,
                float* __restrict__ y, int64_t N, int64_t K, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) {
    wait_for_inputs();
    return;
  }
  const uint4* w = reinterpret_cast<const uint4*>(W + n * K);
  const int64_t chunks = K / 8;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  uint4 wv[kUnroll];
  auto load_w = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * 32;
      // Streamed once: do not keep W in L1.
      wv[u] = c < chunks ? __ldcs(w + c) : make_uint4(0, 0, 0, 0);
    }
  };
  load_w(lane);
  wait_for_inputs();
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    if (c0 != lane) load_w(c0);
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

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

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

template <int T>
void launch(const uint16_t* x, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
            cudaStream_t stream) {
  const int64_t blocks = (W.rows + kWarps - 1) / kWarps;
  launch_pdl(true, gemv_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), stream, x, W.data, bias, y,
             W.rows, W.cols, accumulate);
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
  // FP8KV_GEMV_MMA_MIN=n (1..8) moves the simt / mma boundary, for the
  // device A/B in scripts/gpu_bench.sh; read once.
  static const int mma_min = [] {
    const char* e = std::getenv("FP8KV_GEMV_MMA_MIN");
    return e ? std::clamp(std::atoi(e), 1, kGemvMaxRows + 1) : kGemvMmaMinRows;
  }();
  if (T >= mma_min)
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
  check_fits("gemv_bf16_simt", x, T, W);
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
