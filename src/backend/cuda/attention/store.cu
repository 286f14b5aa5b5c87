// Store kernel: K/V for a batch of tokens -> paged cache through a slot
// mapping. One thread quantizes 8 consecutive elements of one head row (16 or
// 32 bytes read, 8 (fp8) or 16 (bf16) bytes written). One kernel per cache
// dtype (store_kernel<DT>), no variants; the calibration observer's absmax
// kernel runs after it when asked for.
#include <algorithm>
#include <cfloat>
#include <stdexcept>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/attention/kv_quant.cuh"

namespace fp8kv::cuda {
namespace {
using namespace detail;

// Fast path with the same bytes (docs/cuda.md): the correctly
// rounded fp32 quotient without a division. rcp = rcp_rn(s) is within half
// an ulp of 1/s; q0 = x * rcp is within 1.5 ulp of x / s; one correction
// q1 = q0 + fma(-q0, s, x) * rcp is within 0.5 ulp + 2^-23 ulp, i.e.
// faithful; for a faithful q1 the residual fma(-q1, s, x) is exact and a
// second correction gives x / s correctly rounded (Markstein's theorem; the
// correction div.rn uses), as long as nothing overflows or underflows.
// Underflow cannot change the code (fp8 rounds anything below 2^-10 / 2^-17
// to zero, far above fp32's subnormals); huge quotients, inf and NaN inputs
// take the IEEE division (the fallback below). Per element: a multiply, four FMAs, a compare, half a cvt.
template <int DT>
__device__ __forceinline__ uint32_t cvt_fp8x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, DT == kE5m2 ? __NV_E5M2 : __NV_E4M3);
}
// 8 elements -> 8 codes (element 0 in the low byte of lo): fp8 (saturating
// cvt) or int8 (int8_code) of the correctly rounded quotient.
// clipped (per-tensor fp8 only; counted always, added up by the caller
// only when it counts): += the elements whose correctly rounded
// quotient is beyond the format's max finite (an inf input counts, NaN does
// not): the CPU store's rule (backend/cpu/kv_ops.h), on the same quotient.
template <int DT>
__device__ __forceinline__ uint2 quant8(const float (&x)[8], float s, float rcp, uint32_t& clipped) {
  float q[8];
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float q0 = __fmul_rn(x[i], rcp);                         // within 1.5 ulp
    const float q1 = __fmaf_rn(__fmaf_rn(-q0, s, x[i]), rcp, q0);  // faithful
    // Correctly rounded; the sign is x's (s > 0; a -0 input would come out +0).
    q[i] = copysignf(__fmaf_rn(__fmaf_rn(-q1, s, x[i]), rcp, q1), x[i]);
    bad |= !(fabsf(q0) < 0x1p64f);  // huge, inf, NaN
  }
  uint32_t w[2];
  constexpr float kM = DT == kE5m2 ? 57344.0f : 448.0f;
  constexpr bool kCount = DT == kE4m3 || DT == kE5m2;
  if (!bad) {
    if constexpr (kCount) {
#pragma unroll
      for (int i = 0; i < 8; ++i) clipped += fabsf(q[i]) > kM;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (DT == kI8Pth) {
        w[h] = int8_code(q[4 * h]) | (int8_code(q[4 * h + 1]) << 8) | (int8_code(q[4 * h + 2]) << 16) |
               (int8_code(q[4 * h + 3]) << 24);
      } else {
        w[h] = cvt_fp8x2<DT>(q[4 * h], q[4 * h + 1]) | (cvt_fp8x2<DT>(q[4 * h + 2], q[4 * h + 3]) << 16);
      }
    }
  } else {  // rare: huge, inf, NaN
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      w[h] = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[h] |= quant_code_exact<DT>(x[4 * h + i], s) << (8 * i);
        if constexpr (kCount) clipped += fabsf(__fdiv_rn(x[4 * h + i], s)) > kM;
      }
    }
  }
  return make_uint2(w[0], w[1]);
}

// quant8 with a per-row scale: the division-free quotient is exact for
// 2^-92 <= s <= FLT_MAX (docs/cuda.md, store); other scales (a row of tiny
// values, or inf in the row) take the IEEE division.
template <int DT>
__device__ __forceinline__ uint2 quant8_pth(const float (&x)[8], float s) {
  uint32_t unused = 0;  // per-token-head scales never clip
  if (s >= 0x1p-92f && s <= FLT_MAX) return quant8<DT>(x, s, __frcp_rn(s), unused);
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i / 4] |= quant_code_exact<DT>(x[i], s) << (8 * (i % 4));
  return make_uint2(w[0], w[1]);
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

constexpr int kU = 2;  // tokens per iteration of the store kernels

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
  unsigned long long* clips;  // [2] K, V clipped (per-tensor fp8); null: not counted
};
// The per-token-head store's (a separate struct: store_kernel's parameters stay as they are).
struct StorePthParams : StoreParams {
  float* k_scale_pth;  // [capacity][num_kv_heads] f32, written
  float* v_scale_pth;
};

