// Paged prefill / chunked-prefill attention (FlashAttention-2 style on
// mma.sync m16n8k16), the plan's path for head_dim 64 (prefill_plan.h;
// head_dim 128 and 256 run the wgmma kernel, prefill_ws.cu).
// One CTA = 64 queries of one head of one sequence,
// 4 warps x 16 query rows; K/V tiles of KT keys are gathered through the
// block table, fp8 dequantized (exactly, to f16) into shared memory, and read
// with ldmatrix. The next tile's global loads are issued into registers
// before the current tile's math (register-staged pipeline).
// fp8 and int8 caches: f16 MMAs (Q, P rounded to f16); bf16 caches: bf16 MMAs.
// k_scale folds into the score scale, v_scale multiplies the output once;
// per-token-head scales multiply score columns and P columns (see the kernel).
#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "backend/cuda/attention/prefill_common.cuh"
#include "backend/cuda/attention/prefill_plan.h"

namespace fp8kv::cuda {
namespace {
using namespace detail;

constexpr int kQTile = 64;
constexpr int kThreads = 128;

struct PrefillParams : PagedKvParams {
  const int32_t* q_start;  // [batch + 1]: sequence b's queries are rows [q_start[b], q_start[b + 1])
  int num_q_tiles;         // ceil(max_query_len / kQTile)
};
// The per-token-head kernels' (a derived struct: the others' parameters stay as they are).
struct PrefillPthParams : PrefillParams {
  const float* k_scale_pth;  // [num_blocks][block_size][num_kv_heads] f32
  const float* v_scale_pth;
};
template <int DT>
using PrefillParamsOf = std::conditional_t<dt_pth(DT), PrefillPthParams, PrefillParams>;

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

constexpr int kKvTile = 64;  // keys per K/V tile
// Dynamic shared memory: K and V tiles (f16/bf16, padded rows), plus the
// per-token-head scales of a tile.
template <int D, int DT>
__host__ __device__ constexpr int prefill_smem() {
  return 2 * kKvTile * (D + 8) * 2 + (dt_pth(DT) ? 2 * kKvTile * 4 : 0);
}

// Paged prefill attention (grid: num_q_tiles x num_heads x batch, 128
// threads, prefill_smem<D, DT>() bytes of dynamic shared memory).
//   D: head dim (64 by the plan); DT: cache element code (kBf16, kE4m3, kE5m2, per-token-head).
//   p.q            [total_q][num_heads][D], f32 or bf16 (p.q_bf16); total_q = q_start[batch]
//   p.out          [total_q][num_heads][D], f32 or bf16 (p.out_bf16)
//   p.k_cache, p.v_cache  [num_blocks][block_size][num_kv_heads][D], DT
//   p.block_tables [batch][max_blocks_per_seq]
//   p.context_lens [batch]: sequence b's keys are positions [0, context_lens[b])
//   p.q_start      [batch + 1]: its queries are rows [q_start[b], q_start[b + 1]),
//                  at the last positions of its context
//   p.k_scale, p.v_scale  [1] or [num_kv_heads] (per-tensor-scaled fp8 only)
//   p.k_scale_pth, p.v_scale_pth  [num_blocks][block_size][num_kv_heads] f32 (per-token-head DT,
//                  PrefillPthParams): a key's K scale multiplies its score column
//                  after Q K^T, its V scale its column of P before P V (not the sum l);
//                  staged per tile in shared memory beside the K/V tiles
//   p.window       0: causal; else query at position i sees keys j with i - j < window
//   p.softmax_scale, p.softcap (0: off); p.group = num_heads / num_kv_heads
// CTA (x, h, b) runs query tile num_q_tiles - 1 - x (the longest first) of
// head h of sequence b.
template <int D, int DT>
__global__ void __launch_bounds__(kThreads) prefill_mma_kernel(const PrefillParamsOf<DT> p) {
  static_assert(D == 64, "prefill_mma_kernel: the plan runs it at head_dim 64 only");
  constexpr bool PTH = dt_pth(DT);
  constexpr int KT = kKvTile;
  constexpr int EB = DT == kBf16 ? 2 : 1;
  constexpr int CH = D * EB / 16;             // 16-byte chunks per key row (global)
  constexpr int LOADS = KT * CH / kThreads;   // chunks per thread per tensor
  constexpr int PITCH = D + 8;                // smem row pitch in 16-bit elements
  constexpr int KS = D / 16;
  constexpr int NT = KT / 8;                  // score n-tiles per warp
  constexpr int ONT = D / 8;                  // output n-tiles
  static_assert(KT * CH % kThreads == 0, "tile/thread mismatch");

  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* sk = smem;
  uint16_t* sv = smem + KT * PITCH;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int qtile = p.num_q_tiles - 1 - blockIdx.x;  // longest (latest) tiles first
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = p.q_start[b], nq = p.q_start[b + 1] - q0;
  if (qtile * kQTile >= nq) return;
  const int ctx = p.context_lens[b];
  const int pos0 = ctx - nq;  // position of query 0
  const int kvh = h / p.group;
  const int64_t row_bytes = static_cast<int64_t>(p.num_kv_heads) * D * EB;
  const int64_t head_off = static_cast<int64_t>(kvh) * D * EB;
  const int32_t* bt = p.block_tables + static_cast<int64_t>(b) * p.max_blocks_per_seq;
  // Byte offset of key j's row (PageMap's arithmetic without its power-of-two path).
  auto slot_off = [&](int j) {
    return (static_cast<int64_t>(bt[j / p.block_size]) * p.block_size + j % p.block_size) * row_bytes + head_off;
  };

  // This warp's rows: queries qtile*64 + warp*16 + {g, g+8}.
  const int qi0 = qtile * kQTile + warp * 16 + g;
  const int qpos[2] = {pos0 + qi0, pos0 + qi0 + 8};
  const bool qvalid[2] = {qi0 < nq, qi0 + 8 < nq};
  // Keys any query of the CTA can see: [kv_lo, kv_hi).
  const int cta_first_q = pos0 + qtile * kQTile;
  const int cta_last_q = pos0 + min(nq, (qtile + 1) * kQTile) - 1;
  const int kv_lo = p.window > 0 ? max(0, cta_first_q - p.window + 1) : 0;
  const int kv_hi = cta_last_q + 1;
  const int tile_lo = kv_lo / KT * KT;

  // Q fragments, in registers.
  uint32_t qa[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t f[4];
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int d = ks * 16 + half * 8 + 2 * t;
        float x0 = 0.0f, x1 = 0.0f;
        if (qvalid[rr]) {
          const int64_t off = (static_cast<int64_t>(q0 + qi0 + rr * 8) * p.num_heads + h) * D + d;
          x0 = load_act(p.q, off, p.q_bf16);
          x1 = load_act(p.q, off + 1, p.q_bf16);
        }
        f[half * 2 + rr] = pack2<DT>(x0, x1);
      }
#pragma unroll
    for (int i = 0; i < 4; ++i) qa[ks][i] = f[i];
  }
  const float ks_ = DT == kBf16 || PTH ? 1.0f : p.k_scale[p.k_scale_count == 1 ? 0 : kvh];
  // Per-token-head: the tile's K scales at ssc[key], V scales at ssc[KT + key].
  float* ssc = reinterpret_cast<float*>(smem + 2 * KT * PITCH);
  float rks = 0.0f, rvs = 0.0f;  // thread tid < KT: key tid's scales of the next tile (0 outside the range)
  const bool softcap = p.softcap > 0.0f;
  const float score_mul = softcap ? p.softmax_scale * ks_ / p.softcap : p.softmax_scale * ks_ * kLog2e;

