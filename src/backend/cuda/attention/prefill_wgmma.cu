// Paged prefill / chunked-prefill attention on Hopper wgmma (head_dim 128).
// One CTA = 128 queries of one (sequence, q head): 2 warpgroups x 64 rows,
// 256 threads. K/V tiles of 64 keys are gathered through the block table
// (one lookup per 16-byte chunk; 16-token pages) by cp.async into a 2-stage
// ring; the copy of tile i+1 is in flight during tile i's math.
//  - bf16 cache: cp.async straight into 128B-swizzled K and V tiles.
//  - fp8 cache: cp.async of the fp8 bytes into a 2-stage staging ring; each
//    thread dequantizes (exactly, to f16) the chunks it copied into one
//    swizzled f16 K/V tile.
// S = Q K^T: 8 x wgmma m64n64k16 per warpgroup, Q and K from shared memory
// (K-major). Online softmax on the f32 accumulators in registers (exp2, the
// mma.sync kernel's arithmetic). O += P V: 4 x wgmma m64n128k16 with P in
// registers (rounded to the MMA type) and V from shared memory, N-major.
// fp8 caches: f16 MMAs (Q, P rounded to f16); bf16 caches: bf16 MMAs.
// k_scale folds into the score scale, v_scale multiplies the output once.
// docs/cuda.md (2026-12-01) has the design and the measured figures.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "backend/cuda/attention/prefill_common.cuh"
#include "backend/cuda/attention/prefill_wgmma.h"
#include "backend/cuda/attention/wgmma.cuh"

