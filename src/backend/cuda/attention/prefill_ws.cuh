// Building blocks of the warp-specialized wgmma prefill kernel
// (prefill_ws.cu, head_dim 128): its parameters, shared-memory layout,
// cp.async helpers and the two tensor-core steps S = Q K^T and O += P V.
#pragma once
#include <type_traits>

#include "backend/cuda/attention/prefill_common.cuh"
#include "backend/cuda/attention/wgmma.cuh"

namespace fp8kv::cuda::detail {

constexpr int kWsD = 128;   // head dim
constexpr int kWsKT = 128;  // keys per K/V tile
constexpr int kWsBM = 128;  // queries per work item: 2 consumer warpgroups x 64 rows
constexpr int kWsTileBytes = kWsKT * kWsD * 2;  // one 16-bit K or V tile
constexpr int kWsRawBytes = kWsKT * kWsD;       // one fp8 K or V tile (staging)
// Registers per thread after setmaxnreg: 56 * 128 + 224 * 256 = 168 * 384,
// the 384-thread CTA's budget at one CTA per SM.
constexpr int kWsProducerRegs = 56, kWsConsumerRegs = 224;

// Ring stages of 16-bit K+V tiles: bf16 3, fp8 2 (fp8 also has a 2-stage
// staging ring of raw bytes).
template <int DT>
__host__ __device__ constexpr int ws_stages() { return DT == kBf16 ? 3 : 2; }
// Dynamic shared memory: 1024 (alignment of the swizzled tiles) + Q (128 rows)
// + the ring + the fp8 staging ring + 4 x NS mbarriers (8 bytes each, 4 x 4
// reserved).
// Per-token-head dtypes add the per-key scales of the 2 stages ([stage][K|V]
// [128] f32, 2 KB after the staging ring) and two barriers. 227 KB only hold
// that when the 128 bytes of barriers move into the alignment pad: they sit
// there when the pad has 128 bytes, else before the scales; the pad of an
// 8-byte-aligned base is at most 1016 bytes.
constexpr int kWsPthScaleBytes = 2 * 2 * kWsKT * 4;
template <int DT>
__host__ __device__ constexpr int ws_smem() {
  if constexpr (dt_pth(DT))
    return 1016 + kWsBM * kWsD * 2 + ws_stages<DT>() * 2 * kWsTileBytes + 2 * 2 * kWsRawBytes + kWsPthScaleBytes;
  return 1024 + kWsBM * kWsD * 2 + ws_stages<DT>() * 2 * kWsTileBytes + (DT == kBf16 ? 0 : 2 * 2 * kWsRawBytes) +
         4 * 4 * 8;
}
static_assert(ws_smem<kBf16>() <= 227 * 1024 && ws_smem<kE4m3>() <= 227 * 1024 && ws_smem<kE4m3Pth>() <= 227 * 1024,
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

// S(64 x 128 keys) = Q(64 rows at qa, panel stride q_panel) K(128 keys at ka)^T,
// 8 x wgmma m64n128k16 from shared memory (K-major). Issues and commits: s is
// in flight until a wgmma wait.
// kZero = false: s holds finite values already (the first wgmma ignores
// them: scale-d 0), so no zeroing instructions.
template <int DT, bool kZero = true>
__device__ __forceinline__ void qk_issue(float (&s)[kWsKT / 2], uint32_t qa, uint32_t q_panel, uint32_t ka) {
  if constexpr (kZero) {
#pragma unroll
    for (int i = 0; i < kWsKT / 2; ++i) s[i] = 0.0f;
  }
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kWsD / 16; ++ks) {
    const uint64_t da = gmma_desc(qa + (ks / 4) * q_panel + (ks % 4) * 32, 16, 1024);
    const uint64_t db = gmma_desc(ka + (ks / 4) * (kWsKT * 128) + (ks % 4) * 32, 16, 1024);
    wgmma_m64n128_ss<DT>(s, da, db, ks > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// O(64 x 128) += P(64 x 128 keys, registers: pa[kk] = keys 16kk..16kk+15)
// V(128 keys at va, N-major): 8 x wgmma m64n128k16. Issues and commits.
template <int DT>
__device__ __forceinline__ void pv_issue(float (&o)[64], uint32_t (&pa)[kWsKT / 16][4], uint32_t va) {
  reg_fence(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kWsKT / 16; ++kk) {
    const uint64_t db = gmma_desc(va + kk * 16 * 128, kWsKT * 128, 1024);
    wgmma_m64n128_rs_t<DT>(o, pa[kk], db, 1);
  }
  wgmma_commit();
}

}  // namespace fp8kv::cuda::detail