  float o[ONT][4];
#pragma unroll
  for (int i = 0; i < ONT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  // Register stage: this thread's chunks of the next K and V tile.
  uint4 rk[LOADS], rv[LOADS];
  auto load_tile = [&](int j0) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int c = tid + i * kThreads, key = c / CH, ch = c % CH, j = j0 + key;
      if (j >= kv_lo && j < kv_hi) {
        const int64_t off = slot_off(j) + ch * 16;
        rk[i] = ld_stream16(p.k_cache + off);
        rv[i] = ld_stream16(p.v_cache + off);
      } else {
        rk[i] = rv[i] = make_uint4(0, 0, 0, 0);  // never read: unwritten / freed slots may hold NaN
      }
    }
    if constexpr (PTH) {
      const int j = j0 + tid;
      rks = rvs = 0.0f;
      if (tid < KT && j >= kv_lo && j < kv_hi) {
        const int64_t idx = (static_cast<int64_t>(bt[j / p.block_size]) * p.block_size + j % p.block_size) *
                                p.num_kv_heads + kvh;
        rks = p.k_scale_pth[idx];
        rvs = p.v_scale_pth[idx];
      }
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int c = tid + i * kThreads, key = c / CH, ch = c % CH;
      if constexpr (DT == kBf16) {
        *reinterpret_cast<uint4*>(sk + key * PITCH + ch * 8) = rk[i];
        *reinterpret_cast<uint4*>(sv + key * PITCH + ch * 8) = rv[i];
      } else {
        const uint32_t wk[4] = {rk[i].x, rk[i].y, rk[i].z, rk[i].w};
        const uint32_t wv[4] = {rv[i].x, rv[i].y, rv[i].z, rv[i].w};
        uint32_t hk[8], hv[8];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          hk[2 * w] = fp8x2_to_f16x2<DT>(wk[w]);
          hk[2 * w + 1] = fp8x2_to_f16x2<DT>(wk[w] >> 16);
          hv[2 * w] = fp8x2_to_f16x2<DT>(wv[w]);
          hv[2 * w + 1] = fp8x2_to_f16x2<DT>(wv[w] >> 16);
        }
        uint4* dk = reinterpret_cast<uint4*>(sk + key * PITCH + ch * 16);
        uint4* dv = reinterpret_cast<uint4*>(sv + key * PITCH + ch * 16);
        dk[0] = make_uint4(hk[0], hk[1], hk[2], hk[3]);
        dk[1] = make_uint4(hk[4], hk[5], hk[6], hk[7]);
        dv[0] = make_uint4(hv[0], hv[1], hv[2], hv[3]);
        dv[1] = make_uint4(hv[4], hv[5], hv[6], hv[7]);
      }
    }
    if constexpr (PTH) {
      if (tid < KT) {
        ssc[tid] = rks;
        ssc[KT + tid] = rvs;
      }
    }
  };

  load_tile(tile_lo);
  for (int j0 = tile_lo; j0 < kv_hi; j0 += KT) {
    __syncthreads();  // previous tile's readers are done
    store_tile();
    __syncthreads();
    if (j0 + KT < kv_hi) load_tile(j0 + KT);  // in flight during the math below
    const uint16_t* skb = sk;
    const uint16_t* svb = sv;

    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t q[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = qa[ks][i];
#pragma unroll
      for (int nb = 0; nb < NT / 2; ++nb) {
        uint32_t bk[4];
        const int mi = lane >> 3, row = lane & 7;
        ldsm_x4(bk, skb + (nb * 16 + (mi >> 1) * 8 + row) * PITCH + ks * 16 + (mi & 1) * 8);
        mma16816<DT>(s[2 * nb], q[0], q[1], q[2], q[3], bk[0], bk[1]);
        mma16816<DT>(s[2 * nb + 1], q[0], q[1], q[2], q[3], bk[2], bk[3]);
      }
    }
    // Scale, mask (causal, window, range), online softmax per row.
    const bool full_tile = j0 >= kv_lo && j0 + KT - 1 <= qpos[0] &&
                           (p.window == 0 || qpos[1] - j0 < p.window) && qvalid[1];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = PTH ? (s[n][rr * 2 + e] * ssc[n * 8 + 2 * t + e]) * score_mul : s[n][rr * 2 + e] * score_mul;
          if (softcap) v = p.softcap * tanhf(v) * kLog2e;
          if (!full_tile) {
            const int j = j0 + n * 8 + 2 * t + e;
            const bool vis = j <= qpos[rr] && (p.window == 0 || qpos[rr] - j < p.window);
            v = vis ? v : -INFINITY;
          }
          s[n][rr * 2 + e] = v;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[rr], mx);
      const float mref = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m[rr] - mref);
      m[rr] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = exp2f(s[n][rr * 2 + e] - mref);
          s[n][rr * 2 + e] = pe;
          sum += pe;
        }
      l[rr] = l[rr] * alpha + sum;