namespace fp8kv::cuda {
namespace {
using namespace detail;

constexpr int kD = 128;            // head dim
constexpr int kKTest = 64;         // keys per tile of the building-block tests
// Configurations (FP8KV_WGMMA_CFG, a tuning option): KT keys per tile x NWG
// warpgroups (64 queries each) per CTA: 64x2 (default), 128x2, 64x1 (two
// CTAs per SM: registers <= 168 and 82 KB of shared memory each).
template <int KT>
__host__ __device__ constexpr int tile_bytes() { return KT * kD * 2; }  // one 16-bit K or V tile
template <int KT>
__host__ __device__ constexpr int raw_bytes() { return KT * kD; }       // one fp8 K or V tile
// 1024 for the alignment of the swizzled tiles; bf16: 2 stages of K+V tiles;
// fp8: 1 converted K+V tile + 2 stages of fp8 K+V (the same size).
// PIPE (64x2p): 3 stages of 16-bit K+V tiles, plus a 2-stage fp8 staging ring.
// NST: stages of the (non-pipelined) ring: bf16 NST K+V tiles; fp8 one
// converted K+V tile + NST fp8 staging stages (64x2d: NST = 4).
template <int KT, int NWG, bool PIPE, int NST = 2>
constexpr int wg_smem() {
  return 1024 + NWG * 64 * kD * 2 +
         (PIPE ? 3 * 2 * tile_bytes<KT>() + 2 * 2 * raw_bytes<KT>()
               : (NST * 2 * tile_bytes<KT>() > 2 * tile_bytes<KT>() + NST * 2 * raw_bytes<KT>()
                      ? NST * 2 * tile_bytes<KT>()
                      : 2 * tile_bytes<KT>() + NST * 2 * raw_bytes<KT>()));
}
static_assert(2 * tile_bytes<64>() + 2 * 2 * raw_bytes<64>() == 2 * 2 * tile_bytes<64>(), "ring sizes");
static_assert(wg_smem<128, 2, false>() <= 227 * 1024 && 2 * wg_smem<64, 1, false>() <= 227 * 1024 &&
                  wg_smem<64, 2, true>() <= 227 * 1024 && wg_smem<64, 2, false, 4>() <= 227 * 1024,
              "shared memory");

struct WgParams : PagedKvParams {
  const int32_t* q_start;
  int num_q_tiles;
  int batch;
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return p + ((1024 - (smem_u32(p) & 1023)) & 1023);
}

// S(64 x KT) = Q(64 rows at qa, panel stride q_panel) K(KT keys at ka)^T:
// qk_issue issues and commits (s is in flight until a wgmma wait), qk_tile
// also waits.
// kZero = false: s holds finite values already (the first wgmma ignores
// them: scale-d 0), so no zeroing instructions.
template <int DT, int KT, bool kZero = true>
__device__ __forceinline__ void qk_issue(float (&s)[KT / 2], uint32_t qa, uint32_t q_panel, uint32_t ka) {
  if constexpr (kZero) {
#pragma unroll
    for (int i = 0; i < KT / 2; ++i) s[i] = 0.0f;
  }
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    const uint64_t da = gmma_desc(qa + (ks / 4) * q_panel + (ks % 4) * 32, 16, 1024);
    const uint64_t db = gmma_desc(ka + (ks / 4) * (KT * 128) + (ks % 4) * 32, 16, 1024);
    if constexpr (KT == 64) wgmma_m64n64_ss<DT>(s, da, db, ks > 0 ? 1 : 0);
    else wgmma_m64n128_ss<DT>(s, da, db, ks > 0 ? 1 : 0);
  }
  wgmma_commit();
}
template <int DT, int KT>
__device__ __forceinline__ void qk_tile(float (&s)[KT / 2], uint32_t qa, uint32_t q_panel, uint32_t ka) {
  qk_issue<DT, KT>(s, qa, q_panel, ka);
  wgmma_wait0();
  reg_fence(s);
}

// O(64 x 128) += P(64 x KT, registers: pa[kk] = keys 16kk..16kk+15) V(KT keys at va).
// kSwapOffsets: LBO and SBO exchanged (a diagnostic alternative for the
// building-block test only; the kernel never sets it).
template <int DT, int KT, bool kSwapOffsets = false>
__device__ __forceinline__ void pv_issue(float (&o)[64], uint32_t (&pa)[KT / 16][4], uint32_t va) {
  reg_fence(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KT / 16; ++kk) {
    const uint64_t db = kSwapOffsets ? gmma_desc(va + kk * 16 * 128, 1024, KT * 128)
                                     : gmma_desc(va + kk * 16 * 128, KT * 128, 1024);
    wgmma_m64n128_rs_t<DT>(o, pa[kk], db, 1);
  }
  wgmma_commit();
}
template <int DT, int KT, bool kSwapOffsets = false>
__device__ __forceinline__ void pv_tile(float (&o)[64], uint32_t (&pa)[KT / 16][4], uint32_t va) {
  pv_issue<DT, KT, kSwapOffsets>(o, pa, va);
  wgmma_wait0();
  reg_fence(o);
}

template <int DT, int KT, int NWG, bool PIPE, int NST>
__global__ void __launch_bounds__(NWG * 128, NWG == 1 ? 2 : 1) prefill_wgmma_kernel(const WgParams p) {
  constexpr int EB = DT == kBf16 ? 2 : 1;
  constexpr int kBM = NWG * 64;
  constexpr int kWThreads = NWG * 128;
  constexpr int kQBytes = kBM * kD * 2;
  constexpr int kKT = KT;
  constexpr int kTileBytes = tile_bytes<KT>();
  constexpr int kRawBytes = raw_bytes<KT>();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align1024(smem_raw);
  uint8_t* sQ = smem;
  uint8_t* sKV = smem + kQBytes;            // stage s: K at + s * 2 * kTileBytes, V at + kTileBytes
  // fp8: stage s: K at + s * 2 * kRawBytes, V at + kRawBytes
  uint8_t* sRaw = sKV + (PIPE ? 3 : 1) * 2 * kTileBytes;

  const int tid = threadIdx.x, wg = NWG == 1 ? 0 : tid >> 7, lane = tid & 31, wwarp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int h = blockIdx.x;
  const int qtile = p.num_q_tiles - 1 - static_cast<int>(blockIdx.y);  // longest (latest) tiles first
  const int b = blockIdx.z;
  const int q0 = p.q_start[b], nq = p.q_start[b + 1] - q0;
  if (qtile * kBM >= nq) return;
  const int ctx = p.context_lens[b];
  const int pos0 = ctx - nq;
  const int kvh = h / p.group;

  // This thread's rows: CTA rows r0 and r0 + 8.
  const int r0 = wg * 64 + wwarp * 16 + g;
  const int qi0 = qtile * kBM + r0;
  const int qpos[2] = {pos0 + qi0, pos0 + qi0 + 8};
  const bool qvalid[2] = {qi0 < nq, qi0 + 8 < nq};
  const int cta_first_q = pos0 + qtile * kBM;
  const int cta_last_q = pos0 + min(nq, (qtile + 1) * kBM) - 1;
  const int kv_lo = p.window > 0 ? max(0, cta_first_q - p.window + 1) : 0;
  const int kv_hi = cta_last_q + 1;
  const int tile_lo = kv_lo / kKT * kKT;
  // Keys this warpgroup's rows can see: [wg_lo, wg_hi) (empty: no valid row).
  const int wg_first_q = cta_first_q + wg * 64;
  const int wg_hi = wg_first_q > cta_last_q ? -1 : min(cta_last_q, wg_first_q + 63) + 1;
  const int wg_lo = p.window > 0 ? max(0, wg_first_q - p.window + 1) : 0;

  // Q -> shared memory (swizzled, MMA type), rows past nq zero.
  for (int c = tid; c < kBM * (kD / 8); c += kWThreads) {
    const int row = c / (kD / 8), ch = c % (kD / 8), qi = qtile * kBM + row;
    uint32_t w[4] = {0, 0, 0, 0};
    if (qi < nq) {
      const int64_t off = (static_cast<int64_t>(q0 + qi) * p.num_heads + h) * kD + ch * 8;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w[e] = pack2<DT>(load_act(p.q, off + 2 * e, p.q_bf16), load_act(p.q, off + 2 * e + 1, p.q_bf16));
    }
    *reinterpret_cast<uint4*>(sQ + swz_chunk(kBM, row, ch)) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  fence_proxy_async();

  const float ks_ = DT == kBf16 ? 1.0f : p.k_scale[p.k_scale_count == 1 ? 0 : kvh];
  const bool softcap = p.softcap > 0.0f;
  const float score_mul = softcap ? p.softmax_scale * ks_ / p.softcap : p.softmax_scale * ks_ * kLog2e;

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  const PageMap pm(p, b, kvh, kD, EB);  // byte offset of key j's row: pm.slot_off(j)
  // Copies of tile j0 into ring stage `st` (one commit group), zero-filled
  // outside [kv_lo, kv_hi): unwritten / freed slots may hold NaN.
  auto issue = [&](int j0, int st) {
    if constexpr (DT == kBf16) {
      const uint32_t dk = smem_u32(sKV + st * 2 * kTileBytes), dv = dk + kTileBytes;
#pragma unroll
      for (int i = 0; i < kKT * 16 / kWThreads; ++i) {
        const int c = tid + i * kWThreads, key = c / 16, ch = c % 16, j = j0 + key;
        const bool ok = j >= kv_lo && j < kv_hi;
        int64_t off = 0;
        if (ok) off = pm.slot_off(j) + ch * 16;
        cp_async16(dk + swz_chunk(kKT, key, ch), p.k_cache + off, ok);
        cp_async16(dv + swz_chunk(kKT, key, ch), p.v_cache + off, ok);
      }
    } else {
      const uint32_t dk = smem_u32(sRaw + st * 2 * kRawBytes), dv = dk + kRawBytes;
#pragma unroll
      for (int i = 0; i < kKT * 8 / kWThreads; ++i) {
        const int c = tid + i * kWThreads, key = c / 8, ch = c % 8, j = j0 + key;
        const bool ok = j >= kv_lo && j < kv_hi;
        int64_t off = 0;
        if (ok) off = pm.slot_off(j) + ch * 16;
        cp_async16(dk + key * 128 + ch * 16, p.k_cache + off, ok);
        cp_async16(dv + key * 128 + ch * 16, p.v_cache + off, ok);
      }
    }
    cp_async_commit();
  };
  // fp8: this thread's own staged chunks of stage `st` -> f16 swizzled tiles
  // at dst (K; V at + kTileBytes).
  auto convert = [&](int st, uint8_t* dst) {
    const uint8_t* rk = sRaw + st * 2 * kRawBytes;
    const uint8_t* rv = rk + kRawBytes;
#pragma unroll
    for (int i = 0; i < kKT * 8 / kWThreads; ++i) {
      const int c = tid + i * kWThreads, key = c / 8, ch = c % 8;
      const uint4 wk4 = *reinterpret_cast<const uint4*>(rk + key * 128 + ch * 16);
      const uint4 wv4 = *reinterpret_cast<const uint4*>(rv + key * 128 + ch * 16);
      const uint32_t wk[4] = {wk4.x, wk4.y, wk4.z, wk4.w}, wv[4] = {wv4.x, wv4.y, wv4.z, wv4.w};
      uint32_t hk[8], hv[8];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        hk[2 * w] = fp8x2_to_f16x2<DT>(wk[w]);
        hk[2 * w + 1] = fp8x2_to_f16x2<DT>(wk[w] >> 16);
        hv[2 * w] = fp8x2_to_f16x2<DT>(wv[w]);
        hv[2 * w + 1] = fp8x2_to_f16x2<DT>(wv[w] >> 16);
      }
      *reinterpret_cast<uint4*>(dst + swz_chunk(kKT, key, 2 * ch)) = make_uint4(hk[0], hk[1], hk[2], hk[3]);
      *reinterpret_cast<uint4*>(dst + swz_chunk(kKT, key, 2 * ch + 1)) = make_uint4(hk[4], hk[5], hk[6], hk[7]);
      *reinterpret_cast<uint4*>(dst + kTileBytes + swz_chunk(kKT, key, 2 * ch)) = make_uint4(hv[0], hv[1], hv[2], hv[3]);
      *reinterpret_cast<uint4*>(dst + kTileBytes + swz_chunk(kKT, key, 2 * ch + 1)) =
          make_uint4(hv[4], hv[5], hv[6], hv[7]);
    }
  };

  // Scale, mask (causal, window, range), online softmax per row of tile j0;
  // rescales o. Leaves the probabilities in s.
  auto softmax = [&](float (&s)[KT / 2], int j0) {
    const bool full_tile = j0 >= kv_lo && j0 + kKT - 1 <= qpos[0] && (p.window == 0 || qpos[1] - j0 < p.window) &&
                           qvalid[1];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = s[4 * n + rr * 2 + e] * score_mul;
          if (softcap) v = p.softcap * tanhf(v) * kLog2e;
          if (!full_tile) {
            const int j = j0 + n * 8 + 2 * t + e;
            const bool vis = j >= kv_lo && j <= qpos[rr] && (p.window == 0 || qpos[rr] - j < p.window);
            v = vis ? v : -INFINITY;
          }
          s[4 * n + rr * 2 + e] = v;
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
      for (int n = 0; n < kKT / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = exp2f(s[4 * n + rr * 2 + e] - mref);
          s[4 * n + rr * 2 + e] = pe;
          sum += pe;
        }
      l[rr] = l[rr] * alpha + sum;
#pragma unroll
      for (int i = 0; i < kD / 8; ++i) { o[4 * i + rr * 2] *= alpha; o[4 * i + rr * 2 + 1] *= alpha; }
    }
  };
  // P (registers, the MMA type) for O += P V: the S accumulator layout is the
  // A-fragment layout, 4 packs per 16 keys.
  auto pack_p = [&](float (&s)[KT / 2], uint32_t (&pa)[KT / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      pa[kk][0] = pack2<DT>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack2<DT>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack2<DT>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack2<DT>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };
  const uint32_t qa = smem_u32(sQ) + wg * 64 * 128;
  // This warpgroup has a row that sees a key of tile j0 (warpgroup-uniform).
  auto sees = [&](int j0) { return j0 < kv_hi && j0 < wg_hi && j0 + kKT > wg_lo; };

  if constexpr (!PIPE) {
    // NST-stage ring, tile k in stage k % NST, issued NST - 1 tiles ahead;
    // one commit group per tile (empty past the end).
#pragma unroll
    for (int k = 0; k < NST - 1; ++k) {
      if (tile_lo + k * kKT < kv_hi) issue(tile_lo + k * kKT, k);
      else cp_async_commit();
    }
    int it = 0;
    for (int j0 = tile_lo; j0 < kv_hi; j0 += kKT, ++it) {
      const int st = it % NST, st_next = (it + NST - 1) % NST;
      const int j_next = j0 + (NST - 1) * kKT;
      const bool has_next = j_next < kv_hi;
      const uint8_t* tk;
      if constexpr (DT == kBf16) {
        cp_async_wait<NST - 2>();  // this thread's copies of tile j0
        fence_proxy_async();
        __syncthreads();     // everyone's copies landed; everyone is done with tile j0 - 1's stage
        if (has_next) issue(j_next, st_next);
        else if (NST > 2) cp_async_commit();
        tk = sKV + st * 2 * kTileBytes;
      } else {
        if (has_next) issue(j_next, st_next);  // its stage held tile j0 - 1, converted by this thread
        else cp_async_commit();
        cp_async_wait<NST - 1>();  // this thread's copies of tile j0
        __syncthreads();     // everyone is done reading the converted tile
        convert(st, sKV);
        fence_proxy_async();
        __syncthreads();
        tk = sKV;
      }
      if (!sees(j0)) continue;

      float s[KT / 2];
      qk_tile<DT, KT>(s, qa, kBM * 128, smem_u32(tk));
      softmax(s, j0);
      uint32_t pa[KT / 16][4];
      pack_p(s, pa);
      pv_tile<DT, KT>(o, pa, smem_u32(tk + kTileBytes));
    }
  } else {
    // Pipelined (64x2p): tiles i and i+1 are resident while i is processed;
    // S(i+1) = Q K(i+1)^T runs on the tensor cores during softmax(i).
    // 16-bit tile k sits in stage k % 3; fp8 bytes of tile k in staging k % 2.
    issue(tile_lo, 0);
    if (tile_lo + kKT < kv_hi) issue(tile_lo + kKT, 1);
    else cp_async_commit();
    if constexpr (DT != kBf16) {
      cp_async_wait<1>();  // own copies of tile 0
      convert(0, sKV);
    }
    float s[KT / 2], sn[KT / 2];
    bool s_ready = false;  // sn holds S of tile j0 (computed during the previous iteration)
    int it = 0;
    for (int j0 = tile_lo; j0 < kv_hi; j0 += kKT, ++it) {
      const int c0 = it % 3, c1 = (it + 1) % 3, c2 = (it + 2) % 3;
      const bool has1 = j0 + kKT < kv_hi, has2 = j0 + 2 * kKT < kv_hi;
      cp_async_wait<0>();  // own copies of tile i+1
      if constexpr (DT != kBf16) {
        if (has1) convert((it + 1) & 1, sKV + c1 * 2 * kTileBytes);  // stage c1 held tile i-2: free
      }
      fence_proxy_async();
      __syncthreads();  // tiles i, i+1 visible; everyone is done with tile i-1 (stage c2)
      if (has2) issue(j0 + 2 * kKT, DT == kBf16 ? c2 : (it & 1));
      if (!sees(j0)) { s_ready = false; continue; }
      const uint32_t t0 = smem_u32(sKV + c0 * 2 * kTileBytes), t1 = smem_u32(sKV + c1 * 2 * kTileBytes);
      if (s_ready) {
#pragma unroll
        for (int i = 0; i < KT / 2; ++i) s[i] = sn[i];
      } else {
        qk_tile<DT, KT>(s, qa, kBM * 128, t0);
      }
      const bool see1 = has1 && sees(j0 + kKT);
      if (see1) qk_issue<DT, KT>(sn, qa, kBM * 128, t1);  // in flight during the softmax
      softmax(s, j0);
      uint32_t pa[KT / 16][4];
      pack_p(s, pa);
      pv_issue<DT, KT>(o, pa, t0 + kTileBytes);
      wgmma_wait0();  // S(i+1) and O
      reg_fence(o);
      reg_fence(sn);
      s_ready = see1;
    }
  }

  const float vs = DT == kBf16 ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
  store_o_rows<kD>(p, q0 + qi0, h, t, l, qvalid, vs, [&](int i, int rr, int e) { return o[4 * i + rr * 2 + e]; });
}

template <int DT, int KT, int NWG, bool PIPE, int NST>
void launch_wgmma_t(const WgParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = wg_smem<KT, NWG, PIPE, NST>();
  // Per device, not per process: TP ranks are threads on different GPUs.
  detail::set_func_attribute_once(prefill_wgmma_kernel<DT, KT, NWG, PIPE, NST>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  prefill_wgmma_kernel<DT, KT, NWG, PIPE, NST><<<grid, NWG * 128, smem, stream>>>(p);
  FP8KV_CUDA_CHECK(cudaGetLastError());
}

// ---- warp-specialized kernel (FP8KV_WGMMA_CFG = ws, ws64, wsp, ws64p) ------
// 384 threads: warpgroup 0 is the producer (setmaxnreg 40): it gathers K/V
// tiles through the block table with cp.async into an NS-stage ring of
// 16-bit swizzled tiles (fp8: into a 2-stage staging ring, then converts its
// own chunks to f16 in the ring stage) and signals full[stage] (mbarrier,
// 128 arrivals, after cp.async wait + fence.proxy.async). Warpgroups 1 and 2
// are consumers (setmaxnreg 232), 64 query rows each: per tile, S(i) = Q K(i)^T
// and O += P(i-1) V(i-1) are issued together, the softmax of tile i runs
// while P V is on the tensor cores (intra-warpgroup overlap), then the stage
// of tile i-1 is released (empty[stage], 256 arrivals). PP (ping-pong): named
// barriers order the two consumers' MMA issue, so one warpgroup's softmax
// overlaps the other's MMAs. Both consumers process every tile of the CTA's
// key range (a tile that a row cannot see is masked to p = 0 exactly), so
// their barrier counts match. Softmax: exp2 by ex2.approx.ftz with the score
// scale folded into one FFMA; softcap and masking branch per tile.
constexpr int kWsProducerRegs = 40, kWsConsumerRegs = 232;  // 40*128 + 232*256 = 168*384
// PF / PERS: the producer keeps block ids and the work item in registers.
constexpr int kWsProducerRegsPf = 56, kWsConsumerRegsPf = 224;  // 56*128 + 224*256 = 168*384
template <int DT, int KT>
__host__ __device__ constexpr int ws_stages() { return KT == 128 ? (DT == kBf16 ? 3 : 2) : 4; }
template <int DT, int KT>
__host__ __device__ constexpr int ws_smem() {
  return 1024 + 128 * kD * 2 + ws_stages<DT, KT>() * 2 * tile_bytes<KT>() + (DT == kBf16 ? 0 : 2 * 2 * raw_bytes<KT>()) +
         4 * 4 * 8;
}
static_assert(ws_smem<kBf16, 128>() <= 227 * 1024 && ws_smem<kE4m3, 128>() <= 227 * 1024 &&
                  ws_smem<kBf16, 64>() <= 227 * 1024 && ws_smem<kE4m3, 64>() <= 227 * 1024,
              "ws shared memory");

// PF (wsf, wsl): the producer loads the block ids (one per 16-key group) of
// tile i + 1 into registers right after issuing tile i's copies, so no
// block-table load sits between the copies of consecutive tiles; the
// consumers load Q with 16-byte loads, all of a thread's chunks in flight
// (the scalar path issues 8 dependent rounds of 2-byte loads). Registers
// 56 (producer) / 224 (consumers).
// PERS (wsl): persistent grid, one CTA per SM walks work items (head, query
// tile, sequence) ordered heads fastest, then sequences, then query tiles
// from the last (longest) one; CTA c takes item r G + c in even rounds r and
// r G + G - 1 - c in odd ones (G CTAs), so the per-CTA sums of the linearly
// shrinking causal items balance over each pair of rounds. The mbarrier ring
// runs on across items (tile counters continue), so the producer gathers the
// next item's first tiles while the consumers finish the current one.
template <int DT, int KT, bool PP, bool PF = false, bool PERS = false, bool LC = false>
__global__ void __launch_bounds__(384, 1) prefill_ws_kernel(const WgParams p) {
  constexpr int EB = DT == kBf16 ? 2 : 1;
  constexpr int kBM = 128;
  constexpr int NS = ws_stages<DT, KT>();
  constexpr int kTileBytes = tile_bytes<KT>();
  constexpr int kRawBytes = raw_bytes<KT>();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align1024(smem_raw);
  uint8_t* sQ = smem;
  uint8_t* sKV = smem + kBM * kD * 2;           // stage s: K at + s * 2 * kTileBytes, V at + kTileBytes
  uint8_t* sRaw = sKV + NS * 2 * kTileBytes;    // fp8 staging r: K at + r * 2 * kRawBytes, V at + kRawBytes
  const uint32_t bar0 = smem_u32(sRaw + (DT == kBf16 ? 0 : 2 * 2 * kRawBytes));
  // bf16: full / empty per stage (the whole K+V tile). fp8 (kSplit): K and
  // V halves of a stage have their own barriers (full = fullK, empty =
  // emptyK), so a stage's K is released right after its QK and the producer
  // can convert the next K while the consumers still read the V of tile i-1.
  constexpr bool kSplit = DT != kBf16;
  auto full = [&](int s) { return bar0 + 8 * s; };
  auto empty = [&](int s) { return bar0 + 8 * (NS + s); };
  auto full_v = [&](int s) { return bar0 + 8 * (2 * NS + s); };
  auto empty_v = [&](int s) { return bar0 + 8 * (3 * NS + s); };

  const int tid = threadIdx.x;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      mbar_init(full(s), 128);
      mbar_init(empty(s), 256);
      mbar_init(full_v(s), 128);
      mbar_init(empty_v(s), 256);
    }
  }
  __syncthreads();

