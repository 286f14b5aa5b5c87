// Paged decode attention: what the decode kernel shares (decode_body.cuh,
// decode_reduce.cu).
//
//
// One CTA = (KV head, chunk of up to 8 of its query heads, sequence, split of
// the keys); 4 warps take 16-key tiles in turn (warp w: tiles w, w + 4, ...).
// Tensor cores: S = Q K^T with M = query heads (8 of 16 rows used), then
// O^T += V^T P^T (P's accumulator layout is exactly P^T's B fragment).
//
// Fragment mapping: the dot product is order-free, so the head_dim axis of K
// is permuted such that each thread reads whole 16-byte chunks of a key row;
// Q is loaded in the same permuted order. For V the n axis (head_dim) is
// permuted likewise: thread (r, t) = (lane / 4, lane % 4) owns dims
// [r * D/8, (r+1) * D/8) of keys 2t, 2t+1, 2t+8, 2t+9. fp8 -> f16 happens in
// registers (exact); k_scale is folded into the score scale, v_scale applied
// once at the end.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/attention/decode_plan.h"
#include "backend/cuda/common.cuh"

namespace fp8kv::cuda::decode {
using namespace detail;

constexpr int kWarps = 4;
constexpr int kTile = 16;     // keys per warp tile
constexpr int kMaxGroup = 8;  // query heads per CTA
constexpr int kReduceThreads = 256;  // decode_reduce_kernel

struct DecodeParams : PagedKvParams {
  int gchunks;       // head chunks per KV head: ceil(group / kMaxGroup)
  int split_tokens;  // keys per split (multiple of 64)
  int max_splits;    // grid size along the split axis
  float* part_o;    // [batch][num_heads][max_splits][D]; splits > 1 only
  float* part_lse;  // [batch][num_heads][max_splits] (log2 domain)
};
// The per-token-head kernels' parameters: DecodeParams and the two scale
// arrays (a derived struct: a larger DecodeParams reorders the other kernels'
// parameter loads).
struct DecodePthParams : DecodeParams {
  const float* k_scale_pth;  // [num_blocks][block_size][num_kv_heads] f32
  const float* v_scale_pth;
};
template <int DT>
using DecodeParamsOf = std::conditional_t<dt_pth(DT), DecodePthParams, DecodeParams>;
// The keys of sequence `ctx` long that its splits cover: [first, ctx) is
// visible, the splits start at tstart (first rounded down to a tile).
__device__ __forceinline__ void seq_range(const DecodeParams& p, int ctx, int& first, int& tstart, int& nsplits) {
  const int qpos = ctx - 1;
  first = p.window > 0 ? max(0, qpos - p.window + 1) : 0;
  tstart = first & ~(kTile - 1);
  nsplits = ctx > 0 ? (ctx - tstart + p.split_tokens - 1) / p.split_tokens : 1;
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}

// Shapes of one (D, cache dtype) instantiation. REG: D = 256 on the register
// path (fp8); without it D = 256 uses the cp.async ring (bf16 d256, whose
// register tile would spill). Off the ring each warp's shared memory only
// holds its partial O for the epilogue.
template <int D, int DT, bool REG>
struct DecodeCfg {
  static constexpr bool USE_RING = D == 256 && !REG;
  static constexpr int EB = DT == kBf16 ? 2 : 1;  // bytes per cache element
  static constexpr int KC = D * EB / 64;          // 16-byte K chunks per thread per key row
  static constexpr int VBYTES = D / 8 * EB;       // V bytes per thread per key row
  static constexpr int VU = VBYTES / 16;          // 16-byte V units per row (ring)
  static constexpr int STAGE = 32 * D * EB;       // bytes per warp per tile (K + V)
  static constexpr int KREG = STAGE / 2;          // offset of V within a stage
  static constexpr int S = STAGE <= 2048 ? 8 : STAGE <= 4096 ? 4 : 3;  // ring stages per warp
  static constexpr int RING = USE_RING ? S * STAGE : kMaxGroup * D * 4;    // bytes per warp
  static constexpr int SMEM = kWarps * RING + 2 * kWarps * kMaxGroup * 4;
  static_assert(RING >= kMaxGroup * D * 4, "the epilogue reuses the ring");
  static_assert(!USE_RING || VBYTES >= 16, "ring: V in 16-byte units");
};

// One step of the online softmax for a 16-key tile (all three loops): the
// row max of the scores x (log2 domain, this thread's 2 x 2) across the 4
// lanes of a row, the rescale of the running sum l and accumulators o by
// exp2(m - m_new) (SKIP_UNIT: skipped when it is 1 in every lane: exact), and
// P packed as the MMA's B fragment (pa0, pa2). Returns the new (m, l).
// PTH (per-token-head): P is packed as p * vsc (the V scales of the keys of
// x), l sums p.
struct SoftmaxRow { float m, l; };
template <int DT, int MT, bool SKIP_UNIT, bool PTH = false>
__device__ __forceinline__ SoftmaxRow online_softmax_step(const float (&x)[2][2], float mx, int t, float m, float l,
                                                    float (&o)[MT][4], uint32_t& pa0, uint32_t& pa2,
                                                    const float (*vsc)[2] = nullptr) {
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float mref = m_new == -INFINITY ? 0.0f : m_new;
  const float alpha = exp2f(m - mref);
  m = m_new;
  float pr[2][2];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) pr[nt][e] = exp2f(x[nt][e] - mref);
  l = l * alpha + (pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1]);
  if (!SKIP_UNIT || __any_sync(0xffffffffu, alpha != 1.0f)) {
    const float alpha_lo = __shfl_sync(0xffffffffu, alpha, (2 * t) * 4);  // heads 2t, 2t+1
    const float alpha_hi = __shfl_sync(0xffffffffu, alpha, (2 * t + 1) * 4);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      o[i][0] *= alpha_lo; o[i][1] *= alpha_hi; o[i][2] *= alpha_lo; o[i][3] *= alpha_hi;
    }
  }
  if constexpr (PTH) {
    pa0 = pack2<DT>(pr[0][0] * vsc[0][0], pr[0][1] * vsc[0][1]);
    pa2 = pack2<DT>(pr[1][0] * vsc[1][0], pr[1][1] * vsc[1][1]);
  } else {
    pa0 = pack2<DT>(pr[0][0], pr[0][1]);
    pa2 = pack2<DT>(pr[1][0], pr[1][1]);
  }
  return {m, l};
}

