// Elementwise ops (gated activations, embedding gather, softcap, bias add)
// and the per-row log-softmax / argmax used by score and greedy decoding.
#include <cuda_bf16.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <stdexcept>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/ops.h"
#include "backend/cuda/ops/act.cuh"
#include "backend/cuda/ops/argmax.cuh"
#include "backend/cuda/ops/launch.cuh"

namespace fp8kv::cuda {

namespace {

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

__device__ __forceinline__ float load_f32(const float* p) { return *p; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* p) { return __bfloat162float(*p); }

template <Activation A, typename In>
__global__ void gated_act_kernel(const In* gate, const In* __restrict__ up, int64_t in_stride, int64_t rows,
                                 int64_t n, void* out, bool out_bf16) {
  const int64_t total = rows * n;
  // Early trigger: the down GEMV (PDL) may prefetch weights; then wait for
  // the gate|up GEMV's output (ops_launch.cuh).
  pdl_trigger();
  pdl_wait();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / n, i = idx % n;
    const float g = load_f32(gate + r * in_stride + i), u = load_f32(up + r * in_stride + i);
    const float y = gated_act_value<A>(g, u);
    if (out_bf16) static_cast<__nv_bfloat16*>(out)[r * n + i] = __float2bfloat16_rn(y);
    else static_cast<float*>(out)[r * n + i] = y;
  }
}

// The prefill gated activation with bf16 gate|up and bf16 out
// (CudaBackend::linear_gated_act past the GEMV rows): 8 elements per thread
// in 16-byte loads and stores, one row per grid row (no 64-bit division per
// element). The scalar kernel moved ~1.2 TB/s at 8192 x 14336
// (docs/cuda_backend.md "Profiling: FP8KV_PROFILE"). Same element math: bitwise the
// scalar kernel.
template <Activation A>
__global__ void gated_act_bf16_vec8_kernel(const __nv_bfloat16* gate, const __nv_bfloat16* __restrict__ up,
                                           int64_t in_stride, int64_t n, __nv_bfloat16* __restrict__ out) {
  pdl_trigger();
  pdl_wait();
  const int64_t r = blockIdx.y;
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * 8;
  if (i >= n) return;
  const uint4 gv = *reinterpret_cast<const uint4*>(gate + r * in_stride + i);
  const uint4 uv = *reinterpret_cast<const uint4*>(up + r * in_stride + i);
  const __nv_bfloat16* g = reinterpret_cast<const __nv_bfloat16*>(&gv);
  const __nv_bfloat16* u = reinterpret_cast<const __nv_bfloat16*>(&uv);
  uint4 ov;
  __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&ov);
#pragma unroll
  for (int k = 0; k < 8; ++k)
    o[k] = __float2bfloat16_rn(gated_act_value<A>(__bfloat162float(g[k]), __bfloat162float(u[k])));
  *reinterpret_cast<uint4*>(out + r * n + i) = ov;
}

__global__ void to_bf16_kernel(const float* __restrict__ src, const int32_t* __restrict__ row_index, int64_t rows,
                               int64_t cols, __nv_bfloat16* __restrict__ dst) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < rows * cols;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    const int64_t sr = row_index ? row_index[r] : r;
    dst[idx] = __float2bfloat16_rn(src[sr * cols + c]);
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void embedding_kernel(const __nv_bfloat16* __restrict__ E, int64_t cols, const int32_t* __restrict__ ids,
                                 float scale, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat16* row = E + static_cast<int64_t>(ids[t]) * cols;
  float* o = out + t * cols;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float x = __bfloat162float(row[i]);
    o[i] = scale == 1.0f ? x : __fmul_rn(x, scale);
  }
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(tanhf(__fdiv_rn(x[i], cap)), cap);
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t T, int64_t N) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < T * N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __fadd_rn(y[i], bias[i % N]);
}

__global__ void add_bias_strided_kernel(float* y, const float* bias, int64_t T, int64_t N, int64_t ld) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < T * N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[(i / N) * ld + i % N] = __fadd_rn(y[(i / N) * ld + i % N], bias[i % N]);
}

// ---- row stats -----------------------------------------------------------------

constexpr int kRowThreads = 512;

__global__ void row_stats_kernel(const float* __restrict__ logits, int V, const int32_t* __restrict__ ids,
                                 float* __restrict__ logprob, int32_t* __restrict__ argmax) {
  using DblReduce = cub::BlockReduce<double, kRowThreads>;
  __shared__ union {
    ArgMaxTemp<kRowThreads> am;
    typename DblReduce::TempStorage d;
  } tmp;
  __shared__ ArgMax best_s;
  __shared__ int nan_s;
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * V;
  ArgMax best{-INFINITY, V};
  int nan = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = x[i];
    if (v != v) nan = 1;
    else if (v > best.v || (v == best.v && i < best.i)) best = ArgMax{v, i};
  }
  block_argmax<kRowThreads>(best, nan, tmp.am, best_s, nan_s);
  if (argmax && threadIdx.x == 0) argmax[blockIdx.x] = nan_s ? -1 : (best_s.i < V ? best_s.i : 0);
  if (!ids) return;
  const float m = best_s.v;
  double s = 0.0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += static_cast<double>(expf(x[i] - m));
  const double total = DblReduce(tmp.d).Sum(s);
  if (threadIdx.x == 0) {
    const int id = ids[blockIdx.x];
    logprob[blockIdx.x] =
        nan_s ? NAN : static_cast<float>(static_cast<double>(x[id]) - static_cast<double>(m) - log(total));
  }
}

}  // namespace