// Tokens tok0 .. tok0 + kU - 1 of a store: this thread's 8-element chunk
// (at elem) of their K and V rows when `load` (ZERO: zeros otherwise) and
// their slots (-1 past num_tokens).
template <bool ZERO>
__device__ __forceinline__ void load_tokens(const StoreParams& p, int tok0, int chunks, int elem, bool load,
                                            float (&xk)[kU][8], float (&xv)[kU][8], int64_t (&slot)[kU]) {
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int tok = tok0 + u;
    slot[u] = -1;
    if constexpr (ZERO) {
#pragma unroll
      for (int i = 0; i < 8; ++i) xk[u][i] = xv[u][i] = 0.0f;
    }
    if (tok < p.num_tokens) {
      const int64_t src = static_cast<int64_t>(tok) * chunks * 8 + elem;
      if (load) {
        load8(p.k, src, p.bf16_in, xk[u]);
        load8(p.v, src, p.bf16_in, xv[u]);
      }
      slot[u] = p.slots[tok];
    }
  }
}

// Store (grid: min(ceil(num_tokens / kU), a few waves) x 1 x 1; block: up
// to 256 threads, a multiple of 32).
//   DT: cache element code (kBf16, kE4m3, kE5m2).
//   p.k, p.v       [num_tokens][num_kv_heads][head_dim], f32 or bf16 (p.bf16_in)
//   p.slots        [num_tokens]: cache slot (block * block_size + offset); < 0 or
//                  >= capacity: the token is skipped
//   p.k_cache, p.v_cache  [capacity][num_kv_heads][head_dim], DT
//                  (= [num_blocks][block_size][num_kv_heads][head_dim])
//   p.k_scale, p.v_scale  [1] or [num_kv_heads] (fp8 only): code = x / scale
// Thread c of a block stores 8-element chunk c of the K and the V row of kU
// tokens per iteration (grid-stride over token groups): 2 kU independent
// 16/32-byte loads in flight before the first store. Scales and reciprocals
// are per thread (its chunk's head), outside the token loop. No 64-bit
// division, no indexed parameter arrays (they would go to local memory).
// With p.clips, each warp adds the elements it clipped (quant8), one atomic
// per stream and only when nonzero: a clip-free store does no atomics.
template <int DT>
__global__ void __launch_bounds__(256) store_kernel(const StoreParams p) {
  const int chunks = p.num_kv_heads * p.head_dim / 8;  // 8-element chunks per token row
  uint32_t ck = 0, cv = 0;                              // elements this thread clipped
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const int elem = c * 8;
    float sk = 1.0f, sv = 1.0f, rk = 1.0f, rv = 1.0f;
    if constexpr (DT != kBf16) {
      const int head = elem / p.head_dim;
      sk = p.k_scale[p.k_scale_count == 1 ? 0 : head];
      sv = p.v_scale[p.v_scale_count == 1 ? 0 : head];
      rk = __frcp_rn(sk);
      rv = __frcp_rn(sv);
    }
    for (int tok0 = blockIdx.x * kU; tok0 < p.num_tokens; tok0 += gridDim.x * kU) {
      float xk[kU][8], xv[kU][8];
      int64_t slot[kU];
      load_tokens<false>(p, tok0, chunks, elem, true, xk, xv, slot);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (slot[u] < 0 || slot[u] >= p.capacity) continue;  // skipped or out of range (host cannot check)
        const int64_t dst = slot[u] * chunks * 8 + elem;      // [block][off][head][d] == slot * row + elem
        if constexpr (DT == kBf16) {
          uint32_t wk[4], wv[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            wk[i] = bf16_bits(xk[u][2 * i]) | (bf16_bits(xk[u][2 * i + 1]) << 16);
            wv[i] = bf16_bits(xv[u][2 * i]) | (bf16_bits(xv[u][2 * i + 1]) << 16);
          }
          *reinterpret_cast<uint4*>(p.k_cache + dst * 2) = make_uint4(wk[0], wk[1], wk[2], wk[3]);
          *reinterpret_cast<uint4*>(p.v_cache + dst * 2) = make_uint4(wv[0], wv[1], wv[2], wv[3]);
        } else {
          *reinterpret_cast<uint2*>(p.k_cache + dst) = quant8<DT>(xk[u], sk, rk, ck);
          *reinterpret_cast<uint2*>(p.v_cache + dst) = quant8<DT>(xv[u], sv, rv, cv);
        }
      }
    }
  }
  if constexpr (DT != kBf16) {
    if (p.clips) {  // every thread of the block gets here (no early return above)
      ck = __reduce_add_sync(0xffffffffu, ck);
      cv = __reduce_add_sync(0xffffffffu, cv);
      if ((threadIdx.x & 31) == 0) {
        if (ck) atomicAdd(p.clips, static_cast<unsigned long long>(ck));
        if (cv) atomicAdd(p.clips + 1, static_cast<unsigned long long>(cv));
      }
    }
  }
}