  // One work item: query tile qtile (128 rows) of head h of sequence b.
  struct Item {
    int h, qtile, b, q0, nq, pos0, kvh, kv_lo, kv_hi, tile_lo, ntiles;
  };
  [[maybe_unused]] const int num_items = PERS ? p.num_heads * p.batch * p.num_q_tiles : 1;
  // Item of round r (false past the end); w.ntiles == 0: an empty item.
  auto item = [&](int r, Item& w) {
    if constexpr (PERS) {
      const int G = gridDim.x, c = blockIdx.x;
      const int k = r * G + ((r & 1) ? G - 1 - c : c);
      if (k >= num_items) return false;
      w.h = k % p.num_heads;
      const int rest = k / p.num_heads;
      w.b = rest % p.batch;
      w.qtile = p.num_q_tiles - 1 - rest / p.batch;  // longest (latest) tiles first
    } else {
      if (r > 0) return false;
      w.h = blockIdx.x;
      w.qtile = p.num_q_tiles - 1 - static_cast<int>(blockIdx.y);  // longest (latest) tiles first
      w.b = blockIdx.z;
    }
    w.q0 = p.q_start[w.b];
    w.nq = p.q_start[w.b + 1] - w.q0;
    w.ntiles = 0;
    if (w.qtile * kBM >= w.nq) return true;
    w.pos0 = p.context_lens[w.b] - w.nq;
    w.kvh = w.h / p.group;
    const int cta_first_q = w.pos0 + w.qtile * kBM;
    const int cta_last_q = w.pos0 + min(w.nq, (w.qtile + 1) * kBM) - 1;
    w.kv_lo = p.window > 0 ? max(0, cta_first_q - p.window + 1) : 0;
    w.kv_hi = cta_last_q + 1;
    w.tile_lo = w.kv_lo / KT * KT;
    w.ntiles = (w.kv_hi - w.tile_lo + KT - 1) / KT;
    return true;
  };

