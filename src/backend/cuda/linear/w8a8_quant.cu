// W8A8's activation quantization on the device (ops.h quantize_rows_e4m3;
// gated_act_quantize_e4m3, the same kernels fed the MLP's gated activation
// instead of a stored tensor) and the copy-out of the W8A8 GEMM's padded
// rows (w8a8_finish_rows).
//
// quantize_rows_e4m3 mirrors quantize_activations_e4m3 (numerics/
// fp8_weights.h), the codes-and-scales form of the CPU W8A8 linear's
// round_activations_e4m3, operation for operation: per group (128 columns
// for block-wise weights, the whole row otherwise) amax = max |x| ignoring
// NaNs (fmaxf, as std::max(amax, |x|) with amax first), scale = amax / 448
// (__fdiv_rn: IEEE division; a group without a positive amax gets scale 1),
// code = e4m3(x / scale) (__fdiv_rn, then cvt.rn.satfinite: round to
// nearest even, saturating to +-448, NaN -> 0x7f, -0 -> 0x80: the host
// f32_to_e4m3's rules). No fast math, no reciprocal multiply: the codes and
// scales equal the host function's bit for bit (tests/cuda_ops/
// test_fp8_linear.cpp). docs/cuda_backend.md "FP8 weights".
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/act.cuh"
#include "backend/cuda/ops/ops.h"

namespace fp8kv::cuda {

namespace {

constexpr float kE4m3Max = 448.0f;

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Four consecutive elements of a row (16-byte aligned f32, 8-byte aligned bf16).
__device__ __forceinline__ float4 load4(const void* row, bool f32, int64_t c) {
  if (f32) return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(row) + c));
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(row) + c));
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}

__device__ __forceinline__ float amax4(float a, const float4& v) {
  a = fmaxf(a, fabsf(v.x));
  a = fmaxf(a, fabsf(v.y));
  a = fmaxf(a, fabsf(v.z));
  return fmaxf(a, fabsf(v.w));
}

__device__ __forceinline__ uint32_t codes4(const float4& v, float s) {
  return static_cast<uint32_t>(to_e4m3(__fdiv_rn(v.x, s))) | (static_cast<uint32_t>(to_e4m3(__fdiv_rn(v.y, s))) << 8) |
         (static_cast<uint32_t>(to_e4m3(__fdiv_rn(v.z, s))) << 16) |
         (static_cast<uint32_t>(to_e4m3(__fdiv_rn(v.w, s))) << 24);
}

__device__ __forceinline__ float* scale_slot(const W8a8ScaleOut& s, int64_t t, int64_t g) {
  return t < s.n_main ? s.main + g * s.n_main + t : s.tail + g * s.n_tail + (t - s.n_main);
}

// Where the codes and scales go: rows [0, T) quantized, [T, T_pad) the
// GEMM's padding (codes 0, scale 0); codes rows of Kc (>= K, zero past K).
struct QuantOut {
  int64_t T, T_pad, K, Kc;
  uint8_t* codes;  // [T_pad][Kc]
  W8a8ScaleOut s;
};

// The values quantized. A source gives a row handle for token t and four
// consecutive f32 values of that row at column c (c % 4 == 0, c + 4 <= K);
// the kernels below are the same for every source, so codes and scales
// depend on the values only.
// RowsSrc: x itself (quantize_rows_e4m3): bf16 or f32 rows of K elements,
// row t at x + rows[t] * K (rows null: row t).
struct RowsSrc {
  const void* x;
  bool f32;
  const int32_t* rows;
  int64_t K;
  __device__ __forceinline__ const void* row(int64_t t) const {
    const int64_t r = rows ? rows[t] : t;
    return f32 ? static_cast<const void*>(static_cast<const float*>(x) + r * K)
               : static_cast<const void*>(static_cast<const uint16_t*>(x) + r * K);
  }
  __device__ __forceinline__ float4 load(const void* r, int64_t c) const { return load4(r, f32, c); }
};

// ActSrc: the gated activation of bf16 gate / up rows (gated_act_quantize_e4m3):
// gated_act_value (act.cuh, the element math of gated_act_bf16_in's
// kernels), rounded to bf16 (RNE) when out_bf16: the element
// gated_act_bf16_in writes into an out of that dtype, which
// quantize_rows_e4m3 would read back (bf16 widens exactly).
template <Activation A>
struct ActSrc {
  const uint16_t* gate;
  const uint16_t* up;
  int64_t in_stride;
  bool out_bf16;
  __device__ __forceinline__ int64_t row(int64_t t) const { return t * in_stride; }
  __device__ __forceinline__ float value(uint32_t g, uint32_t u) const {
    const float y = gated_act_value<A>(__uint_as_float(g), __uint_as_float(u));
    return out_bf16 ? __bfloat162float(__float2bfloat16_rn(y)) : y;
  }
  __device__ __forceinline__ float4 load(int64_t r, int64_t c) const {
    const uint2 g = __ldg(reinterpret_cast<const uint2*>(gate + r + c));
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(up + r + c));
    return make_float4(value(g.x << 16, u.x << 16), value(g.x & 0xffff0000u, u.x & 0xffff0000u),
                       value(g.y << 16, u.y << 16), value(g.y & 0xffff0000u, u.y & 0xffff0000u));
  }
};