#pragma unroll
      for (int i = 0; i < ONT; ++i) { o[i][rr * 2] *= alpha; o[i][rr * 2 + 1] *= alpha; }
    }
    // O += P V (per-token-head: P's key columns times their V scales).
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      if constexpr (PTH) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 vs2 = *reinterpret_cast<const float2*>(ssc + KT + kk * 16 + h * 8 + 2 * t);
          s[2 * kk + h][0] *= vs2.x; s[2 * kk + h][1] *= vs2.y; s[2 * kk + h][2] *= vs2.x; s[2 * kk + h][3] *= vs2.y;
        }
      }
      const uint32_t a0 = pack2<DT>(s[2 * kk][0], s[2 * kk][1]);
      const uint32_t a1 = pack2<DT>(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pack2<DT>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t a3 = pack2<DT>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < ONT / 2; ++dn) {
        uint32_t bv[4];
        const int mi = lane >> 3, row = lane & 7;
        ldsm_x4_t(bv, svb + (kk * 16 + (mi & 1) * 8 + row) * PITCH + dn * 16 + (mi >> 1) * 8);
        mma16816<DT>(o[2 * dn], a0, a1, a2, a3, bv[0], bv[1]);
        mma16816<DT>(o[2 * dn + 1], a0, a1, a2, a3, bv[2], bv[3]);
      }
    }
  }

  const float vs = DT == kBf16 || PTH ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
  store_o_rows<D>(p, q0 + qi0, h, t, l, qvalid, vs, [&](int i, int rr, int e) { return o[i][rr * 2 + e]; });
}

template <int D, int DT>
void launch_prefill_t(const PrefillPthParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = prefill_smem<D, DT>();
  // Per device, not per process: TP ranks are threads on different GPUs.
  detail::set_func_attribute_once(prefill_mma_kernel<D, DT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  prefill_mma_kernel<D, DT><<<grid, kThreads, smem, stream>>>(static_cast<const PrefillParamsOf<DT>&>(p));
  FP8KV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_prefill_mma(const PrefillArgs& a, cudaStream_t stream) {
  PrefillPthParams p{};
  fill_prefill_params(p, a, kQTile);
  const dim3 grid(p.num_q_tiles, a.num_heads, a.batch);
  const bool planned = launch_planned<PrefillPath::mma>(a.kv.layout.head_dim, a.kv.layout.dtype,
                                                        [&]<int D, int DT>() { launch_prefill_t<D, DT>(p, grid, stream); });
  if (!planned) throw std::logic_error("launch_prefill_mma: the plan gives this case to another kernel");
}

}  // namespace fp8kv::cuda