  if (tid < 128) {
    // ---- producer ----
    setmaxnreg_dec<PF || PERS ? kWsProducerRegsPf : kWsProducerRegs>();
    int gbase = 0;  // ring position: tiles of the earlier items
    Item w;
    for (int r = 0; item(r, w); ++r) {
      if (w.ntiles == 0) continue;
      const PageMap pm(p, w.b, w.kvh, kD, EB);
      // PF: block ids of this thread's 16-key groups of a tile (0 for a
      // group outside [kv_lo, kv_hi): never used).
      constexpr int NG = DT == kBf16 ? KT / 16 : KT / 32;
      auto group_of = [&](int gi) { return DT == kBf16 ? gi : (tid >> 6) + 2 * gi; };
      auto load_ids = [&](int it, int32_t(&ids)[NG]) {
        const int j0 = w.tile_lo + it * KT;
#pragma unroll
        for (int gi = 0; gi < NG; ++gi) {
          const int jg = j0 + 16 * group_of(gi);
          ids[gi] = jg < w.kv_hi && jg + 16 > w.kv_lo ? pm.bt[pm.block_of(jg)] : 0;
        }
      };
      int32_t ids[NG];
      if constexpr (PF) load_ids(0, ids);
      if constexpr (DT == kBf16) {
        auto issue = [&](int it) {
          const int j0 = w.tile_lo + it * KT;
          const uint32_t dk = smem_u32(sKV + ((gbase + it) % NS) * 2 * kTileBytes), dv = dk + kTileBytes;
          // Keys j and j + 8 per step: j % 16 < 8 (j0 is a multiple of 16), so
          // both sit in one page (pages are multiples of 16 tokens): one
          // block-table lookup for two keys.
#pragma unroll PF ? 8 : 4
          for (int i = 0; i < KT * 16 / 128; i += 2) {
            const int c = tid + i * 128, key = c / 16, ch = c % 16, j = j0 + key;
            const bool ok0 = j >= w.kv_lo && j < w.kv_hi, ok1 = j + 8 >= w.kv_lo && j + 8 < w.kv_hi;
            int64_t off = 0;
            if (ok0 || ok1) off = (PF ? pm.slot_off_in(ids[i / 2], j) : pm.slot_off(j)) + ch * 16;
            const int64_t off0 = ok0 ? off : 0, off1 = ok1 ? off + 8 * pm.row_bytes : 0;
            cp_async16(dk + swz_chunk(KT, key, ch), p.k_cache + off0, ok0);
            cp_async16(dv + swz_chunk(KT, key, ch), p.v_cache + off0, ok0);
            cp_async16(dk + swz_chunk(KT, key + 8, ch), p.k_cache + off1, ok1);
            cp_async16(dv + swz_chunk(KT, key + 8, ch), p.v_cache + off1, ok1);
          }
          cp_async_commit();
          if constexpr (PF) {
            if (it + 1 < w.ntiles) load_ids(it + 1, ids);
          }
        };
        // Tiles NS - 1 ahead; tile it + NS - 1 reuses the stage of tile it - 1
        // (the first use of a stage waits on a fresh barrier: returns at once).
#pragma unroll
        for (int k = 0; k < NS - 1; ++k) {
          if (k < w.ntiles) {
            mbar_wait(empty((gbase + k) % NS), (((gbase + k) / NS) & 1) ^ 1);
            issue(k);
          } else {
            cp_async_commit();
          }
        }
        for (int it = 0; it < w.ntiles; ++it) {
          cp_async_wait<NS - 2>();  // this thread's copies of tile it
          fence_proxy_async();
          mbar_arrive(full((gbase + it) % NS));
          const int nx = it + NS - 1;
          if (nx < w.ntiles) {
            mbar_wait(empty((gbase + nx) % NS), (((gbase + nx) / NS) & 1) ^ 1);
            issue(nx);
          } else {
            cp_async_commit();
          }
        }
      } else {
        auto issue_raw = [&](int it) {
          const int j0 = w.tile_lo + it * KT;
          const uint32_t dk = smem_u32(sRaw + ((gbase + it) & 1) * 2 * kRawBytes), dv = dk + kRawBytes;
          // As for bf16: keys key and key + 8 share one 16-key group, so one
          // page and one block-table lookup. The conversion below walks the
          // same (key, chunk) pairs, so a thread converts only its own copies.
#pragma unroll PF ? 4 : 2
          for (int i = 0; i < KT * 4 / 128; ++i) {
            const int c = tid + i * 128, q = c / 8, ch = c % 8, key = (q >> 3) * 16 + (q & 7), j = j0 + key;
            const bool ok0 = j >= w.kv_lo && j < w.kv_hi, ok1 = j + 8 >= w.kv_lo && j + 8 < w.kv_hi;
            int64_t off = 0;
            if (ok0 || ok1) off = (PF ? pm.slot_off_in(ids[i], j) : pm.slot_off(j)) + ch * 16;
            const int64_t off0 = ok0 ? off : 0, off1 = ok1 ? off + 8 * pm.row_bytes : 0;
            cp_async16(dk + key * 128 + ch * 16, p.k_cache + off0, ok0);
            cp_async16(dv + key * 128 + ch * 16, p.v_cache + off0, ok0);
            cp_async16(dk + (key + 8) * 128 + ch * 16, p.k_cache + off1, ok1);
            cp_async16(dv + (key + 8) * 128 + ch * 16, p.v_cache + off1, ok1);
          }
          cp_async_commit();
          if constexpr (PF) {
            if (it + 1 < w.ntiles) load_ids(it + 1, ids);
          }
        };
        issue_raw(0);
        for (int it = 0; it < w.ntiles; ++it) {
          if (it + 1 < w.ntiles) issue_raw(it + 1);  // its staging held tile it - 1, converted by this thread
          else cp_async_commit();
          cp_async_wait<1>();  // this thread's copies of tile it
          const int g = gbase + it, st = g % NS;
          const uint8_t* rk = sRaw + (g & 1) * 2 * kRawBytes;
          uint8_t* dst = sKV + st * 2 * kTileBytes;
          // K half (once K of tile it - NS is released), then the V half.
#pragma unroll 1
          for (int kv = 0; kv < 2; ++kv) {
            mbar_wait(kv == 0 ? empty(st) : empty_v(st), ((g / NS) & 1) ^ 1);
            if constexpr (LC) {
              // LC (wslc): the same chunks, addressed as per-thread bases plus
              // compile-time offsets. Chunk i of this thread is key key0 + dk
              // (dk = 32 (i / 2) + 8 (i % 2), a multiple of 8, so the swizzle's
              // key % 8 is key0's), channel tid % 8 as in the copy: the else branch
              // recomputes the same addresses with ~25 integer instructions per
              // chunk and one LDS in flight (run K1 of the eighth session).
              const int key0 = (tid >> 6) * 16 + ((tid >> 3) & 7), ch = tid & 7;
              const uint8_t* rsrc = rk + kv * kRawBytes + key0 * 128 + ch * 16;
              uint8_t* d = dst + kv * kTileBytes;
              uint8_t* d0 = d + swz_chunk(KT, key0, 2 * ch);
              uint8_t* d1 = d + swz_chunk(KT, key0, 2 * ch + 1);
#pragma unroll
              for (int i = 0; i < KT * 8 / 128; ++i) {
                const int dk = 32 * (i >> 1) + 8 * (i & 1);
                const uint4 w4 = *reinterpret_cast<const uint4*>(rsrc + dk * 128);
                const uint32_t wd[4] = {w4.x, w4.y, w4.z, w4.w};
                uint32_t hw[8];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  hw[2 * e] = fp8x2_to_f16x2<DT>(wd[e]);
                  hw[2 * e + 1] = fp8x2_to_f16x2<DT>(wd[e] >> 16);
                }
                *reinterpret_cast<uint4*>(d0 + dk * 128) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
                *reinterpret_cast<uint4*>(d1 + dk * 128) = make_uint4(hw[4], hw[5], hw[6], hw[7]);
              }
            } else {
#pragma unroll 2
              for (int i = 0; i < KT * 8 / 128; ++i) {
                const int c = tid + (i >> 1) * 128, q = c / 8, ch = c % 8, key = (q >> 3) * 16 + (q & 7) + (i & 1) * 8;
                const uint4 w4 = *reinterpret_cast<const uint4*>(rk + kv * kRawBytes + key * 128 + ch * 16);
                const uint32_t wd[4] = {w4.x, w4.y, w4.z, w4.w};
                uint32_t hw[8];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  hw[2 * e] = fp8x2_to_f16x2<DT>(wd[e]);
                  hw[2 * e + 1] = fp8x2_to_f16x2<DT>(wd[e] >> 16);
                }
                uint8_t* d = dst + kv * kTileBytes;
                *reinterpret_cast<uint4*>(d + swz_chunk(KT, key, 2 * ch)) = make_uint4(hw[0], hw[1], hw[2], hw[3]);
                *reinterpret_cast<uint4*>(d + swz_chunk(KT, key, 2 * ch + 1)) = make_uint4(hw[4], hw[5], hw[6], hw[7]);
              }
            }
            fence_proxy_async();
            mbar_arrive(kv == 0 ? full(st) : full_v(st));
          }
        }
      }
      gbase += w.ntiles;
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<PF || PERS ? kWsConsumerRegsPf : kWsConsumerRegs>();
  const int ct = tid - 128, cw = ct >> 7, lane = ct & 31, wwarp = (ct >> 5) & 3, g = lane >> 2, t = lane & 3;
  const bool softcap = p.softcap > 0.0f;
  auto turn_begin = [&]() { if constexpr (PP) named_bar_sync(3 + cw, 256); };
  auto turn_end = [&]() { if constexpr (PP) named_bar_arrive(3 + (cw ^ 1), 256); };
  if constexpr (PP) {
    if (cw == 1) named_bar_arrive(3, 256);  // consumer 0 issues first
  }
  const uint32_t qa = smem_u32(sQ) + cw * 64 * 128;
  auto ktile = [&](int gi) { return smem_u32(sKV + (gi % NS) * 2 * kTileBytes); };
  auto pack_p = [&](float (&s)[KT / 2], uint32_t (&pa)[KT / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < KT / 16; ++kk) {
      pa[kk][0] = pack2<DT>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack2<DT>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack2<DT>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack2<DT>(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };

  int gbase = 0;
  Item w;
  for (int r = 0; item(r, w); ++r) {
    if (w.ntiles == 0) continue;
    // Q rows cw * 64 .. + 63 -> shared memory (swizzled, MMA type), rows past
    // nq zero. (This warpgroup's MMAs of the previous item have completed.)
    // PF: 16-byte loads, all 8 chunks of a thread in flight at once (the
    // same values as the scalar path: bf16 -> float -> MMA type).
    constexpr int kQIt = 64 * (kD / 8) / 128;
    auto q_chunk = [&](int k, int& row, int& ch, int64_t& off) {
      const int c = (ct & 127) + k * 128;
      row = cw * 64 + c / (kD / 8);
      ch = c % (kD / 8);
      const int qi = w.qtile * kBM + row;
      off = qi < w.nq ? (static_cast<int64_t>(w.q0 + qi) * p.num_heads + w.h) * kD + ch * 8 : -1;
    };
    if ((PF || PERS) && (reinterpret_cast<uintptr_t>(p.q) & 15) == 0 && p.q_bf16) {
      uint4 raw[kQIt];
#pragma unroll
      for (int k = 0; k < kQIt; ++k) {
        int row, ch;
        int64_t off;
        q_chunk(k, row, ch, off);
        raw[k] = off >= 0 ? __ldg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.q) + off))
                          : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int k = 0; k < kQIt; ++k) {
        int row, ch;
        int64_t off;
        q_chunk(k, row, ch, off);
        uint4 v = raw[k];
        if constexpr (DT != kBf16) {
          uint32_t* u = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[e]));
            u[e] = pack2<DT>(f.x, f.y);
          }
        }
        *reinterpret_cast<uint4*>(sQ + swz_chunk(kBM, row, ch)) = v;
      }
    } else if ((PF || PERS) && (reinterpret_cast<uintptr_t>(p.q) & 15) == 0) {
      float4 raw[kQIt][2];
#pragma unroll
      for (int k = 0; k < kQIt; ++k) {
        int row, ch;
        int64_t off;
        q_chunk(k, row, ch, off);
        const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + (off >= 0 ? off : 0));
        raw[k][0] = off >= 0 ? __ldg(src) : make_float4(0, 0, 0, 0);
        raw[k][1] = off >= 0 ? __ldg(src + 1) : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int k = 0; k < kQIt; ++k) {
        int row, ch;
        int64_t off;
        q_chunk(k, row, ch, off);
        *reinterpret_cast<uint4*>(sQ + swz_chunk(kBM, row, ch)) =
            make_uint4(pack2<DT>(raw[k][0].x, raw[k][0].y), pack2<DT>(raw[k][0].z, raw[k][0].w),
                       pack2<DT>(raw[k][1].x, raw[k][1].y), pack2<DT>(raw[k][1].z, raw[k][1].w));
      }
    } else {
      for (int c = ct & 127; c < 64 * (kD / 8); c += 128) {
        const int row = cw * 64 + c / (kD / 8), ch = c % (kD / 8), qi = w.qtile * kBM + row;
        uint32_t wq[4] = {0, 0, 0, 0};
        if (qi < w.nq) {
          const int64_t off = (static_cast<int64_t>(w.q0 + qi) * p.num_heads + w.h) * kD + ch * 8;
#pragma unroll
          for (int e = 0; e < 4; ++e)
            wq[e] = pack2<DT>(load_act(p.q, off + 2 * e, p.q_bf16), load_act(p.q, off + 2 * e + 1, p.q_bf16));
        }
        *reinterpret_cast<uint4*>(sQ + swz_chunk(kBM, row, ch)) = make_uint4(wq[0], wq[1], wq[2], wq[3]);
      }
    }
    fence_proxy_async();
    named_bar_sync(1 + cw, 128);

    const int r0 = cw * 64 + wwarp * 16 + g;
    const int qi0 = w.qtile * kBM + r0;
    const int qpos[2] = {w.pos0 + qi0, w.pos0 + qi0 + 8};
    const bool qvalid[2] = {qi0 < w.nq, qi0 + 8 < w.nq};
    const float ks_ = DT == kBf16 ? 1.0f : p.k_scale[p.k_scale_count == 1 ? 0 : w.kvh];
    const float score_mul = softcap ? p.softmax_scale * ks_ / p.softcap : p.softmax_scale * ks_ * kLog2e;
    const int kv_lo = w.kv_lo;

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    // Scale, mask, online softmax of tile j0 (probabilities left in s; o is
    // not touched: alpha returns the rescale factors).
    auto softmax = [&](float (&s)[KT / 2], int j0, float (&alpha)[2]) {
      float mul = score_mul;
      if (softcap) {
#pragma unroll
        for (int i = 0; i < KT / 2; ++i) s[i] = p.softcap * tanhf(s[i] * score_mul) * kLog2e;
        mul = 1.0f;
      }
      const bool full_tile = j0 >= kv_lo && j0 + KT - 1 <= qpos[0] && (p.window == 0 || qpos[1] - j0 < p.window) &&
                             qvalid[1];
      if (!full_tile) {
#pragma unroll
        for (int n = 0; n < KT / 8; ++n)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = j0 + n * 8 + 2 * t + e;
              const bool vis = j >= kv_lo && j <= qpos[rr] && (p.window == 0 || qpos[rr] - j < p.window);
              if (!vis) s[4 * n + rr * 2 + e] = -INFINITY;
            }
      }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < KT / 8; ++n) mx = fmaxf(mx, fmaxf(s[4 * n + rr * 2], s[4 * n + rr * 2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[rr], mx * mul);
        const float mref = m_new == -INFINITY ? 0.0f : m_new;
        alpha[rr] = ex2_approx(m[rr] - mref);
        m[rr] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < KT / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = ex2_approx(fmaf(s[4 * n + rr * 2 + e], mul, -mref));
            s[4 * n + rr * 2 + e] = pe;
            sum += pe;
          }
        l[rr] = l[rr] * alpha[rr] + sum;
      }
    };

    const int ntiles = w.ntiles, g0 = gbase;
    float s[KT / 2];
    uint32_t pa[KT / 16][4];
    float alpha[2];
    mbar_wait(full(g0 % NS), (g0 / NS) & 1);
    turn_begin();
    qk_issue<DT, KT>(s, qa, kBM * 128, ktile(g0));
    turn_end();
    wgmma_wait<0>();
    reg_fence(s);
    if constexpr (kSplit) mbar_arrive(empty(g0 % NS));
    softmax(s, w.tile_lo, alpha);
    pack_p(s, pa);
    for (int it = 1; it < ntiles; ++it) {
      const int gi = g0 + it;
      mbar_wait(full(gi % NS), (gi / NS) & 1);
      if constexpr (kSplit) mbar_wait(full_v((gi - 1) % NS), ((gi - 1) / NS) & 1);
      turn_begin();
      qk_issue<DT, KT, false>(s, qa, kBM * 128, ktile(gi));
      pv_issue<DT, KT>(o, pa, ktile(gi - 1) + kTileBytes);
      turn_end();
      wgmma_wait<1>();  // S(it); O += P V(it - 1) may still run
      reg_fence(s);
      if constexpr (kSplit) mbar_arrive(empty(gi % NS));  // K of tile it
      softmax(s, w.tile_lo + it * KT, alpha);
      wgmma_wait<0>();
      reg_fence(o);
      reg_fence(s);  // P(it) is packed over P(it - 1)'s registers only after the wait
      mbar_arrive(kSplit ? empty_v((gi - 1) % NS) : empty((gi - 1) % NS));
#pragma unroll
      for (int i = 0; i < kD / 8; ++i) {
        o[4 * i] *= alpha[0];
        o[4 * i + 1] *= alpha[0];
        o[4 * i + 2] *= alpha[1];
        o[4 * i + 3] *= alpha[1];
      }
      pack_p(s, pa);
    }
    const int gl = g0 + ntiles - 1;
    if constexpr (kSplit) mbar_wait(full_v(gl % NS), (gl / NS) & 1);
    turn_begin();
    pv_issue<DT, KT>(o, pa, ktile(gl) + kTileBytes);
    turn_end();
    wgmma_wait<0>();
    reg_fence(o);
    if constexpr (PERS) mbar_arrive(kSplit ? empty_v(gl % NS) : empty(gl % NS));  // the ring runs on

    const float vs = DT == kBf16 ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : w.kvh];
    store_o_rows<kD>(p, w.q0 + qi0, w.h, t, l, qvalid, vs, [&](int i, int rr, int e) { return o[4 * i + rr * 2 + e]; });
    gbase += ntiles;
  }
  // PP: the turns alternate across work items (both consumers take the same
  // number per item); absorb consumer 1's last turn_end (or its initial
  // arrive when this CTA had no tiles) once, at the end.
  if constexpr (PP) {
    if (cw == 0) named_bar_sync(3, 256);
  }
}

