// Store kernel: K/V for a batch of tokens -> paged cache through a slot
// mapping. One thread quantizes 8 consecutive elements of one head row (16 or
// 32 bytes read, 8 (fp8) or 16 (bf16) bytes written).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace fp8kv::cuda {
namespace {
using namespace detail;

// saturate(rne(x / s)) with the IEEE division's result. A NaN input stores
// the canonical 0x7f, as the hardware conversion and the CPU reference do.
template <int DT>
__device__ __forceinline__ uint32_t quant_fp8_exact(float x, float s) {
  const float y = __fdiv_rn(x, s);
  uint32_t r = __nv_cvt_float_to_fp8(y, __NV_SATFINITE, DT == kE5m2 ? __NV_E5M2 : __NV_E4M3);
  return r;
}

// Fast path with the same bytes: q = x * rcp_rn(s) is within 2^-23 relative
// (< 4 ulp of q, binade edges included) of x / s. fp8 rounding is monotonic,
// so if q moved 8 ulp down and 8 ulp up round to the same code, x / s (and
// its correctly rounded fp32 value) rounds to that code too. Otherwise (one
// element in ~2^17, or +-inf / huge inputs) the caller redoes the chunk with
// the IEEE division.
template <int DT>
__device__ __forceinline__ bool quant_fp8_fast(float x, float rcp, uint32_t& code) {
  const float q = __fmul_rn(x, rcp);
  const uint32_t u = __float_as_uint(q), sign = u & 0x80000000u, a = u & 0x7fffffffu;
  const float lo = __uint_as_float(sign | (a > 8u ? a - 8u : 0u));
  const float hi = __uint_as_float(sign | (a + 8u));
  const __nv_fp8x2_storage_t pair =
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, DT == kE5m2 ? __NV_E5M2 : __NV_E4M3);
  code = pair & 0xffu;
  return (pair >> 8) == code && !isnan(x);
}

// fp32 -> bf16 bits exactly as numerics/fp8.h f32_to_bf16 (RNE, NaN keeps
// sign and top payload bits, quieted).
__device__ __forceinline__ uint32_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

__device__ __forceinline__ void load8(const void* src, int64_t elem, bool bf16, float (&x)[8]) {
  if (bf16) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(src) + elem);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(src) + elem);
    const float4 a = p[0], b = p[1];
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  }
}

struct StoreParams {
  uint8_t* k_cache;
  uint8_t* v_cache;
  const void* k;
  const void* v;
  const float* k_scale;
  const float* v_scale;
  int k_scale_count, v_scale_count;
  const int64_t* slots;
  int num_tokens, num_kv_heads, head_dim;
  int64_t capacity;
  bool bf16_in;
};

// One block per token (grid-stride); thread c < chunks stores K chunk c,
// chunks <= c < 2 chunks stores V. No 64-bit division, no indexed parameter
// arrays (they would go to local memory).
template <int DT>
__global__ void __launch_bounds__(256) store_kernel(const StoreParams p) {
  const int chunks = p.num_kv_heads * p.head_dim / 8;  // 8-element chunks per token row
  for (int tok = blockIdx.x; tok < p.num_tokens; tok += gridDim.x) {
    for (int c = threadIdx.x; c < 2 * chunks; c += blockDim.x) {
      const bool is_v = c >= chunks;
      const int elem = (is_v ? c - chunks : c) * 8;
      float x[8];
      load8(is_v ? p.v : p.k, static_cast<int64_t>(tok) * chunks * 8 + elem, p.bf16_in, x);
      const int64_t slot = p.slots[tok];
      if (slot < 0 || slot >= p.capacity) continue;  // host cannot see device slots; skip out-of-range
      const int64_t dst = slot * chunks * 8 + elem;  // [block][off][head][d] == slot * row + elem
      uint8_t* cache = is_v ? p.v_cache : p.k_cache;
      if constexpr (DT == kBf16) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = bf16_bits(x[2 * i]) | (bf16_bits(x[2 * i + 1]) << 16);
        *reinterpret_cast<uint4*>(cache + dst * 2) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        const int head = elem / p.head_dim;
        const float s = is_v ? p.v_scale[p.v_scale_count == 1 ? 0 : head] : p.k_scale[p.k_scale_count == 1 ? 0 : head];
        const float rcp = __frcp_rn(s);
        uint32_t lo = 0, hi = 0;
        bool ok = true;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t c0, c1;
          ok &= quant_fp8_fast<DT>(x[i], rcp, c0);
          ok &= quant_fp8_fast<DT>(x[4 + i], rcp, c1);
          lo |= c0 << (8 * i);
          hi |= c1 << (8 * i);
        }
        if (!ok) {  // rare: near a rounding boundary, inf, NaN
          lo = hi = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            lo |= quant_fp8_exact<DT>(x[i], s) << (8 * i);
            hi |= quant_fp8_exact<DT>(x[4 + i], s) << (8 * i);
          }
        }
        *reinterpret_cast<uint2*>(cache + dst) = make_uint2(lo, hi);
      }
    }
  }
}