// Per-token-head (PTH): the K and V scales of this thread's keys nt * 8 + 2t + e
// of a tile, from the lanes that loaded them (lane k < 16: key k's K scale;
// lane 16 + k: its V scale). Nothing otherwise.
template <bool PTH>
__device__ __forceinline__ void pth_scales(float sc, int t, float (&ks)[2][2], float (&vs)[2][2]) {
  if constexpr (PTH) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        ks[nt][e] = __shfl_sync(0xffffffffu, sc, nt * 8 + 2 * t + e);
        vs[nt][e] = __shfl_sync(0xffffffffu, sc, 16 + nt * 8 + 2 * t + e);
      }
  }
}

// The B operand (K^T) of Q K^T's k-step ks from this thread's K words w of
// one key row (4 words per 16-byte chunk, J k-steps per chunk).
template <int DT, int J, int N>
__device__ __forceinline__ void k_operand(const uint32_t (&w)[N], int ks, uint32_t& b0, uint32_t& b1) {
  if constexpr (DT == kBf16) {
    b0 = w[(ks / J) * 4 + 2 * (ks % J)];
    b1 = w[(ks / J) * 4 + 2 * (ks % J) + 1];
  } else {
    const uint32_t x = w[(ks / J) * 4 + (ks % J)];
    b0 = fp8x2_to_f16x2<DT>(x);
    b1 = fp8x2_to_f16x2<DT>(x >> 16);
  }
}

// The A operand (V^T) of O^T's m-tile i from this thread's V words vw[key][w]
// of keys 2t, 2t+1, 2t+8, 2t+9 (all three loops; the ring's vw: one V unit).
template <int DT, int VW>
__device__ __forceinline__ void v_operand(const uint32_t (&vw)[4][VW], int i, uint32_t& a0, uint32_t& a1, uint32_t& a2,
                                          uint32_t& a3) {
  if constexpr (DT == kBf16) {
    a0 = __byte_perm(vw[0][i], vw[1][i], 0x5410u);
    a1 = __byte_perm(vw[0][i], vw[1][i], 0x7632u);
    a2 = __byte_perm(vw[2][i], vw[3][i], 0x5410u);
    a3 = __byte_perm(vw[2][i], vw[3][i], 0x7632u);
  } else {
    const uint32_t b = 2 * (i & 1);  // byte of element 2i within its word
    if constexpr (DT == kE5m2) {
      const uint32_t sl = b | (b << 4) | ((b + 4) << 8) | ((b + 4) << 12);
      const uint32_t sh = (b + 1) | ((b + 1) << 4) | ((b + 5) << 8) | ((b + 5) << 12);
      a0 = __byte_perm(vw[0][i / 2], vw[1][i / 2], sl) & 0xff00ff00u;
      a1 = __byte_perm(vw[0][i / 2], vw[1][i / 2], sh) & 0xff00ff00u;
      a2 = __byte_perm(vw[2][i / 2], vw[3][i / 2], sl) & 0xff00ff00u;
      a3 = __byte_perm(vw[2][i / 2], vw[3][i / 2], sh) & 0xff00ff00u;
    } else {  // e4m3 kinds, int8
      const uint32_t sel = b | ((b + 4) << 4) | ((b + 1) << 8) | ((b + 5) << 12);
      const uint32_t w01 = __byte_perm(vw[0][i / 2], vw[1][i / 2], sel);
      const uint32_t w23 = __byte_perm(vw[2][i / 2], vw[3][i / 2], sel);
      a0 = fp8x2_to_f16x2<DT>(w01);
      a1 = fp8x2_to_f16x2<DT>(w01 >> 16);
      a2 = fp8x2_to_f16x2<DT>(w23);
      a3 = fp8x2_to_f16x2<DT>(w23 >> 16);
    }
  }
}