template <int DT, int KT, bool PP, bool PF = false, bool PERS = false, bool LC = false>
void launch_ws_t(const WgParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = ws_smem<DT, KT>();
  auto* kern = prefill_ws_kernel<DT, KT, PP, PF, PERS, LC>;
  detail::set_func_attribute_once(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kern<<<grid, 384, smem, stream>>>(p);
  FP8KV_CUDA_CHECK(cudaGetLastError());
}
template <int KT, bool PP, bool PF = false, bool PERS = false, bool LC = false>
void launch_ws(const WgParams& p, KvDtype dt, dim3 grid, cudaStream_t stream) {
  switch (dt) {
    // bf16 + PERS: no PF (its 8 block ids per tile would spill next to the work item);
    // LC is the fp8 producer's addressing (bf16 has no conversion).
    case KvDtype::bf16: launch_ws_t<kBf16, KT, PP, PF && !PERS, PERS>(p, grid, stream); break;
    case KvDtype::fp8_e4m3: launch_ws_t<kE4m3, KT, PP, PF, PERS, LC>(p, grid, stream); break;
    case KvDtype::fp8_e5m2: launch_ws_t<kE5m2, KT, PP, PF, PERS, LC>(p, grid, stream); break;
  }
}

// ---- building-block self-tests ----------------------------------------------

constexpr int kTestSmem = 1024 + 2 * kKTest * kD * 2;

template <int DT>
__global__ void __launch_bounds__(128) selftest_qk_kernel(const uint16_t* q, const uint16_t* k, float* s_out) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sQ = align1024(smem_raw);
  uint8_t* sK = sQ + 64 * kD * 2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  for (int c = tid; c < 64 * 16; c += 128) {
    const int row = c / 16, ch = c % 16;
    *reinterpret_cast<uint4*>(sQ + swz_chunk(64, row, ch)) = *reinterpret_cast<const uint4*>(q + row * kD + ch * 8);
    *reinterpret_cast<uint4*>(sK + swz_chunk(64, row, ch)) = *reinterpret_cast<const uint4*>(k + row * kD + ch * 8);
  }
  fence_proxy_async();
  __syncthreads();
  float s[32];
  qk_tile<DT, kKTest>(s, smem_u32(sQ), 64 * 128, smem_u32(sK));
#pragma unroll
  for (int n = 0; n < 8; ++n)
    for (int rr = 0; rr < 2; ++rr)
      for (int e = 0; e < 2; ++e) s_out[(warp * 16 + g + rr * 8) * 64 + n * 8 + 2 * t + e] = s[4 * n + rr * 2 + e];
}