// absmax[h] = max(absmax[h], max |x[t][h][:]|), NaN ignored. One block per
// (token, head) row would be too many launches' worth of atomics: one warp
// per row, one atomic per row.
__global__ void absmax_kernel(const void* x, bool bf16, int num_tokens, int heads, int head_dim,
                              float* absmax) {
  const int warps = blockDim.x / 32;
  const int64_t rows = static_cast<int64_t>(num_tokens) * heads;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(warps) + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    float m = 0.0f;
    for (int d = threadIdx.x % 32; d < head_dim; d += 32) m = fmaxf(m, fabsf(load_act(x, row * head_dim + d, bf16)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x % 32 == 0) atomicMax(reinterpret_cast<int*>(absmax + row % heads), __float_as_int(m));
  }
}

void launch_absmax(const void* x, bool bf16, int num_tokens, int heads, int head_dim, float* absmax,
                   cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(num_tokens) * heads;
  const int grid = static_cast<int>(std::min<int64_t>((rows + 7) / 8, 4096));
  absmax_kernel<<<grid, 256, 0, stream>>>(x, bf16, num_tokens, heads, head_dim, absmax);
  FP8KV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void store_kv(const StoreKvArgs& a, cudaStream_t stream) {
  const KvCacheLayout& L = a.layout;
  if (a.num_tokens < 0) throw std::invalid_argument("store_kv: num_tokens < 0");
  if (a.num_tokens == 0) return;
  if (L.head_dim <= 0 || L.head_dim % 8 != 0)
    throw std::invalid_argument("store_kv: head_dim must be a positive multiple of 8, got " + std::to_string(L.head_dim));
  if (L.num_kv_heads <= 0 || L.block_size <= 0 || L.num_blocks <= 0)
    throw std::invalid_argument("store_kv: layout needs num_kv_heads, block_size, num_blocks > 0");
  if (!a.k_cache || !a.v_cache || !a.k || !a.v || !a.slot_mapping)
    throw std::invalid_argument("store_kv: null cache, input or slot_mapping pointer");
  const bool fp8 = kv_dtype_is_fp8(L.dtype);
  if (fp8) {
    if (!a.k_scale.values || !a.v_scale.values) throw std::invalid_argument("store_kv: fp8 cache needs k/v scales");
    for (const DeviceScales* s : {&a.k_scale, &a.v_scale})
      if (s->count != 1 && s->count != L.num_kv_heads)
        throw std::invalid_argument("store_kv: scale count must be 1 or num_kv_heads (" +
                                    std::to_string(L.num_kv_heads) + "), got " + std::to_string(s->count));
  }
  StoreParams p{};
  p.k_cache = static_cast<uint8_t*>(a.k_cache);
  p.v_cache = static_cast<uint8_t*>(a.v_cache);
  p.k = a.k;
  p.v = a.v;
  p.k_scale = a.k_scale.values;
  p.v_scale = a.v_scale.values;
  p.k_scale_count = a.k_scale.count;
  p.v_scale_count = a.v_scale.count;
  p.slots = a.slot_mapping;
  p.num_tokens = a.num_tokens;
  p.num_kv_heads = L.num_kv_heads;
  p.head_dim = L.head_dim;
  p.capacity = static_cast<int64_t>(L.num_blocks) * L.block_size;
  p.bf16_in = a.input_dtype == ActDtype::bf16;
  const int chunks2 = 2 * L.num_kv_heads * L.head_dim / 8;
  const int threads = std::min(256, (chunks2 + 31) / 32 * 32);
  const int grid = std::min(a.num_tokens, 132 * 32);
  switch (L.dtype) {
    case KvDtype::bf16: store_kernel<kBf16><<<grid, threads, 0, stream>>>(p); break;
    case KvDtype::fp8_e4m3: store_kernel<kE4m3><<<grid, threads, 0, stream>>>(p); break;
    case KvDtype::fp8_e5m2: store_kernel<kE5m2><<<grid, threads, 0, stream>>>(p); break;
  }
  FP8KV_CUDA_CHECK(cudaGetLastError());
  const bool bf16_in = a.input_dtype == ActDtype::bf16;
  if (a.k_absmax) launch_absmax(a.k, bf16_in, a.num_tokens, L.num_kv_heads, L.head_dim, a.k_absmax, stream);
  if (a.v_absmax) launch_absmax(a.v, bf16_in, a.num_tokens, L.num_kv_heads, L.head_dim, a.v_absmax, stream);
  if (a.q_absmax) {
    if (!a.q || a.num_q_heads <= 0) throw std::invalid_argument("store_kv: q_absmax needs q and num_q_heads > 0");
    launch_absmax(a.q, bf16_in, a.num_tokens, a.num_q_heads, L.head_dim, a.q_absmax, stream);
  }
}

int device_sm_count() {
  static int n = [] {
    int dev = 0, sms = 0;
    FP8KV_CUDA_CHECK(cudaGetDevice(&dev));
    FP8KV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }();
  return n;
}

}  // namespace fp8kv::cuda
