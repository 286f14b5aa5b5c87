// Store kernel: K/V for a batch of tokens -> paged cache through a slot
// mapping. One thread quantizes 8 consecutive elements of one head row (16 or
// 32 bytes read, 8 (fp8) or 16 (bf16) bytes written).
#include <stdexcept>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace fp8kv::cuda {
namespace {
using namespace detail;

// saturate(rne(x / s)), IEEE division; NaN keeps its sign as the CPU does.
template <int DT>
__device__ __forceinline__ uint32_t quant_fp8(float x, float s) {
  const float y = __fdiv_rn(x, s);
  uint32_t r = __nv_cvt_float_to_fp8(y, __NV_SATFINITE, DT == kE5m2 ? __NV_E5M2 : __NV_E4M3);
  if (isnan(y)) r = (signbit(y) ? 0x80u : 0u) | 0x7fu;
  return r;
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
  uint8_t* cache[2];
  const void* src[2];
  const float* scale[2];
  int scale_count[2];
  const int64_t* slots;
  int num_tokens, num_kv_heads, head_dim, block_size;
  int64_t capacity;
  bool bf16_in;
};

template <int DT>
__global__ void __launch_bounds__(256) store_kernel(const StoreParams p) {
  const int chunks_per_row = p.num_kv_heads * p.head_dim / 8;  // per token, per tensor
  const int64_t items = static_cast<int64_t>(p.num_tokens) * 2 * chunks_per_row;
  for (int64_t it = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; it < items;
       it += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int chunk = static_cast<int>(it % chunks_per_row);
    const int kv = static_cast<int>((it / chunks_per_row) & 1);
    const int64_t tok = it / (2 * chunks_per_row);
    const int64_t slot = p.slots[tok];
    if (slot < 0 || slot >= p.capacity) continue;  // host checked the range when it could
    const int elem = chunk * 8;                   // within the token row
    const int head = elem / p.head_dim;
    float x[8];
    load8(p.src[kv], tok * chunks_per_row * 8 + elem, p.bf16_in, x);
    // slot = block * block_size + off; row layout [block][off][head][d] = slot * row + elem.
    const int64_t dst = slot * chunks_per_row * 8 + elem;
    if constexpr (DT == kBf16) {
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        __nv_bfloat162 b = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
        w[i] = *reinterpret_cast<uint32_t*>(&b);
      }
      *reinterpret_cast<uint4*>(p.cache[kv] + dst * 2) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      const float s = p.scale[kv][p.scale_count[kv] == 1 ? 0 : head];
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo |= quant_fp8<DT>(x[i], s) << (8 * i);
        hi |= quant_fp8<DT>(x[4 + i], s) << (8 * i);
      }
      *reinterpret_cast<uint2*>(p.cache[kv] + dst) = make_uint2(lo, hi);
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
  p.cache[0] = static_cast<uint8_t*>(a.k_cache);
  p.cache[1] = static_cast<uint8_t*>(a.v_cache);
  p.src[0] = a.k;
  p.src[1] = a.v;
  p.scale[0] = a.k_scale.values;
  p.scale[1] = a.v_scale.values;
  p.scale_count[0] = a.k_scale.count;
  p.scale_count[1] = a.v_scale.count;
  p.slots = a.slot_mapping;
  p.num_tokens = a.num_tokens;
  p.num_kv_heads = L.num_kv_heads;
  p.head_dim = L.head_dim;
  p.block_size = L.block_size;
  p.capacity = static_cast<int64_t>(L.num_blocks) * L.block_size;
  p.bf16_in = a.input_dtype == ActDtype::bf16;
  const int64_t items = static_cast<int64_t>(a.num_tokens) * 2 * L.num_kv_heads * L.head_dim / 8;
  const int threads = 256;
  const int grid = static_cast<int>(std::min<int64_t>((items + threads - 1) / threads, 132 * 16));
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