// Per-token-head store (DT kE4m3Pth or kI8Pth; grid and block as store_kernel):
// each (token, KV head) row of K and of V gets its own scale
// s = max(amax / M, FLT_MIN) (amax = max |x| of the row, NaN ignored; M = 448
// or 127, an IEEE division), and its codes are quant8's of x / s.
//   p.k, p.v, p.slots, p.k_cache, p.v_cache, p.capacity  as store_kernel
//   p.k_scale_pth, p.v_scale_pth  [capacity][num_kv_heads] f32
//                  (= [num_blocks][block_size][num_kv_heads]), written
// The G = head_dim / 8 threads of one row are G consecutive lanes of a warp (G
// divides 32, blockDim.x is a multiple of 32), so amax is G-lane xor shuffles;
// the warps walk the chunks warp-uniformly so that every lane shuffles.
template <int DT>
__global__ void __launch_bounds__(256) store_pth_kernel(const StorePthParams p) {
  static_assert(dt_pth(DT), "per-token-head dtypes only");
  constexpr float kM = DT == kI8Pth ? 127.0f : 448.0f;
  const int chunks = p.num_kv_heads * p.head_dim / 8;
  const int G = p.head_dim / 8;
  const int lane = threadIdx.x & 31;
  for (int c0 = threadIdx.x - lane; c0 < chunks; c0 += blockDim.x) {
    const int c = c0 + lane, elem = c * 8, head = c / G;
    const bool active = c < chunks;  // inactive lanes are whole G-lane groups
    for (int tok0 = blockIdx.x * kU; tok0 < p.num_tokens; tok0 += gridDim.x * kU) {
      float xk[kU][8], xv[kU][8];
      int64_t slot[kU];
      load_tokens<true>(p, tok0, chunks, elem, active, xk, xv, slot);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (slot[u] < 0 || slot[u] >= p.capacity) continue;  // the same token for the whole block
        float ak = 0.0f, av = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          ak = fmaxf(ak, fabsf(xk[u][i]));
          av = fmaxf(av, fabsf(xv[u][i]));
        }
        for (int o = G / 2; o > 0; o >>= 1) {
          ak = fmaxf(ak, __shfl_xor_sync(0xffffffffu, ak, o));
          av = fmaxf(av, __shfl_xor_sync(0xffffffffu, av, o));
        }
        if (!active) continue;
        const float sk = fmaxf(__fdiv_rn(ak, kM), FLT_MIN), sv = fmaxf(__fdiv_rn(av, kM), FLT_MIN);
        if (c % G == 0) {
          p.k_scale_pth[slot[u] * p.num_kv_heads + head] = sk;
          p.v_scale_pth[slot[u] * p.num_kv_heads + head] = sv;
        }
        const int64_t dst = slot[u] * chunks * 8 + elem;
        *reinterpret_cast<uint2*>(p.k_cache + dst) = quant8_pth<DT>(xk[u], sk);
        *reinterpret_cast<uint2*>(p.v_cache + dst) = quant8_pth<DT>(xv[u], sv);
      }
    }
  }
}

// absmax[h] = max(absmax[h], max |x[t][h][:]|), NaN ignored. One block per
// (token, head) row would be too many launches' worth of atomics: one warp
// per row, one atomic per row (grid-stride over rows).
//   x       [num_tokens][heads][head_dim], f32 or bf16 (bf16)
//   absmax  [heads], device; max-ed into (the caller initializes it)
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
  const bool pth = kv_dtype_per_token_head(L.dtype);
  if (pth) {
    if (!a.k_scale_pth || !a.v_scale_pth)
      throw std::invalid_argument("store_kv: a per-token-head cache needs k_scale_pth / v_scale_pth");
    if (L.head_dim > 256 || (L.head_dim & (L.head_dim - 1)) != 0)
      throw std::invalid_argument("store_kv: per-token-head caches need a power-of-two head_dim <= 256, got " +
                                  std::to_string(L.head_dim));
  }
  const bool fp8 = kv_dtype_per_tensor_scaled(L.dtype);
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
  p.clips = fp8 ? a.clips : nullptr;
  StorePthParams pp{};
  static_cast<StoreParams&>(pp) = p;
  pp.k_scale_pth = a.k_scale_pth;
  pp.v_scale_pth = a.v_scale_pth;
  const int chunks = L.num_kv_heads * L.head_dim / 8;
  const int threads = std::min(256, (chunks + 31) / 32 * 32);
  // Up to 2048 threads per SM resident, a few waves of token groups.
  const int grid = std::min((a.num_tokens + kU - 1) / kU, device_sm_count() * (2048 / threads) * 4);
  switch (L.dtype) {
    case KvDtype::bf16: store_kernel<kBf16><<<grid, threads, 0, stream>>>(p); break;
    case KvDtype::fp8_e4m3: store_kernel<kE4m3><<<grid, threads, 0, stream>>>(p); break;
    case KvDtype::fp8_e5m2: store_kernel<kE5m2><<<grid, threads, 0, stream>>>(p); break;
    case KvDtype::fp8_e4m3_pth: store_pth_kernel<kE4m3Pth><<<grid, threads, 0, stream>>>(pp); break;
    case KvDtype::int8_pth: store_pth_kernel<kI8Pth><<<grid, threads, 0, stream>>>(pp); break;
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
