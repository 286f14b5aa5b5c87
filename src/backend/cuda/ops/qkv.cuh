// The attention input prep of one head (per-head QK-norm + RoPE, fused KV
// store) for the prep kernel (ops/norm.cu qkv_prep_kernel). A qkv GEMV with
// the prep fused in (measured and deleted: docs/cuda_backend.md "Deleted
// variants") would share it.
#pragma once

#include "backend/cuda/attention/kv_quant.cuh"
#include "backend/cuda/ops/ops.h"
#include "backend/cuda/ops/norm.cuh"

namespace fp8kv::cuda {

constexpr int kPrepWarps = 8;
constexpr int kMaxHeadDim = 256;

// Element i of kv head h of a token with `slot` -> the paged cache
// ([slot][head][d], QkvPrepArgs::FusedStore), the byte(s) store_kv writes.
// Returns 1 when the element clipped (|x / s| beyond the fp8 format's max
// finite, store_kv's rule; docs/robustness.md "KV clipping"), else 0.
__device__ __forceinline__ uint32_t store_code(const QkvPrepArgs::FusedStore& st, int num_kv_heads, bool is_v,
                                               int64_t slot, int h, int D, int i, float x) {
  using namespace detail;
  const int64_t idx = (slot * num_kv_heads + h) * D + i;
  void* cache = is_v ? st.v_cache : st.k_cache;
  if (st.dtype == KvDtype::bf16) {
    static_cast<uint16_t*>(cache)[idx] = static_cast<uint16_t>(bf16_bits(x));
    return 0u;
  }
  const float* sc = is_v ? st.v_scale : st.k_scale;
  const float s = sc[(is_v ? st.v_scale_count : st.k_scale_count) == 1 ? 0 : h];
  const bool e5m2 = st.dtype == KvDtype::fp8_e5m2;
  static_cast<uint8_t*>(cache)[idx] =
      static_cast<uint8_t>(e5m2 ? quant_fp8_exact<kE5m2>(x, s) : quant_fp8_exact<kE4m3>(x, s));
  return fabsf(__fdiv_rn(x, s)) > (e5m2 ? 57344.0f : 448.0f) ? 1u : 0u;
}

// A warp's clipped count for one stored head row -> st.clips[is_v], one
// atomic and only when nonzero (all 32 lanes call it).
__device__ __forceinline__ void add_clips(const QkvPrepArgs::FusedStore& st, bool is_v, uint32_t n, int lane) {
  if (!st.clips) return;
  n = __reduce_add_sync(0xffffffffu, n);
  if (lane == 0 && n) atomicAdd(st.clips + (is_v ? 1 : 0), static_cast<unsigned long long>(n));
}

// cos / sin of token t's position (all threads of the block, strided by
// blockDim.x); the caller syncs before qkv_prep_head reads them.
__device__ __forceinline__ void qkv_prep_rope_table(const QkvPrepArgs& a, int t, float* cs, float* sn) {
  if (!a.inv_freq) return;
  const int half = a.rot_dim / 2;
  const float pf = static_cast<float>(a.positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float f = __fmul_rn(a.inv_freq[i], pf);  // fp32 product, as RopeTable::fill
    double s, c;
    sincos(static_cast<double>(f), &s, &c);
    cs[i] = __fmul_rn(static_cast<float>(c), a.attention_factor);
    sn[i] = __fmul_rn(static_cast<float>(s), a.attention_factor);
  }
}

// Head hh of token t (q heads, then k heads, then v heads) by one warp; sb:
// this warp's kMaxHeadDim floats of shared memory.
__device__ __forceinline__ void qkv_prep_head(const QkvPrepArgs& a, int t, int hh, int lane, float* sb,
                                              const float* cs, const float* sn) {
  auto ld = [](const float* p) { return *p; };
  const int D = a.head_dim, half = a.rot_dim / 2;
  const int nq = a.num_q_heads, nk = a.k_in ? a.num_kv_heads : 0;
  const float* in;
  float* out;  // null: a k head stored to the cache (fused store)
  const float* nw;
  int kv_head = -1;
  if (hh < nq) {
    in = a.q_in + static_cast<int64_t>(t) * a.q_stride + static_cast<int64_t>(hh) * (a.q_head_stride ? a.q_head_stride : D);
    out = a.q_out + (static_cast<int64_t>(t) * nq + hh) * D;
    nw = a.q_norm_w;
  } else if (hh < nq + nk) {
    const int h = hh - nq;
    in = a.k_in + static_cast<int64_t>(t) * a.k_stride + static_cast<int64_t>(h) * D;
    out = a.store.k_cache ? nullptr : a.k_out + (static_cast<int64_t>(t) * nk + h) * D;
    nw = a.k_norm_w;
    kv_head = h;
  } else {
    const int h = hh - nq - nk;
    const float* vin = a.v_in + static_cast<int64_t>(t) * a.v_stride + static_cast<int64_t>(h) * D;
    if (a.store.k_cache) {
      const int64_t slot = a.store.slots[t];
      if (slot >= 0 && slot < a.store.capacity) {  // the same for the whole warp
        uint32_t n = 0;
        for (int i = lane; i < D; i += 32) n += store_code(a.store, a.num_kv_heads, true, slot, h, D, i, ld(vin + i));
        add_clips(a.store, true, n, lane);
      }
      return;
    }
    float* vout = a.v_out + (static_cast<int64_t>(t) * nk + h) * D;
    for (int i = lane; i < D; i += 32) vout[i] = ld(vin + i);
    return;
  }
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) {
    const float x = ld(in + i);
    sb[i] = x;
    ss += x * x;
  }
  if (nw) {
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = inv_rms(ss, D, a.eps);
    for (int i = lane; i < D; i += 32) sb[i] = __fmul_rn(__fmul_rn(sb[i], inv), nw[i]);
  }
  __syncwarp();
  // The results stay in registers (lane's elements lane + 32 j): RoPE reads
  // partner elements of other lanes from sb, so sb is not overwritten.
  float res[kMaxHeadDim / 32];
#pragma unroll
  for (int j = 0; j < kMaxHeadDim / 32; ++j) {
    const int i = lane + 32 * j;
    if (i >= D) break;
    float r = sb[i];
    if (a.inv_freq) {
      if (i < half) {  // lo = a*c + (-b)*s
        r = __fadd_rn(__fmul_rn(sb[i], cs[i]), __fmul_rn(-sb[i + half], sn[i]));
      } else if (i < 2 * half) {  // hi = b*c + a*s
        const int m = i - half;
        r = __fadd_rn(__fmul_rn(sb[i], cs[m]), __fmul_rn(sb[m], sn[m]));
      }
    }
    res[j] = r;
  }
  if (out) {
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 32; ++j)
      if (lane + 32 * j < D) out[lane + 32 * j] = res[j];
  } else {
    const int64_t slot = a.store.slots[t];
    if (slot >= 0 && slot < a.store.capacity) {
      uint32_t n = 0;
#pragma unroll
      for (int j = 0; j < kMaxHeadDim / 32; ++j)
        if (lane + 32 * j < D) n += store_code(a.store, a.num_kv_heads, false, slot, kv_head, D, lane + 32 * j, res[j]);
      add_clips(a.store, false, n, lane);
    }
  }
  __syncwarp();  // sb reused by this warp's next head
}

}  // namespace fp8kv::cuda