// O^T += V^T P^T: A = V^T (rows: dims, k: keys 2t,2t+1 | 2t+8,2t+9),
// B = P^T, which is exactly this thread's probabilities (pa0, pa2).
template <int DT, int MT, int VW>
__device__ __forceinline__ void pv_mma(float (&o)[MT][4], const uint32_t (&vw)[4][VW], uint32_t pa0, uint32_t pa2) {
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    uint32_t a0, a1, a2, a3;
    v_operand<DT, VW>(vw, i, a0, a1, a2, a3);
    mma16816<DT>(o[i], a0, a1, a2, a3, pa0, pa2);
  }
}

// dst = src, word by word (register tiles).
template <int R, int N>
__device__ __forceinline__ void copy_words(uint32_t (&dst)[R][N], const uint32_t (&src)[R][N]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int w = 0; w < N; ++w) dst[i][w] = src[i][w];
}

// The 4 warps' partials of one CTA combined in a fixed order: the output
// (one split) or this split's partial O and log-sum-exp. Each warp's partial
// O goes to its own shared memory (no longer read by the loop):
// [kMaxGroup][D] floats at smem + warp * RING.
template <int D, int DT, int RING>
__device__ __forceinline__ void combine_warps(const DecodeParams& p, uint8_t* smem, float* sm_m, float* sm_l,
                                              float (&o)[D / 16][4], float m, float l, int warp, int r, int t,
                                              int kvh, int b, int h0, int nh, int split, int nsplits) {
  constexpr int MT = D / 16;
  // Dependent (reduce) kernel may start launching: only epilogues remain.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  // Combine the 4 warps (fixed order). Each warp's partial O goes to its own
  // ring (no longer read): [kMaxGroup][D] floats.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (t == 0) { sm_m[warp * kMaxGroup + r] = m; sm_l[warp * kMaxGroup + r] = l; }
  {
    float* so = reinterpret_cast<float*>(smem + warp * RING);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int d = r * (D / 8) + 2 * i;
      *reinterpret_cast<float2*>(so + (2 * t) * D + d) = make_float2(o[i][0], o[i][2]);
      *reinterpret_cast<float2*>(so + (2 * t + 1) * D + d) = make_float2(o[i][1], o[i][3]);
    }
  }
  __syncthreads();
  const float vs = DT == kBf16 || dt_pth(DT) ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
  {
    for (int idx = threadIdx.x; idx < nh * D; idx += blockDim.x) {
      const int row = idx / D, d = idx % D;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w * kMaxGroup + row]);
      const float Mref = M == -INFINITY ? 0.0f : M;
      float L = 0.0f, O = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(sm_m[w * kMaxGroup + row] - Mref);
        L += sm_l[w * kMaxGroup + row] * f;
        O += reinterpret_cast<const float*>(smem + w * RING)[row * D + d] * f;
      }
      const int head = h0 + row;
      if (nsplits == 1) {
        store_act(p.out, (static_cast<int64_t>(b) * p.num_heads + head) * D + d, L > 0.0f ? O / L * vs : 0.0f,
                  p.out_bf16);
      } else {
        const int64_t slot = (static_cast<int64_t>(b) * p.num_heads + head) * p.max_splits + split;
        p.part_o[slot * D + d] = L > 0.0f ? O / L : 0.0f;
        if (d == 0) p.part_lse[slot] = L > 0.0f ? M + log2f(L) : -INFINITY;
      }
    }
  }
}

}  // namespace fp8kv::cuda::decode