template <int DT, bool kSwap>
__global__ void __launch_bounds__(128) selftest_pv_kernel(const uint16_t* pm, const uint16_t* v, float* o_out) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sV = align1024(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  for (int c = tid; c < 64 * 16; c += 128) {
    const int row = c / 16, ch = c % 16;
    *reinterpret_cast<uint4*>(sV + swz_chunk(64, row, ch)) = *reinterpret_cast<const uint4*>(v + row * kD + ch * 8);
  }
  fence_proxy_async();
  __syncthreads();
  const int r0 = warp * 16 + g;
  auto pair = [&](int r, int c) { return static_cast<uint32_t>(pm[r * 64 + c]) | (static_cast<uint32_t>(pm[r * 64 + c + 1]) << 16); };
  uint32_t pa[4][4];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = pair(r0, 16 * kk + 2 * t);
    pa[kk][1] = pair(r0 + 8, 16 * kk + 2 * t);
    pa[kk][2] = pair(r0, 16 * kk + 8 + 2 * t);
    pa[kk][3] = pair(r0 + 8, 16 * kk + 8 + 2 * t);
  }
  float o[64];
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  pv_tile<DT, kKTest, kSwap>(o, pa, smem_u32(sV));
#pragma unroll
  for (int i = 0; i < 16; ++i)
    for (int rr = 0; rr < 2; ++rr)
      for (int e = 0; e < 2; ++e) o_out[(r0 + rr * 8) * kD + i * 8 + 2 * t + e] = o[4 * i + rr * 2 + e];
}

