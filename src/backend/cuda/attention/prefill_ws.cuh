// Building blocks of the warp-specialized wgmma prefill kernel
// (prefill_ws.cu, head_dim 128 and 256): its parameters, shared-memory layout,
// cp.async helpers and the two tensor-core steps S = Q K^T and O += P V.
#pragma once
#include <type_traits>

#include "backend/cuda/attention/prefill_common.cuh"
#include "backend/cuda/attention/wgmma.cuh"

namespace fp8kv::cuda::detail {

// The kernel's shape per (head dim, cache dtype). Q is kWsBM = 128 rows (2
// consumer warpgroups x 64); a K or V tile is KT keys of D 16-bit values,
// stored as D / 64 swizzled panels of KT rows x 128 bytes.
//   D = 128: KT = 128; stages bf16 3, fp8 2 (plus a 2-stage staging ring of
//            raw bytes).
//   D = 256: Q alone is 64 KB. bf16: KT = 64, 2 stages (193 KB). fp8: KT =
//            48 (a tile is 24 KB), 2 stages and the 2-stage staging ring
//            (209 KB; KT = 64 would need 257 KB).
constexpr int kWsBM = 128;  // queries per work item: 2 consumer warpgroups x 64 rows
template <int D, int DT>
struct WsShape {
  static_assert(D == 128 || D == 256, "prefill_ws_kernel: head_dim 128 or 256");
  static constexpr int KT = D == 128 ? 128 : (DT == kBf16 ? 64 : 48);  // keys per K/V tile
  static constexpr int NS = D == 128 && DT == kBf16 ? 3 : 2;           // ring stages of 16-bit K+V tiles
  static constexpr int kTileBytes = KT * D * 2;                        // one 16-bit K or V tile
  static constexpr int kRawBytes = KT * D;                             // one fp8 K or V tile (staging)
  static constexpr int kPthScaleBytes = 2 * 2 * KT * 4;                // [stage][K|V][KT] f32
  // Dynamic shared memory: 1024 (alignment of the swizzled tiles) + Q +
  // the ring + the fp8 staging ring + 4 x NS mbarriers (8 bytes each, 4 x 4
  // reserved). Per-token-head dtypes add the per-key scales of the 2
  // stages after the staging ring and two barriers; at D = 128, 227 KB hold
  // that only when the 128 bytes of barriers move into the alignment pad:
  // they sit there when the pad has 128 bytes, else before the scales (the
  // pad of an 8-byte-aligned base is at most 1016 bytes).
  static constexpr int smem() {
    if constexpr (dt_pth(DT)) return 1016 + kWsBM * D * 2 + NS * 2 * kTileBytes + 2 * 2 * kRawBytes + kPthScaleBytes;
    return 1024 + kWsBM * D * 2 + NS * 2 * kTileBytes + (DT == kBf16 ? 0 : 2 * 2 * kRawBytes) + 4 * 4 * 8;
  }
};
// Registers per thread after setmaxnreg: 56 * 128 + 224 * 256 = 168 * 384,
// the 384-thread CTA's budget at one CTA per SM.
constexpr int kWsProducerRegs = 56, kWsConsumerRegs = 224;
static_assert(WsShape<128, kBf16>::smem() <= 227 * 1024 && WsShape<128, kE4m3>::smem() <= 227 * 1024 &&
                  WsShape<128, kE4m3Pth>::smem() <= 227 * 1024 && WsShape<256, kBf16>::smem() <= 227 * 1024 &&
                  WsShape<256, kE4m3>::smem() <= 227 * 1024 && WsShape<256, kE4m3Pth>::smem() <= 227 * 1024,
              "ws shared memory");

struct WgParams : PagedKvParams {
  const int32_t* q_start;  // [batch + 1]: sequence b's queries are rows [q_start[b], q_start[b + 1])
  int num_q_tiles;         // ceil(max_query_len / kWsBM)
  int batch;
};
// The per-token-head kernels' (a derived struct: the others' parameters stay as they are).
struct WgPthParams : WgParams {
  const float* k_scale_pth;  // [num_blocks][block_size][num_kv_heads] f32
  const float* v_scale_pth;
};
template <int DT>
using WgParamsOf = std::conditional_t<dt_pth(DT), WgPthParams, WgParams>;

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return p + ((1024 - (smem_u32(p) & 1023)) & 1023);
}

// S(64 x KT keys) = Q(64 rows at qa, panel stride q_panel) K(KT keys at ka)^T,
// D / 16 x wgmma m64nKTk16 from shared memory (K-major). Issues and commits:
// s is in flight until a wgmma wait.
// kZero = false: s holds finite values already (the first wgmma ignores
// them: scale-d 0), so no zeroing instructions.
template <int D, int KT, int DT, bool kZero = true>
__device__ __forceinline__ void qk_issue(float (&s)[KT / 2], uint32_t qa, uint32_t q_panel, uint32_t ka) {
  if constexpr (kZero) {
#pragma unroll
    for (int i = 0; i < KT / 2; ++i) s[i] = 0.0f;
  }
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint64_t da = gmma_desc(qa + (ks / 4) * q_panel + (ks % 4) * 32, 16, 1024);
    const uint64_t db = gmma_desc(ka + (ks / 4) * (KT * 128) + (ks % 4) * 32, 16, 1024);
    if constexpr (KT == 128)
      wgmma_m64n128_ss<DT>(s, da, db, ks > 0 ? 1 : 0);
    else if constexpr (KT == 64)
      wgmma_m64n64_ss<DT>(s, da, db, ks > 0 ? 1 : 0);
    else
      wgmma_m64n48_ss<DT>(s, da, db, ks > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// O(64 x D) += P(64 x KT keys, registers: pa[kk] = keys 16kk..16kk+15)
// V(KT keys at va, N-major: D / 64 panels of KT rows): KT / 16 x wgmma
// m64nDk16. Issues and commits.
template <int D, int KT, int DT>
__device__ __forceinline__ void pv_issue(float (&o)[D / 2], uint32_t (&pa)[KT / 16][4], uint32_t va) {
  reg_fence(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KT / 16; ++kk) {
    const uint64_t db = gmma_desc(va + kk * 16 * 128, KT * 128, 1024);
    if constexpr (D == 128)
      wgmma_m64n128_rs_t<DT>(o, pa[kk], db, 1);
    else
      wgmma_m64n256_rs_t<DT>(o, pa[kk], db, 1);
  }
  wgmma_commit();
}

}  // namespace fp8kv::cuda::detail