// 1x128 groups: half a warp per group, 8 elements per lane (two 4-element
// pieces, loaded before either is used: twice the bytes in flight of one
// piece per lane), so a warp takes two groups. K % 4 == 0, so a short last
// group is whole 4-element pieces. Block b: row b / gb, groups (b % gb) * 16
// + warp * 2 + lane / 16, gb = ceil(groups / 16) (groups of Kc = groups of
// K). amax: fmaxf from 0 over |v| within the half warp (a NaN is ignored;
// max is order-free, so the shuffle tree gives the host's sequential
// result).
template <class Src>
__global__ void __launch_bounds__(256) quant_groups128_kernel(Src src, QuantOut a) {
  const int64_t groups = (a.Kc + 127) / 128, gb = (groups + 15) / 16;
  const int64_t t = blockIdx.x / gb;
  const int lane = threadIdx.x & 31;
  const int64_t g = (blockIdx.x % gb) * 16 + (threadIdx.x / 32) * 2 + lane / 16;
  if (g >= groups) return;  // whole half warps: the shuffles below stay within live lanes
  const int64_t c = g * 128 + (lane & 15) * 8;
  const bool in0 = c < a.K, in1 = c + 4 < a.K, out_col = c < a.Kc;
  uint2* out = reinterpret_cast<uint2*>(a.codes + t * a.Kc + c);
  if (t >= a.T) {  // padding row of the GEMM: zero codes, scale 0
    if (out_col) *out = make_uint2(0u, 0u);
    if ((lane & 15) == 0) *scale_slot(a.s, t, g) = 0.0f;
    return;
  }
  const auto row = src.row(t);
  const float4 v0 = in0 ? src.load(row, c) : make_float4(0.f, 0.f, 0.f, 0.f);
  const float4 v1 = in1 ? src.load(row, c + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
  float amax = amax4(amax4(0.0f, v0), v1);
  const unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o));
  const float s = amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
  if (out_col) *out = make_uint2(in0 ? codes4(v0, s) : 0u, in1 ? codes4(v1, s) : 0u);
  if ((lane & 15) == 0) *scale_slot(a.s, t, g) = s;
}

// Per token: one block of 256 threads per row; the amax over the whole row
// (a block reduction of fmaxf: order-free), then the codes (the values
// loaded again: a source computes the same value each time).
template <class Src>
__global__ void __launch_bounds__(256) quant_rows_kernel(Src src, QuantOut a) {
  const int64_t t = blockIdx.x;
  uint8_t* out = a.codes + t * a.Kc;
  if (t >= a.T) {
    for (int64_t c = threadIdx.x * 4; c < a.Kc; c += 256 * 4) *reinterpret_cast<uint32_t*>(out + c) = 0u;
    if (threadIdx.x == 0) *scale_slot(a.s, t, 0) = 0.0f;
    return;
  }
  const auto row = src.row(t);
  float amax = 0.0f;
  for (int64_t c = threadIdx.x * 4; c < a.K; c += 256 * 4) amax = amax4(amax, src.load(row, c));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __shared__ float part[8];
  __shared__ float sc;
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = part[0];
    for (int w = 1; w < 8; ++w) m = fmaxf(m, part[w]);
    sc = m > 0.0f ? __fdiv_rn(m, kE4m3Max) : 1.0f;
    *scale_slot(a.s, t, 0) = sc;
  }
  __syncthreads();
  const float s = sc;
  for (int64_t c = threadIdx.x * 4; c < a.Kc; c += 256 * 4)
    *reinterpret_cast<uint32_t*>(out + c) = c < a.K ? codes4(src.load(row, c), s) : 0u;
}