template <class K>
std::vector<float> run_selftest(K kernel, const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, size_t out_n) {
  uint16_t *da = nullptr, *db = nullptr;
  float* dout = nullptr;
  std::vector<float> out(out_n);
  FP8KV_CUDA_CHECK(cudaMalloc(&da, a.size() * 2));
  FP8KV_CUDA_CHECK(cudaMalloc(&db, b.size() * 2));
  FP8KV_CUDA_CHECK(cudaMalloc(&dout, out_n * 4));
  FP8KV_CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  FP8KV_CUDA_CHECK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  FP8KV_CUDA_CHECK(cudaMemset(dout, 0xff, out_n * 4));
  kernel<<<1, 128, kTestSmem>>>(da, db, dout);
  FP8KV_CUDA_CHECK(cudaGetLastError());
  FP8KV_CUDA_CHECK(cudaDeviceSynchronize());
  FP8KV_CUDA_CHECK(cudaMemcpy(out.data(), dout, out_n * 4, cudaMemcpyDeviceToHost));
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  return out;
}

// FP8KV_WGMMA_CFG = wslc (the default since run L of the eighth session),
// wslp (default in run K1 of the eighth session: wsl with ping-pong for the
// bf16 cache; docs/cuda.md "Prefill v4"), wsl (the
// default from run K1 of the seventh session: wsf on a persistent grid;
// docs/cuda.md "Prefill v3"), ws (warp-specialized, 128-key tiles; default in
// runs I-J, docs/cuda.md "Prefill v2"), wsp, ws64, ws64p, wsf (ws + block ids
// prefetched a tile ahead, 16-byte Q loads), wslc (wslp whose fp8 producer
// converts with constant-offset addressing), or the
// earlier 64x2, 128x2,
// 64x1, 64x2p, 64x2d (read per call: the GPU script tests and benchmarks each).
struct WgCfg {
  int kt, nwg;
  bool pipe;
  int nst;
  bool ws = false, pp = false, pf = false, pers = false, bf16pp = false, lc = false;
};
WgCfg wgmma_config() {
  const char* env = std::getenv("FP8KV_WGMMA_CFG");
  // Unset: wslc = wslp (wsl, bf16 with ping-pong) whose fp8 producer converts
  // with constant-offset addressing. Since run L of the eighth session
  // (2026-12-01): fp8 e4m3 382.7 / 382.1 TFLOP/s vs wslp 358.0 / 354.5 and
  // wsl 354.7 / 356.2 in the same run (+7%), bf16 = wslp's kernel; prefill
  // tests pass under it (full and 7-CTA grid); docs/cuda.md "Prefill v4".
  if (!env || !*env) return {128, 2, false, 0, true, false, true, true, true, true};
  const std::string v(env);
  if (v == "64x2") return {64, 2, false, 2};
  if (v == "128x2") return {128, 2, false, 2};
  if (v == "64x1") return {64, 1, false, 2};
  if (v == "64x2p") return {64, 2, true, 2};
  if (v == "64x2d") return {64, 2, false, 4};
  if (v == "ws") return {128, 2, false, 0, true, false};
  if (v == "wsp") return {128, 2, false, 0, true, true};
  if (v == "ws64") return {64, 2, false, 0, true, false};
  if (v == "ws64p") return {64, 2, false, 0, true, true};
  if (v == "wsf") return {128, 2, false, 0, true, false, true, false};
  if (v == "wsl") return {128, 2, false, 0, true, false, true, true};
  if (v == "wslp") return {128, 2, false, 0, true, false, true, true, true};
  if (v == "wslc") return {128, 2, false, 0, true, false, true, true, true, true};
  throw std::invalid_argument(
      "FP8KV_WGMMA_CFG: expected 64x2, 128x2, 64x1, 64x2p, 64x2d, ws, wsp, ws64, ws64p, wsf, wsl, wslp or wslc (wsk and wskp were removed in the ninth session), got '" +
      v + "'");
}