void add_bias_rows(float* y, const float* bias, int64_t T, int64_t N, cudaStream_t stream) {
  if (T * N == 0) return;
  add_bias_kernel<<<grid_for(T * N, 256), 256, 0, stream>>>(y, bias, T, N);
  FP8KV_CU_LAUNCH();
}

void add_bias_rows_strided(float* y, const float* bias, int64_t T, int64_t N, int64_t ld, cudaStream_t stream) {
  if (T * N == 0) return;
  add_bias_strided_kernel<<<grid_for(T * N, 256), 256, 0, stream>>>(y, bias, T, N, ld);
  FP8KV_CU_LAUNCH();
}

namespace {

template <typename In>
void gated_act_any(Activation act, const In* gate, const In* up, int64_t in_stride, int64_t rows, int64_t n, void* out,
                   bool out_bf16, cudaStream_t stream) {
  if (rows * n == 0) return;
  if (!gate || !up || !out || rows < 0 || n < 0 || in_stride < n)
    throw std::invalid_argument("cuda::gated_act: bad arguments");
  const dim3 g(grid_for(rows * n, 256)), b(256);
  const bool pdl = pdl_small_kernels();
  switch (act) {
    case Activation::silu:
      launch_pdl(pdl, gated_act_kernel<Activation::silu, In>, g, b, stream, gate, up, in_stride, rows, n, out,
                 out_bf16);
      break;
    case Activation::gelu_tanh:
      launch_pdl(pdl, gated_act_kernel<Activation::gelu_tanh, In>, g, b, stream, gate, up, in_stride, rows, n, out,
                 out_bf16);
      break;
    case Activation::gelu:
      launch_pdl(pdl, gated_act_kernel<Activation::gelu, In>, g, b, stream, gate, up, in_stride, rows, n, out,
                 out_bf16);
      break;
  }
}

}  // namespace

void gated_act(Activation act, const float* gate, const float* up, int64_t in_stride, int64_t rows, int64_t n,
               void* out, bool out_bf16, cudaStream_t stream) {
  gated_act_any(act, gate, up, in_stride, rows, n, out, out_bf16, stream);
}

void gated_act_bf16_in(Activation act, const uint16_t* gate, const uint16_t* up, int64_t in_stride, int64_t rows,
                       int64_t n, void* out, bool out_bf16, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (out_bf16 && rows > 0 && rows <= 65535 && n > 0 && n % 8 == 0 && in_stride % 8 == 0 && in_stride >= n && gate &&
      up && out && aligned(gate) && aligned(up) && aligned(out)) {
    const auto* g = reinterpret_cast<const __nv_bfloat16*>(gate);
    const auto* u = reinterpret_cast<const __nv_bfloat16*>(up);
    auto* o = static_cast<__nv_bfloat16*>(out);
    const dim3 grid(static_cast<unsigned>((n / 8 + 255) / 256), static_cast<unsigned>(rows)), block(256);
    const bool pdl = pdl_small_kernels();
    switch (act) {
      case Activation::silu:
        launch_pdl(pdl, gated_act_bf16_vec8_kernel<Activation::silu>, grid, block, stream, g, u, in_stride, n, o);
        break;
      case Activation::gelu_tanh:
        launch_pdl(pdl, gated_act_bf16_vec8_kernel<Activation::gelu_tanh>, grid, block, stream, g, u, in_stride, n, o);
        break;
      case Activation::gelu:
        launch_pdl(pdl, gated_act_bf16_vec8_kernel<Activation::gelu>, grid, block, stream, g, u, in_stride, n, o);
        break;
    }
    return;
  }
  gated_act_any(act, reinterpret_cast<const __nv_bfloat16*>(gate), reinterpret_cast<const __nv_bfloat16*>(up),
                in_stride, rows, n, out, out_bf16, stream);
}

void to_bf16_rows(const float* src, const int32_t* row_index, int64_t rows, int64_t cols, uint16_t* dst,
                  cudaStream_t stream) {
  if (rows * cols == 0) return;
  if (!src || !dst || rows < 0 || cols < 0) throw std::invalid_argument("cuda::to_bf16_rows: bad arguments");
  to_bf16_kernel<<<grid_for(rows * cols, 256), 256, 0, stream>>>(src, row_index, rows, cols,
                                                                 reinterpret_cast<__nv_bfloat16*>(dst));
  FP8KV_CU_LAUNCH();
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (!x || !y || n < 0) throw std::invalid_argument("cuda::add_inplace: bad arguments");
  add_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, y, n);
  FP8KV_CU_LAUNCH();
}

void embedding(const DeviceMatrix& E, const int32_t* ids, int T, float scale, float* out, cudaStream_t stream) {
  if (T == 0) return;
  if (!E.data || !ids || !out || T < 0) throw std::invalid_argument("cuda::embedding: bad arguments");
  embedding_kernel<<<T, 256, 0, stream>>>(reinterpret_cast<const __nv_bfloat16*>(E.data), E.cols, ids, scale, out);
  FP8KV_CU_LAUNCH();
}

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  if (!x || !(cap > 0.0f)) throw std::invalid_argument("cuda::softcap: bad arguments (cap must be > 0)");
  softcap_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, cap);
  FP8KV_CU_LAUNCH();
}

void row_logprob_argmax(const float* logits, int rows, int V, const int32_t* ids, float* logprob, int32_t* argmax,
                        cudaStream_t stream) {
  if (rows == 0) return;
  if (!logits || rows < 0 || V <= 0 || (ids && !logprob))
    throw std::invalid_argument("cuda::row_logprob_argmax: bad arguments");
  row_stats_kernel<<<rows, kRowThreads, 0, stream>>>(logits, V, ids, logprob, argmax);
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