// The shared argument rules of quantize_rows_e4m3 and gated_act_quantize_e4m3.
void check_quant_out(const char* fn, const QuantOut& a, int64_t group) {
  const W8a8ScaleOut& s = a.s;
  if (!a.codes || !s.main || a.T < 0 || a.T_pad < a.T || a.K <= 0 || a.K % 4 != 0 || a.Kc % 16 != 0 ||
      a.Kc < a.K || a.Kc >= a.K + 16 || (group != 128 && group != a.K) || s.n_main < 0 || s.n_main > a.T_pad ||
      (s.n_main < a.T_pad && (!s.tail || a.T_pad - s.n_main != s.n_tail)) ||
      reinterpret_cast<uintptr_t>(a.codes) % 16 != 0)
    throw std::invalid_argument(std::string("cuda::") + fn + ": bad arguments (T=" + std::to_string(a.T) +
                                " T_pad=" + std::to_string(a.T_pad) + " K=" + std::to_string(a.K) + " Kc=" +
                                std::to_string(a.Kc) + " group=" + std::to_string(group) +
                                "; K % 4 == 0, Kc the multiple of 16 at or above K, group 128 or K, 16-byte aligned "
                                "codes and input)");
}

template <class Src>
void launch_quant(const Src& src, const QuantOut& a, int64_t group, cudaStream_t stream) {
  if (group == 128) {
    const int64_t gb = ((a.Kc + 127) / 128 + 15) / 16;
    quant_groups128_kernel<Src><<<static_cast<unsigned>(a.T_pad * gb), 256, 0, stream>>>(src, a);
  } else {
    quant_rows_kernel<Src><<<static_cast<unsigned>(a.T_pad), 256, 0, stream>>>(src, a);
  }
  FP8KV_CU_LAUNCH();
}

// y[t][n] = (accumulate ? y[t][n] + s[t][n] : s[t][n]) (+ bias[n]): the
// order of the direct path (cuBLASLt's alpha * acc + beta * C, then
// add_bias_rows).
__global__ void finish_kernel(const float* __restrict__ s, int64_t rows, int64_t N, const float* __restrict__ bias,
                              float* __restrict__ y, bool accumulate) {
  const int64_t total = rows * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = s[i];
    if (accumulate) v = __fadd_rn(y[i], v);
    if (bias) v = __fadd_rn(v, bias[i % N]);
    y[i] = v;
  }
}

}  // namespace

void quantize_rows_e4m3(const void* x, bool x_f32, const int32_t* rows, int64_t T, int64_t T_pad, int64_t K,
                        int64_t Kc, int64_t group, uint8_t* codes, W8a8ScaleOut s, cudaStream_t stream) {
  if (T_pad == 0) return;
  const QuantOut a{T, T_pad, K, Kc, codes, s};
  check_quant_out("quantize_rows_e4m3", a, group);
  if (!x || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    throw std::invalid_argument("cuda::quantize_rows_e4m3: x must be a 16-byte aligned device pointer");
  launch_quant(RowsSrc{x, x_f32, rows, K}, a, group, stream);
}

void gated_act_quantize_e4m3(Activation act, const uint16_t* gate, const uint16_t* up, int64_t in_stride,
                             bool out_bf16, int64_t T, int64_t T_pad, int64_t K, int64_t Kc, int64_t group,
                             uint8_t* codes, W8a8ScaleOut s, cudaStream_t stream) {
  if (T_pad == 0) return;
  const QuantOut a{T, T_pad, K, Kc, codes, s};
  check_quant_out("gated_act_quantize_e4m3", a, group);
  if (!gate || !up || in_stride < K || in_stride % 4 != 0 || reinterpret_cast<uintptr_t>(gate) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(up) % 8 != 0)
    throw std::invalid_argument("cuda::gated_act_quantize_e4m3: gate / up must be 8-byte aligned device pointers "
                                "with rows in_stride >= K (a multiple of 4) elements apart");
  switch (act) {
    case Activation::silu:
      launch_quant(ActSrc<Activation::silu>{gate, up, in_stride, out_bf16}, a, group, stream);
      break;
    case Activation::gelu_tanh:
      launch_quant(ActSrc<Activation::gelu_tanh>{gate, up, in_stride, out_bf16}, a, group, stream);
      break;
    case Activation::gelu:
      launch_quant(ActSrc<Activation::gelu>{gate, up, in_stride, out_bf16}, a, group, stream);
      break;
  }
}

void w8a8_finish_rows(const float* s, int64_t rows, int64_t N, const float* bias, float* y, bool accumulate,
                      cudaStream_t stream) {
  if (rows * N == 0) return;
  if (!bias && !accumulate) {
    FP8KV_CU(cudaMemcpyAsync(y, s, static_cast<size_t>(rows * N) * 4, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const int64_t blocks = std::min<int64_t>((rows * N + 255) / 256, 132 * 8);
  finish_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(s, rows, N, bias, y, accumulate);
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