template <int KT, int NWG, bool PIPE, int NST = 2>
void launch_wgmma(const WgParams& p, KvDtype dt, dim3 grid, cudaStream_t stream) {
  switch (dt) {
    case KvDtype::bf16: launch_wgmma_t<kBf16, KT, NWG, PIPE, NST>(p, grid, stream); break;
    case KvDtype::fp8_e4m3: launch_wgmma_t<kE4m3, KT, NWG, PIPE, NST>(p, grid, stream); break;
    case KvDtype::fp8_e5m2: launch_wgmma_t<kE5m2, KT, NWG, PIPE, NST>(p, grid, stream); break;
  }
}

}  // namespace

bool prefill_wgmma_supports(const PrefillArgs& a) { return a.kv.layout.head_dim == kD; }

void paged_prefill_wgmma(const PrefillArgs& a, cudaStream_t stream) {
  if (!prefill_wgmma_supports(a))
    throw std::invalid_argument("paged_prefill_wgmma: head_dim must be 128, got " + std::to_string(a.kv.layout.head_dim));
  WgParams p{};
  fill_paged_params(p, a);
  p.q_start = a.q_start;
  const WgCfg cfg = wgmma_config();
  const int bm = cfg.nwg * 64;
  p.num_q_tiles = (a.max_query_len + bm - 1) / bm;
  if (p.num_q_tiles > 65535) throw std::invalid_argument("paged_prefill_wgmma: max_query_len too large");
  // Heads fastest: the CTAs of one query tile across all heads run together
  // and share K/V in L2 (GQA groups read the same KV head).
  const dim3 grid(a.num_heads, p.num_q_tiles, a.batch);
  p.batch = a.batch;
  if (cfg.ws && cfg.pers) {
    // One CTA per SM (225 KB of shared memory each), at most one per item.
    int dev = 0, sms = 0;
    FP8KV_CUDA_CHECK(cudaGetDevice(&dev));
    FP8KV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // FP8KV_WGMMA_GRID (tests): at most this many CTAs, so that each walks many items.
    if (const char* env = std::getenv("FP8KV_WGMMA_GRID"); env && *env) {
      char* end = nullptr;
      const long v = std::strtol(env, &end, 10);
      if (*end != '\0' || v < 1 || v > 1 << 20)
        throw std::invalid_argument(std::string("FP8KV_WGMMA_GRID: expected a CTA count >= 1, got '") + env + "'");
      sms = std::min<int>(sms, static_cast<int>(v));
    }
    const int64_t items = static_cast<int64_t>(a.num_heads) * p.num_q_tiles * a.batch;
    const dim3 pgrid(static_cast<unsigned>(std::min<int64_t>(items, sms)));
    // wslp / wslc for a bf16 cache: wsl + ping-pong (bf16 + PERS: no PF, as in
    // launch_ws; called directly so that no fp8 ping-pong kernel is built).
    if (cfg.bf16pp && a.kv.layout.dtype == KvDtype::bf16)
      launch_ws_t<kBf16, 128, true, false, true>(p, pgrid, stream);
    else if (cfg.lc) launch_ws<128, false, true, true, true>(p, a.kv.layout.dtype, pgrid, stream);
    else launch_ws<128, false, true, true>(p, a.kv.layout.dtype, pgrid, stream);
  } else if (cfg.ws && cfg.pf) {
    launch_ws<128, false, true, false>(p, a.kv.layout.dtype, grid, stream);
  } else if (cfg.ws) {
    if (cfg.kt == 128) cfg.pp ? launch_ws<128, true>(p, a.kv.layout.dtype, grid, stream)
                              : launch_ws<128, false>(p, a.kv.layout.dtype, grid, stream);
    else cfg.pp ? launch_ws<64, true>(p, a.kv.layout.dtype, grid, stream)
                : launch_ws<64, false>(p, a.kv.layout.dtype, grid, stream);
  } else if (cfg.kt == 128) launch_wgmma<128, 2, false>(p, a.kv.layout.dtype, grid, stream);
  else if (cfg.nwg == 1) launch_wgmma<64, 1, false>(p, a.kv.layout.dtype, grid, stream);
  else if (cfg.pipe) launch_wgmma<64, 2, true>(p, a.kv.layout.dtype, grid, stream);
  else if (cfg.nst == 4) launch_wgmma<64, 2, false, 4>(p, a.kv.layout.dtype, grid, stream);
  else launch_wgmma<64, 2, false>(p, a.kv.layout.dtype, grid, stream);
}

std::vector<float> wgmma_selftest_qk(const std::vector<uint16_t>& q, const std::vector<uint16_t>& k, bool dtype_f16) {
  if (q.size() != 64 * kD || k.size() != 64 * kD) throw std::invalid_argument("wgmma_selftest_qk: q, k must be 64 x 128");
  return dtype_f16 ? run_selftest(selftest_qk_kernel<kE4m3>, q, k, 64 * 64)
                   : run_selftest(selftest_qk_kernel<kBf16>, q, k, 64 * 64);
}

std::vector<float> wgmma_selftest_pv(const std::vector<uint16_t>& p, const std::vector<uint16_t>& v, bool dtype_f16,
                                     bool swap_offsets) {
  if (p.size() != 64 * 64 || v.size() != 64 * kD) throw std::invalid_argument("wgmma_selftest_pv: p 64 x 64, v 64 x 128");
  if (swap_offsets)
    return dtype_f16 ? run_selftest(selftest_pv_kernel<kE4m3, true>, p, v, 64 * kD)
                     : run_selftest(selftest_pv_kernel<kBf16, true>, p, v, 64 * kD);
  return dtype_f16 ? run_selftest(selftest_pv_kernel<kE4m3, false>, p, v, 64 * kD)
                   : run_selftest(selftest_pv_kernel<kBf16, false>, p, v, 64 * kD);
}

}  // namespace fp8kv::cuda
