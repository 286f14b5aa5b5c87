// Paged decode attention (flash-decoding). One CTA = (KV head, chunk of up to
// 8 of its query heads, sequence, split of the keys); 4 warps take 16-key
// tiles in turn. Tensor cores: S = Q K^T with M = query heads (8 of 16 rows
// used), then O^T += V^T P^T (P's accumulator layout is exactly P^T's B
// fragment).
//
// Two ways to feed the MMAs (docs/cuda.md, version 4), chosen per head_dim:
// - D <= 128: register-staged tiles, the next tile's loads in flight while
//   this tile's math runs (fastest there as measured).
// - D = 256: each warp owns a ring of S tile stages in shared memory, filled
//   by cp.async, S tiles in flight (registers could not hold D=256 tiles
//   without spilling). Every
//   thread copies exactly the 16-byte chunks it later reads (layout
//   [chunk][lane][16 B]: conflict-free), so a cp.async.wait_group orders the
//   data for it without barriers. K/V fragments are read from the ring just
//   before their MMAs, so no tile lives whole in registers.
//
// Fragment mapping: the dot product is order-free, so the head_dim axis of K
// is permuted (dim_of below) such that each thread reads whole 16-byte chunks
// of a key row; Q is loaded in the same permuted order. For V the n axis
// (head_dim) is permuted likewise: thread (r, t) owns dims [r * D/8, (r+1) *
// D/8) of keys 2t, 2t+1, 2t+8, 2t+9. fp8 -> f16 happens in registers
// (exact); k_scale is folded into the score scale, v_scale applied once at
// the end. Splits are combined by a second kernel (programmatic dependent
// launch) in a fixed order (deterministic). Since version 10 the decode
// kernel itself is launched programmatically too (FP8KV_DECODE_PDL; see
// griddepcontrol.wait in decode_kernel).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/pdl_launch.cuh"

namespace fp8kv::cuda {
namespace {
using namespace detail;

constexpr int kWarps = 4;
constexpr int kTile = 16;       // keys per warp tile
constexpr int kMaxGroup = 8;    // query heads per CTA

struct DecodeParams : PagedKvParams {
  int gchunks, split_tokens, max_splits;
  int l2_prefetch;  // register path: this warp's tiles kept prefetched to L2 ahead (0 = off; FP8KV_DECODE_PF)
  bool l2_prefetch_pair;  // prefetch the KV-head pair's rows (2 x D x EB bytes, one bulk prefetch per row)
  bool fuse;              // FAST kernels merge the splits themselves (FUSE; FP8KV_DECODE_FUSE), host-side choice
  bool pdl;               // programmatic dependent launch of the decode kernel (FP8KV_DECODE_PDL)
  float* part_o;    // [batch][num_heads][max_splits][D]
  float* part_lse;  // [batch][num_heads][max_splits] (log2 domain)
  unsigned long long* split_counters;  // FUSE: [batch][gridDim.x] in the workspace, after the partials
  unsigned long long epoch;            // FUSE: the counters' tag (48 bits, kCounterTag)
  int64_t cache_rows;                  // rows (token slots) of each cache: num_blocks x block_size (TM's maps)
};

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
__device__ __forceinline__ void prefetch_l2(const void* a) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}
template <int N>
__device__ __forceinline__ void prefetch_bulk_l2(const void* a) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "n"(N) : "memory");
}
__device__ __forceinline__ uint4 lds16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
// Shapes of one (D, cache dtype) instantiation.
// REG (version 7, FP8KV_DECODE_D256REG, default on): fp8 D = 256 on the
// register path (its rows are 256 bytes, as bf16 d128's, whose register path
// reads at 4.0-4.2 TB/s where the fp8 d256 ring read at 2.5-2.9; run H: the
// register path reads fp8 d256 at 3.6-3.9 TB/s). The ring stays for bf16
// d256 (a register tile would not fit) and as FP8KV_DECODE_D256REG=0.
template <int D, int DT, bool REG = false, bool TM = false>
struct DecodeCfg {
  static constexpr int EB = DT == kBf16 ? 2 : 1;        // bytes per cache element
  static constexpr int KC = D * EB / 64;                 // 16-byte K chunks per thread per key row
  static constexpr int VBYTES = D / 8 * EB;              // V bytes per thread per key row
  static constexpr int VU = VBYTES / 16;                 // 16-byte V units per row (ring path)
  static constexpr int STAGE = 32 * D * EB;              // bytes per warp per tile (K + V)
  static constexpr int KREG = STAGE / 2;                 // offset of V within a stage
  // cp.async ring for D = 256 (no spills; bf16 d256 reads at 4.2 TB/s);
  // register-staged tiles for D <= 128, which measured faster there (v3 at
  // 3.9 TB/s vs the ring's 3.2 TB/s on fp8 d128, 2026-11-30 runs 1-2).
  static constexpr bool USE_RING = D == 256 && !REG;
  static constexpr int S = STAGE <= 2048 ? 8 : STAGE <= 4096 ? 4 : 3;  // stages per warp
  // TM (decode v14; fp8 e4m3 d128): per warp TMS stages of one tile (K's 16
  // rows of 128 bytes, then V's), filled by the TMA unit through tensor maps
  // (128-byte swizzle: 16-byte chunk c of row y at chunk c ^ (y & 7)), one
  // mbarrier per stage; the ring starts 1 KB-aligned (the swizzle's period),
  // hence the 1 KB of slack.
  static constexpr int TMS = 2, TSTAGE = 2 * kTile * 128;
  static constexpr int RING = USE_RING ? S * STAGE : TM ? TMS * TSTAGE : kMaxGroup * D * 4;  // bytes per warp
  static constexpr int BARS = TM ? kWarps * TMS * 8 : 0;
  static constexpr int SMEM = kWarps * RING + 2 * kWarps * kMaxGroup * 4 + BARS + (TM ? 1024 : 0);
  static_assert(!TM || D * EB == 128, "TM: 128-byte rows (the swizzle and box assume them)");
  static_assert(RING >= kMaxGroup * D * 4, "the epilogue reuses the ring");
  static_assert(!USE_RING || VBYTES >= 16, "ring: V in 16-byte units");
};

constexpr int kReduceThreads = 256;  // decode_reduce_kernel

// FUSE (version 10 variant, FP8KV_DECODE_FUSE=1; the FAST kernels): the last
// CTA of a (sequence, KV head, head chunk) to finish its split merges the
// partials of its nh heads, so no reduce kernel runs (one launch and its wait
// on the whole decode grid less per layer).
// Counters: one 64-bit word per CTA column (sequence, blockIdx.x) in the
// workspace after the partials (so launches with their own workspaces never
// share one): tag << 16 | splits counted, the tag a fixed 48-bit constant.
// The CTA that counts last writes tag | 0, so the next launch (or graph
// replay) counts with one atomicAdd per CTA; a word without the tag
// (whatever the memory held: first use) is counted by compare-and-swap as
// zero, so the workspace needs no clearing. (Run O_2 measured the first
// form, a per-launch tag and compare-and-swap for every CTA: slower at
// batch 1, the retries of 49 CTAs counting at once.)
// Arithmetic: decode_reduce_kernel's, in its order, so the output is bitwise
// the reduce kernel's (a launch that falls back to the reduce kernel, e.g. a
// LEAN-auto batch, gives the same bits): per (head, float4 column), R =
// kReduceThreads / (D / 4) interleaved sums (W_rho, O_rho over splits s = rho,
// rho + R, ... in increasing s), then added in rho order from zero; the
// weights exp2(lse_s - max lse) as there. What differs from version 7's fused
// tail (slower everywhere in run H, docs/cuda.md "Version 7"): that one walked
// the R chains one after another, ~nsplits dependent-in-time L2 loads per
// thread (49 at B=1/64K); here a thread issues the R loads of s0 .. s0 + R - 1
// together (R chains advanced in lockstep, unrolled by two: 2R float4 loads in
// flight per thread), so the tail is ~nsplits / (2R) L2 round trips.
// Partials are read with ld.global.cg (L2; this SM's L1 never held them).
// smem: [nh][nsplits] weights (paged_decode checks the size).
template <int D>
__device__ __forceinline__ void fused_merge(const DecodeParams& p, uint8_t* smem, int b, int h0, int nh,
                                            int nsplits) {
  __shared__ int s_last;
  // The CTA's partials, then one thread's gpu-scope fence and count (the
  // pattern of cooperative groups' grid sync: bar.sync orders every thread's
  // stores before thread 0's fence, whose release is cumulative), so the 127
  // other threads do not each wait on a fence.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned long long* ctr = p.split_counters + (static_cast<int64_t>(b) * gridDim.x + blockIdx.x);
    const unsigned long long tag = p.epoch << 16;
    // Fast path (every launch after a workspace's first): the word holds
    // tag | count, one atomicAdd counts (run O_2: the compare-and-swap loop
    // that every CTA ran before cost one more round trip per CTA that
    // counted at the same moment, ~16 us for 49 splits at batch 1).
    unsigned long long cur = atomicAdd(ctr, 1ull), seen;
    int count;
    if ((cur >> 16) == p.epoch) {
      count = static_cast<int>(cur & 0xffffu);
    } else {
      // The word holds no tagged count (memory never used as this counter):
      // count by compare-and-swap, an untagged word reading as zero (the add
      // above went into it and is overwritten by the first tagged value).
      // Another CTA's add that lands after that sees a tag: the fast path.
      cur = atomicAdd(ctr, 0ull);
      for (;;) {
        count = (cur >> 16) == p.epoch ? static_cast<int>(cur & 0xffffu) : 0;
        seen = atomicCAS(ctr, cur, tag | static_cast<unsigned long long>(count + 1));
        if (seen == cur) break;
        cur = seen;
      }
    }
    const int last = count + 1 == nsplits;
    if (last) {
      atomicExch(ctr, tag);  // every split of this launch has counted: tag | 0 for the next launch
      __threadfence();       // acquire: the other CTAs' partials, for the reads after the barrier
    }
    s_last = last;
  }
  __syncthreads();
  if (!s_last) return;
  float* sw = reinterpret_cast<float*>(smem);
  const int64_t base = (static_cast<int64_t>(b) * p.num_heads + h0) * p.max_splits;
  for (int i = threadIdx.x; i < nh * nsplits; i += blockDim.x) {
    const int row = i / nsplits, s = i % nsplits;
    sw[i] = __ldcg(p.part_lse + base + static_cast<int64_t>(row) * p.max_splits + s);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int row = warp; row < nh; row += kWarps) {
    float M = -INFINITY;
    for (int s = lane; s < nsplits; s += 32) M = fmaxf(M, sw[row * nsplits + s]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    const float Mref = M == -INFINITY ? 0.0f : M;
    __syncwarp();
    for (int s = lane; s < nsplits; s += 32) sw[row * nsplits + s] = exp2f(sw[row * nsplits + s] - Mref);
  }
  __syncthreads();
  constexpr int Q = D / 4;               // float4 columns per head
  constexpr int R = kReduceThreads / Q;  // decode_reduce_kernel's rows
  for (int u = threadIdx.x; u < nh * Q; u += blockDim.x) {
    const int row = u / Q, c = u % Q;
    const float* w = sw + row * nsplits;
    const float4* src =
        reinterpret_cast<const float4*>(p.part_o + (base + static_cast<int64_t>(row) * p.max_splits) * D) + c;
    float W[R];
    float4 O[R];
#pragma unroll
    for (int rho = 0; rho < R; ++rho) {
      W[rho] = 0.0f;
      O[rho] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll 2
    for (int s0 = 0; s0 < nsplits; s0 += R) {
      float4 v[R];
#pragma unroll
      for (int rho = 0; rho < R; ++rho)
        v[rho] = s0 + rho < nsplits ? __ldcg(src + static_cast<int64_t>(s0 + rho) * Q) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int rho = 0; rho < R; ++rho) {
        if (s0 + rho < nsplits) {
          const float ws = w[s0 + rho];
          W[rho] += ws;
          O[rho].x += ws * v[rho].x; O[rho].y += ws * v[rho].y; O[rho].z += ws * v[rho].z; O[rho].w += ws * v[rho].w;
        }
      }
    }
    float Wt = 0.0f;
    float4 Ot = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int rho = 0; rho < R; ++rho) {
      Wt += W[rho];
      Ot.x += O[rho].x; Ot.y += O[rho].y; Ot.z += O[rho].z; Ot.w += O[rho].w;
    }
    const int kvh = (h0 + row) / p.group;
    const float vs = p.v_scale == nullptr ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
    const int64_t off = (static_cast<int64_t>(b) * p.num_heads + h0 + row) * D + 4 * c;
    store_act(p.out, off + 0, Wt > 0.0f ? Ot.x / Wt * vs : 0.0f, p.out_bf16);
    store_act(p.out, off + 1, Wt > 0.0f ? Ot.y / Wt * vs : 0.0f, p.out_bf16);
    store_act(p.out, off + 2, Wt > 0.0f ? Ot.z / Wt * vs : 0.0f, p.out_bf16);
    store_act(p.out, off + 3, Wt > 0.0f ? Ot.w / Wt * vs : 0.0f, p.out_bf16);
  }
}

// DEEP (D = 128 only, a tuning variant chosen by FP8KV_DECODE_DEEP=1, see
// deep_pipeline()): one more tile in flight in the register path (fp8: two
// tiles ahead; bf16: one, where the default has none), at the cost of ~200-230
// registers, i.e. 2 CTAs per SM instead of 3.
//
// LEAN (D = 128 e4m3 only, FP8KV_DECODE_LEAN=1, version 6 variant): no register
// prefetch (one tile in registers at a time), at most 128 registers (4 CTAs,
// 16 warps per SM instead of 12); the bytes in flight come from the L2
// prefetch (l2_prefetch, 2 tiles ahead unless FP8KV_DECODE_PF says otherwise).
//
// HPW (D = 128 register path only, FP8KV_DECODE_HPW=1, version 7 variant):
// heads per warp. A CTA covers kWarps adjacent KV heads, warp w the KV head
// 4 * blockIdx.x + w over every tile of the split (instead of one KV head
// whose tiles the 4 warps take in turn). The 4 warps read the same key rows
// of 4 adjacent heads: 4 x D x EB contiguous bytes per row (512 B fp8, 1 KB
// bf16) from one SM at about the same time, where the default reads 128 B
// (fp8) at a 1 KB stride per CTA. One warp accumulates all tiles of a split
// (no cross-warp combine), so results differ from the default's in rounding
// (not bitwise); batched == single holds as for every variant.
//
// FAST (version 9 variant, FP8KV_DECODE_V9=1; register path, not HPW): the
// same tiles, order and arithmetic as the default (bitwise the same results)
// with fewer instructions per tile, the fp8 path's cost per byte (docs/cuda.md,
// "Decode v9"): block-table entries 32 tiles at a time one per lane, fetched
// 32 tiles ahead (no integer division and no dependent table load per tile),
// tile addresses as a 64-bit tile base plus hoisted 32-bit per-thread
// offsets; the register stages ping-pong (loop unrolled by two: no register
// copies of the tile in flight); the accumulator rescale skipped when no row's
// running max moved (alpha == 1 in every lane: multiplying by 1 is exact);
// masks only on tiles that cross [first, s_end) (warp-uniform test). Launch
// bounds keep the default's CTAs per SM (3 for fp8 d128, 2 for DEEP bf16 and
// fp8 d256).
//
// F4 (decode v13, FP8KV_DECODE_F4, auto by default; FAST with LEAN, fp8 e4m3
// d128): the FAST kernel without its second register stage (each warp
// refills its one stage as it frees: the next tile's K once the scores are
// done, its V after the last m-tile), so it fits 128 registers and 4 CTAs
// per SM: 16 warps, where FAST runs 12. Runs R_2 / R_3's read sweep: a
// read-only kernel streams at ~4.2 TB/s with 12 warps per SM whatever its
// bytes in flight (24-192 KB per SM), ~4.46 with 16 and 4.57-4.61 with 20-24.
// Bitwise FAST's results (same tiles, order and arithmetic).
//
// TM (decode v14, FP8KV_DECODE_TM, fp8 e4m3 d128; kernel decode_kernel_tm):
// the FAST kernel's tiles, order and arithmetic (bitwise its results), with
// K and V brought in by the TMA unit through two tensor maps (the caches as
// rows of num_kv_heads x 128 bytes; one box of 16 rows x 128 bytes per K or
// V tile: two instructions per tile, where decode v13's BULK needed 32 bulk
// copies of 128 bytes, which cap at 4.11 TB/s) into a 2-stage shared-memory
// ring per warp, one mbarrier per stage. A warp reads its tile's words into
// registers (the FAST layout), hands the stage to the tile two ahead, then
// does the math: two tiles in flight per warp and none held in registers
// across the math, so 4 CTAs fit per SM. Run S_1's sweep: tensor-map boxes
// stream at 4.48-4.51 TB/s with 12-16 warps per SM, where loads reach 4.13
// with 12 and 4.36 with 16. Runs S_2 / S_3: 1.01-1.03x FAST / F4 at B >= 8
// (the kernel's time at B=32/16K is FAST's: its warps still wait on data),
// 0.95-0.99 at B = 1 by the isolated call.
template <int D, int DT, bool DEEP, bool LEAN, bool HPW, bool REG, bool FAST, bool FUSE, bool TM>
__device__ __forceinline__ void decode_body(const DecodeParams& p, const CUtensorMap* tmk, const CUtensorMap* tmv) {
  static_assert(!FAST || (!HPW && !DecodeCfg<D, DT, REG>::USE_RING), "FAST: register path only");
  static_assert(!FAST || !LEAN || (D == 128 && DT == kE4m3), "F4: FAST fp8 e4m3 d128 only");
  static_assert(!FUSE || FAST, "FUSE: the FAST kernels only");
  static_assert(!TM || (FAST && !LEAN && !FUSE && !DEEP && D == 128 && DT == kE4m3), "TM: FAST fp8 e4m3 d128 only");
  using C = DecodeCfg<D, DT, REG, TM>;
  constexpr int EB = C::EB;
  constexpr int E = 16 / EB;               // elements per 16-byte chunk
  constexpr int J = E / 4;                 // k-steps per chunk
  constexpr int KS = D / 16;               // k-steps of Q K^T
  constexpr int MT = D / 16;               // m-tiles of O^T = V^T P^T
  constexpr int S = C::S;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  // (TM: everything from the first 1 KB boundary, so each stage is 1 KB-aligned.)
  uint8_t* const smem =
      TM ? smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u)
         : smem_raw;
  float* sm_m = reinterpret_cast<float*>(smem + kWarps * C::RING);
  float* sm_l = sm_m + kWarps * kMaxGroup;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 2, t = lane & 3;
  const int kvh = HPW ? blockIdx.x * kWarps + warp : blockIdx.x / p.gchunks;
  const int gc = HPW ? 0 : blockIdx.x % p.gchunks;
  constexpr int TS = HPW ? 1 : kWarps;  // register path: tile stride of a warp
  const int T0 = HPW ? 0 : warp;         // and its first tile
  const int b = blockIdx.y, split = blockIdx.z;
  const int ctx = p.context_lens[b];
  const int32_t* bt = p.block_tables + static_cast<int64_t>(b) * p.max_blocks_per_seq;
  // FAST (decode v15): without a window a split's first key, and so the
  // block ids of this warp's first 64 tiles, do not depend on the context
  // length: they are loaded with it (one round trip where there were three:
  // the length, then the two batches of ids, each waited for before the
  // next was asked), clamped to the table's row (ids past the context are
  // never used: f_fetch's offsets are 0 there).
  int spec_blk[2] = {0, 0};
  const bool spec = FAST && !HPW && p.window <= 0 && p.max_blocks_per_seq > 0;
  if (spec) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = split * p.split_tokens + (T0 + (32 * h + lane) * TS) * kTile;
      spec_blk[h] = bt[min(j / p.block_size, p.max_blocks_per_seq - 1)];
    }
  }
  int first, tstart, nsplits;
  seq_range(p, ctx, first, tstart, nsplits);
  if (split >= nsplits) {
    // Waits even so: if no CTA of this grid waited (an all-padding step, e.g.
    // the engine's startup graph warm-up, where every context is 0), the grid
    // could complete before the previous kernel, and the kernels after it,
    // which wait only for this grid, would no longer follow that one.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    return;
  }
  // Programmatic dependent launch (version 10, FP8KV_DECODE_PDL, on by
  // default): this grid may start while the previous kernel in the stream
  // drains. Before this wait it reads only the context lengths and block
  // tables (the step's inputs, copied before the step's first kernel); Q, the
  // K/V caches, the scales and every write (workspace, output) come after it.
  // The FAST kernels wait after fetching their first block ids (one dependent
  // round trip overlapped with the previous kernel); the others at once. A
  // no-op when the launch is not programmatic.
  if constexpr (!FAST) asm volatile("griddepcontrol.wait;" ::: "memory");
  const int s_begin = tstart + split * p.split_tokens;
  const int s_end = min(ctx, s_begin + p.split_tokens);
  const int h0 = kvh * p.group + gc * kMaxGroup;
  const int nh = min(kMaxGroup, p.group - gc * kMaxGroup);

  const int64_t row_bytes = static_cast<int64_t>(p.num_kv_heads) * D * EB;
  const int64_t head_off = static_cast<int64_t>(kvh) * D * EB;
  const int ntiles = (s_end - s_begin + kTile - 1) / kTile;
  const int nmine = ntiles > warp ? (ntiles - warp + kWarps - 1) / kWarps : 0;  // this warp's tiles
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem + warp * C::RING));
  const int vtok[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};

  // Block ids of this warp's tiles, 32 at a time (lane i holds tile 32k + i).
  int bt_lane = 0;
  // Issues the copies of this warp's k-th tile into stage `st` (one commit
  // group per call, empty past the end, so wait_group counts stay uniform).
  auto issue = [&](int k, int st) {
    if (k < nmine) {
      if ((k & 31) == 0) {
        const int kk = k + lane;
        bt_lane = kk < nmine ? bt[(s_begin + (warp + kk * kWarps) * kTile) / p.block_size] : 0;
      }
      const int64_t blk = __shfl_sync(0xffffffffu, bt_lane, k & 31);
      const int j0 = s_begin + (warp + k * kWarps) * kTile;
      const int64_t row0 = blk * p.block_size + j0 % p.block_size;  // the tile stays inside one block
      const uint8_t* kb = p.k_cache + row0 * row_bytes + head_off;
      const uint8_t* vb = p.v_cache + row0 * row_bytes + head_off;
      const uint32_t sb = ring + st * C::STAGE;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < C::KC; ++c)
          cp_async16(sb + ((nt * C::KC + c) * 32 + lane) * 16, kb + (nt * 8 + r) * row_bytes + (c * 4 + t) * 16);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int u = 0; u < C::VU; ++u)
          cp_async16(sb + C::KREG + ((i * C::VU + u) * 32 + lane) * 16,
                     vb + vtok[i] * row_bytes + r * C::VBYTES + 16 * u);
      }
    }
    cp_async_commit();
  };
  // Prologue: the first S tiles in flight before anything else.
  if constexpr (C::USE_RING) {
#pragma unroll
    for (int k = 0; k < S; ++k) issue(k, k);
  }
  constexpr int KW = D * EB / 16;  // words per thread per key row (K)
  constexpr int VBYTES = C::VBYTES, VW = VBYTES / 4;
  // Register-staged pipeline: the next tile's K/V loads are in flight while
  // this tile's math runs (when the registers allow: fp8 up to D=128, bf16 up
  // to D=64; else one tile at a time).
  constexpr bool kPrefetch = !LEAN && D * EB <= (DEEP ? 256 : 128);
  constexpr bool kPrefetch2 = DEEP && D * EB <= 128;  // two tiles ahead
  auto load_tile = [&](int it, uint32_t (&kw)[2][KW], uint32_t (&vw)[4][VW]) {
    const int j0 = s_begin + it * kTile;
    const int64_t blk = bt[j0 / p.block_size];
    const int64_t row0 = blk * p.block_size + j0 % p.block_size;  // the tile stays inside one block
    const uint8_t* kb = p.k_cache + row0 * row_bytes + head_off;
    const uint8_t* vb = p.v_cache + row0 * row_bytes + head_off;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int c = 0; c < KW / 4; ++c)
        ld_words<16>(kb + (nt * 8 + r) * row_bytes + (c * 4 + t) * 16, &kw[nt][4 * c]);
#pragma unroll
    for (int i = 0; i < 4; ++i) ld_words<VBYTES>(vb + vtok[i] * row_bytes + r * VBYTES, vw[i]);
  };
  // Register path: the first tile's loads are issued before Q's, so the two
  // latencies overlap (version 5; they were serial).
  uint32_t kw[2][KW], vw[4][VW];
  if (!C::USE_RING && !FAST && T0 < ntiles) load_tile(T0, kw, vw);
  uint32_t kn[2][KW], vn[4][VW];  // tile it + kWarps (in flight), two-ahead variant only
  if (kPrefetch2 && T0 + TS < ntiles) load_tile(T0 + TS, kn, vn);

  // L2 prefetch (version 6 variant, FP8KV_DECODE_PF=n): the register path
  // keeps this warp's next n tiles requested into L2 by prefetch.global.L2,
  // which holds no registers, so more bytes are in flight per SM than the
  // register stages allow; the register loads then hit L2. Arithmetic is
  // unchanged (same results bitwise). Block ids 32 tiles at a time, one per
  // lane (as the ring path does), so a prefetch waits on no table load.
  constexpr int LPR = D * EB >= 128 ? D * EB / 128 : 1;  // 128-byte lines per key row
  const int pf = C::USE_RING || HPW ? 0 : p.l2_prefetch;
  int pf_bt = 0;
  auto prefetch_tile = [&](int k) {  // this warp's k-th tile (k >= 1, increasing by one per call)
    if (k >= nmine) return;          // warp-uniform
    if (k == 1 || (k & 31) == 0) {
      const int kk = (k & ~31) + lane;
      pf_bt = kk < nmine ? bt[(s_begin + (warp + kk * kWarps) * kTile) / p.block_size] : 0;
    }
    const int64_t blk = __shfl_sync(0xffffffffu, pf_bt, k & 31);
    const int j0 = s_begin + (warp + k * kWarps) * kTile;
    const int64_t row0 = blk * p.block_size + j0 % p.block_size;
    if (p.l2_prefetch_pair) {
      // PAIR (FP8KV_DECODE_PFPAIR=1, even num_kv_heads): lane -> row lane & 15
      // of K (lanes 0-15) or V; the rows of KV heads 2m and 2m+1 are adjacent,
      // so one request of 2 x D x EB contiguous bytes serves this CTA and its
      // neighbour (launched beside it: blockIdx.x is the KV head).
      const uint8_t* base = lane < 16 ? p.k_cache : p.v_cache;
      prefetch_bulk_l2<2 * D * EB>(base + (row0 + (lane & 15)) * row_bytes + (kvh & ~1) * D * EB);
      return;
    }
#pragma unroll
    for (int u = 0; u < LPR; ++u) {  // 2 (K, V) x 16 rows x LPR lines = 32 LPR lines
      const int i = u * 32 + lane;
      const int row = (i / LPR) % kTile, line = i % LPR;
      const uint8_t* base = i < 16 * LPR ? p.k_cache : p.v_cache;
      prefetch_l2(base + (row0 + row) * row_bytes + head_off + line * 128);
    }
  };

  // FAST (version 9): per-thread byte offsets inside a tile (32-bit: 16 rows
  // of row_bytes), hoisted out of the loop; the byte offset of each tile of
  // this warp (64-bit), 32 tiles at a time, one per lane, the next 32 fetched
  // when a batch starts (the table load then has 32 tiles to land).
  static_assert(!FAST || !kPrefetch2, "FAST: at most one tile ahead in registers");
  uint32_t fk_off[2] = {0u, 0u}, fv_off[4] = {0u, 0u, 0u, 0u};
  // (Decode v15 measured keeping the next batch as block ids, made offsets
  // when it starts, so that no table load is waited for in mid-stream: 0.92-0.97x
  // at every FAST row, B=8/16K to B=1/16K, even where no batch starts
  // mid-stream; runs T_3 and T_4. The offsets stay computed at once.)
  long long f_cur = 0, f_nxt = 0;
  // f_fetch in two halves, so that the prologue's two batches of table
  // loads are in flight together: the block id of tile kk (0 past this
  // warp's tiles), then its offset.
  auto f_blk = [&](int kk) -> int {
    return kk < nmine ? bt[(s_begin + (T0 + kk * TS) * kTile) / p.block_size] : 0;
  };
  auto f_off = [&](int64_t blk, int kk) -> long long {
    if (kk >= nmine) return 0;
    const int j = s_begin + (T0 + kk * TS) * kTile;
    if constexpr (TM) return blk * p.block_size + j % p.block_size;  // TM: the tile's first row
    return (blk * p.block_size + j % p.block_size) * row_bytes + head_off;
  };
  auto f_fetch = [&](int kk) -> long long { return f_off(f_blk(kk), kk); };
  // (f_load_k returns the tile's offset for f_load_v.)
  auto f_load_k = [&](int k, uint32_t (&kw_)[2][KW]) -> long long {  // k: this warp's tile, +1 per call
    if ((k & 31) == 0 && k > 0) {
      f_cur = f_nxt;
      f_nxt = f_fetch(k + 32 + lane);
    }
    const long long off = __shfl_sync(0xffffffffu, f_cur, k & 31);
    const uint8_t* kb = p.k_cache + off;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int c = 0; c < KW / 4; ++c) ld_words<16>(kb + fk_off[nt] + c * 64, &kw_[nt][4 * c]);
    return off;
  };
  auto f_load_v = [&](long long off, uint32_t (&vw_)[4][VW]) {
    const uint8_t* vb = p.v_cache + off;
#pragma unroll
    for (int i = 0; i < 4; ++i) ld_words<VBYTES>(vb + fv_off[i], vw_[i]);
  };
  auto f_load = [&](int k, uint32_t (&kw_)[2][KW], uint32_t (&vw_)[4][VW]) { f_load_v(f_load_k(k, kw_), vw_); };
  // TM: this warp's k-th tile into stage st (k increasing by one per call, as
  // f_load_k's): lane 0 sets the stage's transaction bytes and issues the two
  // boxes (K's rows, then V's), at column kvh x 128 bytes of the row view.
  const uint32_t tm_bars = static_cast<uint32_t>(__cvta_generic_to_shared(smem + kWarps * C::RING +
                                                                          2 * kWarps * kMaxGroup * 4)) +
                           warp * C::TMS * 8;
  auto tm_issue = [&](int k, int st) {
    if (k >= nmine) return;  // warp-uniform
    if ((k & 31) == 0 && k > 0) {
      f_cur = f_nxt;
      f_nxt = f_fetch(k + 32 + lane);
    }
    const int row = static_cast<int>(__shfl_sync(0xffffffffu, f_cur, k & 31));
    if (lane == 0) {
      const uint32_t bar = tm_bars + 8 * st, dst = ring + st * C::TSTAGE;
      mbar_arrive_expect_tx(bar, C::TSTAGE);
      tma_load_2d(dst, tmk, kvh * 128, row, bar);
      tma_load_2d(dst + C::TSTAGE / 2, tmv, kvh * 128, row, bar);
    }
  };
  if constexpr (FAST) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) fk_off[nt] = static_cast<uint32_t>((nt * 8 + r) * row_bytes + t * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) fv_off[i] = static_cast<uint32_t>(vtok[i] * row_bytes + r * VBYTES);
    if constexpr (TM) {
      if (lane == 0) {
#pragma unroll
        for (int st = 0; st < C::TMS; ++st) mbar_init(tm_bars + 8 * st, 1);
        mbar_init_fence();
      }
      __syncwarp();
    }
    if (!spec) {
      spec_blk[0] = f_blk(lane);
      spec_blk[1] = f_blk(32 + lane);
    }
    f_cur = f_off(spec_blk[0], lane);
    f_nxt = f_off(spec_blk[1], 32 + lane);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if constexpr (TM) {
#pragma unroll
      for (int st = 0; st < C::TMS; ++st) tm_issue(st, st);
    } else {
      if (T0 < ntiles) f_load(0, kw, vw);
    }
  }
  for (int k = 1; k < pf; ++k) prefetch_tile(k);  // (after the wait: L2 prefetches of K/V)

  // Q fragments (A operand, rows = heads, 8..15 zero) in the permuted dim order:
  // k-step s, slot pair {2t, 2t+1} -> dims base, base+1; {2t+8, 2t+9} -> base+2, base+3.
  uint32_t qa[KS][2];
  {
    const bool valid = r < nh;
    const int64_t qoff = (static_cast<int64_t>(b) * p.num_heads + h0 + r) * D;
    // FAST (decode v15): each k-step's 4 consecutive elements by one 8-byte
    // (bf16) or 16-byte (f32) load, all KS loads issued before the first
    // conversion (the element-wise loads waited for the first before the
    // rest were asked). The same values: bf16 -> f32 is exact either way.
    const bool qvec = FAST && (reinterpret_cast<uintptr_t>(p.q) & 15u) == 0;
    if (qvec && p.q_bf16) {
      const __nv_bfloat16* q16 = static_cast<const __nv_bfloat16*>(p.q) + qoff;
      uint2 raw[KS];
#pragma unroll
      for (int s = 0; s < KS; ++s)
        raw[s] = valid ? *reinterpret_cast<const uint2*>(q16 + (s / J) * 4 * E + E * t + 4 * (s % J)) : make_uint2(0u, 0u);
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        qa[s][0] = pack2<DT>(__uint_as_float(raw[s].x << 16), __uint_as_float(raw[s].x & 0xffff0000u));
        qa[s][1] = pack2<DT>(__uint_as_float(raw[s].y << 16), __uint_as_float(raw[s].y & 0xffff0000u));
      }
    } else if (qvec) {
      const float* q32 = static_cast<const float*>(p.q) + qoff;
      float4 raw[KS];
#pragma unroll
      for (int s = 0; s < KS; ++s)
        raw[s] = valid ? *reinterpret_cast<const float4*>(q32 + (s / J) * 4 * E + E * t + 4 * (s % J))
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        qa[s][0] = pack2<DT>(raw[s].x, raw[s].y);
        qa[s][1] = pack2<DT>(raw[s].z, raw[s].w);
      }
    } else {
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const int base = (s / J) * 4 * E + E * t + 4 * (s % J);
        float x[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) x[i] = valid ? load_act(p.q, qoff + base + i, p.q_bf16) : 0.0f;
        qa[s][0] = pack2<DT>(x[0], x[1]);
        qa[s][1] = pack2<DT>(x[2], x[3]);
      }
    }
  }
  const float ks = DT == kBf16 ? 1.0f : p.k_scale[p.k_scale_count == 1 ? 0 : kvh];
  const float score_scale = p.softmax_scale * ks;
  const bool softcap = p.softcap > 0.0f;
  const float score_mul = softcap ? score_scale / p.softcap : score_scale * kLog2e;

  // O^T accumulators: m-tile i, rows g / g+8 -> dims r*(D/8) + 2i / + 2i+1,
  // columns 2t / 2t+1 -> heads (all four values useful).
  float o[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  if constexpr (C::USE_RING) {
    int st = 0;
    for (int k = 0; k < nmine; ++k) {
      const int j0 = s_begin + (warp + k * kWarps) * kTile;
      cp_async_wait<S - 1>();  // this thread's copies of tile k have landed
      const uint32_t sb = ring + st * C::STAGE;

      // S = Q K^T for keys j0 + nt*8 + (0..7).
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int c = 0; c < C::KC; ++c) {
          const uint4 kv4 = lds16(sb + ((nt * C::KC + c) * 32 + lane) * 16);
          const uint32_t w[4] = {kv4.x, kv4.y, kv4.z, kv4.w};
#pragma unroll
          for (int j = 0; j < J; ++j) {
            const int ks_ = c * J + j;
            uint32_t b0, b1;
            if constexpr (DT == kBf16) {
              b0 = w[2 * j];
              b1 = w[2 * j + 1];
            } else {
              b0 = fp8x2_to_f16x2<DT>(w[j]);
              b1 = fp8x2_to_f16x2<DT>(w[j] >> 16);
            }
            mma16816<DT>(s[nt], qa[ks_][0], 0u, qa[ks_][1], 0u, b0, b1);
          }
        }
      }
      // Scores in log2 units, masked outside [first, s_end).
      float x[2][2];
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + 2 * t + e;
          float v = s[nt][e] * score_mul;
          if (softcap) v = p.softcap * tanhf(v) * kLog2e;
          v = (j >= first && j < s_end) ? v : -INFINITY;
          x[nt][e] = v;
          mx = fmaxf(mx, v);
        }
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
      const float alpha_lo = __shfl_sync(0xffffffffu, alpha, (2 * t) * 4);  // heads 2t, 2t+1
      const float alpha_hi = __shfl_sync(0xffffffffu, alpha, (2 * t + 1) * 4);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        o[i][0] *= alpha_lo; o[i][1] *= alpha_hi; o[i][2] *= alpha_lo; o[i][3] *= alpha_hi;
      }
      const uint32_t pa0 = pack2<DT>(pr[0][0], pr[0][1]);
      const uint32_t pa2 = pack2<DT>(pr[1][0], pr[1][1]);

      // V of keys outside [first, s_end) reads as zero: unwritten slots may hold NaN codes.
      bool vok[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) vok[i] = j0 + vtok[i] >= first && j0 + vtok[i] < s_end;
      // O^T += V^T P^T: A = V^T (rows: dims, k: keys 2t,2t+1 | 2t+8,2t+9),
      // B = P^T, which is exactly this thread's probabilities (pa0, pa2).
      // V unit u of the 4 rows holds words [4u, 4u+4).
      constexpr int UW = 4;                                 // words per unit
      constexpr int MPU = DT == kBf16 ? UW : 2 * UW;        // m-tiles per unit
#pragma unroll
      for (int u = 0; u < C::VU; ++u) {
        uint32_t vw[4][UW];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint4 v4 = lds16(sb + C::KREG + ((i * C::VU + u) * 32 + lane) * 16);
          vw[i][0] = vok[i] ? v4.x : 0u; vw[i][1] = vok[i] ? v4.y : 0u;
          vw[i][2] = vok[i] ? v4.z : 0u; vw[i][3] = vok[i] ? v4.w : 0u;
        }
#pragma unroll
        for (int im = 0; im < MPU; ++im) {
          const int i = u * MPU + im;  // m-tile
          uint32_t a0, a1, a2, a3;
          if constexpr (DT == kBf16) {
            a0 = __byte_perm(vw[0][im], vw[1][im], 0x5410u);
            a1 = __byte_perm(vw[0][im], vw[1][im], 0x7632u);
            a2 = __byte_perm(vw[2][im], vw[3][im], 0x5410u);
            a3 = __byte_perm(vw[2][im], vw[3][im], 0x7632u);
          } else {
            const uint32_t bb = 2 * (im & 1);  // byte of element 2i within its word
            const int wi = im / 2;
            if constexpr (DT == kE5m2) {
              const uint32_t sl = bb | (bb << 4) | ((bb + 4) << 8) | ((bb + 4) << 12);
              const uint32_t sh = (bb + 1) | ((bb + 1) << 4) | ((bb + 5) << 8) | ((bb + 5) << 12);
              a0 = __byte_perm(vw[0][wi], vw[1][wi], sl) & 0xff00ff00u;
              a1 = __byte_perm(vw[0][wi], vw[1][wi], sh) & 0xff00ff00u;
              a2 = __byte_perm(vw[2][wi], vw[3][wi], sl) & 0xff00ff00u;
              a3 = __byte_perm(vw[2][wi], vw[3][wi], sh) & 0xff00ff00u;
            } else {
              const uint32_t sel = bb | ((bb + 4) << 4) | ((bb + 1) << 8) | ((bb + 5) << 12);
              const uint32_t w01 = __byte_perm(vw[0][wi], vw[1][wi], sel);
              const uint32_t w23 = __byte_perm(vw[2][wi], vw[3][wi], sel);
              a0 = fp8x2_to_f16x2<DT>(w01);
              a1 = fp8x2_to_f16x2<DT>(w01 >> 16);
              a2 = fp8x2_to_f16x2<DT>(w23);
              a3 = fp8x2_to_f16x2<DT>(w23 >> 16);
            }
          }
          mma16816<DT>(o[i], a0, a1, a2, a3, pa0, pa2);
        }
      }
      // Refill the stage just read (its words are in registers: same thread).
      issue(k + S, st);
      st = st + 1 == S ? 0 : st + 1;
    }
    cp_async_wait<0>();
  } else if constexpr (FAST) {
    // One tile's math (the default loop's, bitwise): see FAST above.
    // kn >= 0 (F4): once the scores are done (K's words dead), the loads of
    // this warp's tile kn's K into kw_, its offset into k_next_off.
    long long k_next_off = 0;
    auto math = [&](int j0, uint32_t (&kw_)[2][KW], uint32_t (&vw_)[4][VW], int kn) {
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks_ = 0; ks_ < KS; ++ks_) {
          uint32_t b0, b1;
          if constexpr (DT == kBf16) {
            b0 = kw_[nt][(ks_ / J) * 4 + 2 * (ks_ % J)];
            b1 = kw_[nt][(ks_ / J) * 4 + 2 * (ks_ % J) + 1];
          } else {
            const uint32_t w = kw_[nt][(ks_ / J) * 4 + (ks_ % J)];
            b0 = fp8x2_to_f16x2<DT>(w);
            b1 = fp8x2_to_f16x2<DT>(w >> 16);
          }
          // A rows 8-15 (a1, a3) only feed S rows 8-15, which are never
          // read: opaque values (no defining instruction) instead of zeros,
          // which the default re-materialises every tile (16 moves in SASS).
          uint32_t z1, z3;
          asm volatile("" : "=r"(z1));
          asm volatile("" : "=r"(z3));
          mma16816<DT>(s[nt], qa[ks_][0], z1, qa[ks_][1], z3, b0, b1);
        }
      }
      if (kn >= 0) k_next_off = f_load_k(kn, kw_);
      // Only a tile crossing [first, s_end) needs the masks, and the softcap
      // branch is taken once per tile, not per score (both warp-uniform).
      const bool edge = j0 < first || j0 + kTile > s_end;
      float x[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) x[nt][e] = s[nt][e] * score_mul;
      if (softcap) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) x[nt][e] = p.softcap * tanhf(x[nt][e]) * kLog2e;
      }
      if (edge) {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = j0 + nt * 8 + 2 * t + e;
            x[nt][e] = (j >= first && j < s_end) ? x[nt][e] : -INFINITY;
          }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) mx = fmaxf(mx, x[nt][e]);
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
      // alpha == 1 in every lane: the rescale would multiply by 1 (exact).
      if (__any_sync(0xffffffffu, alpha != 1.0f)) {
        const float alpha_lo = __shfl_sync(0xffffffffu, alpha, (2 * t) * 4);  // heads 2t, 2t+1
        const float alpha_hi = __shfl_sync(0xffffffffu, alpha, (2 * t + 1) * 4);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          o[i][0] *= alpha_lo; o[i][1] *= alpha_hi; o[i][2] *= alpha_lo; o[i][3] *= alpha_hi;
        }
      }
      const uint32_t pa0 = pack2<DT>(pr[0][0], pr[0][1]);
      const uint32_t pa2 = pack2<DT>(pr[1][0], pr[1][1]);
      if (edge) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = j0 + vtok[i];
          if (j < first || j >= s_end)
#pragma unroll
            for (int w = 0; w < VW; ++w) vw_[i][w] = 0u;
        }
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        uint32_t a0, a1, a2, a3;
        if constexpr (DT == kBf16) {
          a0 = __byte_perm(vw_[0][i], vw_[1][i], 0x5410u);
          a1 = __byte_perm(vw_[0][i], vw_[1][i], 0x7632u);
          a2 = __byte_perm(vw_[2][i], vw_[3][i], 0x5410u);
          a3 = __byte_perm(vw_[2][i], vw_[3][i], 0x7632u);
        } else {
          const uint32_t b = 2 * (i & 1);
          if constexpr (DT == kE5m2) {
            const uint32_t sl = b | (b << 4) | ((b + 4) << 8) | ((b + 4) << 12);
            const uint32_t sh = (b + 1) | ((b + 1) << 4) | ((b + 5) << 8) | ((b + 5) << 12);
            a0 = __byte_perm(vw_[0][i / 2], vw_[1][i / 2], sl) & 0xff00ff00u;
            a1 = __byte_perm(vw_[0][i / 2], vw_[1][i / 2], sh) & 0xff00ff00u;
            a2 = __byte_perm(vw_[2][i / 2], vw_[3][i / 2], sl) & 0xff00ff00u;
            a3 = __byte_perm(vw_[2][i / 2], vw_[3][i / 2], sh) & 0xff00ff00u;
          } else {
            const uint32_t sel = b | ((b + 4) << 4) | ((b + 1) << 8) | ((b + 5) << 12);
            const uint32_t w01 = __byte_perm(vw_[0][i / 2], vw_[1][i / 2], sel);
            const uint32_t w23 = __byte_perm(vw_[2][i / 2], vw_[3][i / 2], sel);
            a0 = fp8x2_to_f16x2<DT>(w01);
            a1 = fp8x2_to_f16x2<DT>(w01 >> 16);
            a2 = fp8x2_to_f16x2<DT>(w23);
            a3 = fp8x2_to_f16x2<DT>(w23 >> 16);
          }
        }
        mma16816<DT>(o[i], a0, a1, a2, a3, pa0, pa2);
      }
    };
    if constexpr (TM) {
      // Wait for tile k's stage, read this thread's words in the FAST layout
      // (the swizzled chunk of each; K: quarter-warp rows r and r + 1 read
      // opposite 64-byte halves in one instruction, then swap, so no bank
      // is hit twice), hand the stage to tile k + TMS, then the math.
      // (Row nt * 8 + r is 1 KB further for nt = 1 with the same swizzle;
      // V's rows 2t + 8 and 2t + 9 likewise from 2t and 2t + 1.)
      const bool odd = (r & 1) != 0;
      const uint32_t koff0 = static_cast<uint32_t>(r * 128 + ((((r & 1) * 4 + t) ^ r) * 16));
      const uint32_t koff1 = static_cast<uint32_t>(r * 128 + (((((r & 1) ^ 1) * 4 + t) ^ r) * 16));
      const uint32_t voff0 = static_cast<uint32_t>(C::TSTAGE / 2 + 2 * t * 128 + ((r ^ (2 * t)) * 16));
      const uint32_t voff1 = static_cast<uint32_t>(C::TSTAGE / 2 + (2 * t + 1) * 128 + ((r ^ (2 * t + 1)) * 16));
      for (int it = T0, k = 0; it < ntiles; it += TS, ++k) {
        const int st = k % C::TMS;
        mbar_wait(tm_bars + 8 * st, static_cast<uint32_t>((k / C::TMS) & 1));
        const uint32_t sb = ring + st * C::TSTAGE;
        const uint32_t voff[4] = {voff0, voff1, voff0 + 1024, voff1 + 1024};
        uint32_t kc[2][KW], vc[4][VW];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const uint4 w0 = lds16(sb + koff0 + nt * 1024), w1 = lds16(sb + koff1 + nt * 1024);
          const uint4 g0 = odd ? w1 : w0, g1 = odd ? w0 : w1;  // chunk groups 0 and 1 of the row
          kc[nt][0] = g0.x; kc[nt][1] = g0.y; kc[nt][2] = g0.z; kc[nt][3] = g0.w;
          kc[nt][4] = g1.x; kc[nt][5] = g1.y; kc[nt][6] = g1.z; kc[nt][7] = g1.w;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint4 w = lds16(sb + voff[i]);
          vc[i][0] = w.x; vc[i][1] = w.y; vc[i][2] = w.z; vc[i][3] = w.w;
        }
        // The reads above (generic proxy) are done before the TMA (async
        // proxy) overwrites the stage: every lane's, so the warp syncs.
        fence_proxy_async();
        __syncwarp();
        tm_issue(k + C::TMS, st);
        math(s_begin + it * kTile, kc, vc, -1);
      }
    } else if constexpr (kPrefetch) {
      // Ping-pong: tile ow in (kc, vc) while tile ow + 1 loads into (kx, vx).
      auto step = [&](int it, int ow, uint32_t (&kc)[2][KW], uint32_t (&vc)[4][VW], uint32_t (&kx)[2][KW],
                      uint32_t (&vx)[4][VW]) {
        if (pf > 0) prefetch_tile(ow + pf);
        if (it + TS < ntiles) f_load(ow + 1, kx, vx);
        math(s_begin + it * kTile, kc, vc, -1);
      };
      for (int it = T0, ow = 0; it < ntiles; it += 2 * TS, ow += 2) {
        step(it, ow, kw, vw, kn, vn);
        if (it + TS >= ntiles) break;
        step(it + TS, ow + 1, kn, vn, kw, vw);
      }
    } else {
      for (int it = T0, ow = 0; it < ntiles; it += TS, ++ow) {
        if (pf > 0) prefetch_tile(ow + pf);
        const bool next = it + TS < ntiles;
        if constexpr (LEAN) {
          // F4: one register stage, refilled as it frees: the next tile's K
          // once the scores are done, its V after the last m-tile.
          math(s_begin + it * kTile, kw, vw, next ? ow + 1 : -1);
          if (next) f_load_v(k_next_off, vw);
        } else {
          math(s_begin + it * kTile, kw, vw, -1);
          if (next) f_load(ow + 1, kw, vw);
        }
      }
    }
  } else {
    for (int it = T0, ow = 0; it < ntiles; it += TS, ++ow) {
      const int j0 = s_begin + it * kTile;
      const bool has_next = it + TS < ntiles;
      if (pf > 0) prefetch_tile(ow + pf);
      uint32_t k2[2][KW], v2[4][VW];
      if constexpr (kPrefetch2) {
        if (it + 2 * TS < ntiles) load_tile(it + 2 * TS, k2, v2);
      } else if (kPrefetch && has_next) {
        load_tile(it + TS, kn, vn);
      }

      // S = Q K^T for keys j0 + nt*8 + (0..7).
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks_ = 0; ks_ < KS; ++ks_) {
          uint32_t b0, b1;
          if constexpr (DT == kBf16) {
            b0 = kw[nt][(ks_ / J) * 4 + 2 * (ks_ % J)];
            b1 = kw[nt][(ks_ / J) * 4 + 2 * (ks_ % J) + 1];
          } else {
            const uint32_t w = kw[nt][(ks_ / J) * 4 + (ks_ % J)];
            b0 = fp8x2_to_f16x2<DT>(w);
            b1 = fp8x2_to_f16x2<DT>(w >> 16);
          }
          mma16816<DT>(s[nt], qa[ks_][0], 0u, qa[ks_][1], 0u, b0, b1);
        }
      }
      // Scores in log2 units, masked outside [first, ctx).
      float x[2][2];
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + 2 * t + e;
          float v = s[nt][e] * score_mul;
          if (softcap) v = p.softcap * tanhf(v) * kLog2e;
          v = (j >= first && j < s_end) ? v : -INFINITY;
          x[nt][e] = v;
          mx = fmaxf(mx, v);
        }
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
      const float alpha_lo = __shfl_sync(0xffffffffu, alpha, (2 * t) * 4);  // heads 2t, 2t+1
      const float alpha_hi = __shfl_sync(0xffffffffu, alpha, (2 * t + 1) * 4);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        o[i][0] *= alpha_lo; o[i][1] *= alpha_hi; o[i][2] *= alpha_lo; o[i][3] *= alpha_hi;
      }
      const uint32_t pa0 = pack2<DT>(pr[0][0], pr[0][1]);
      const uint32_t pa2 = pack2<DT>(pr[1][0], pr[1][1]);

      // Zero V of keys outside [first, ctx): unwritten slots may hold NaN codes.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = j0 + vtok[i];
        if (j < first || j >= s_end)
#pragma unroll
          for (int w = 0; w < VW; ++w) vw[i][w] = 0u;
      }
      // O^T += V^T P^T: A = V^T (rows: dims, k: keys 2t,2t+1 | 2t+8,2t+9),
      // B = P^T, which is exactly this thread's probabilities (pa0, pa2).
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        uint32_t a0, a1, a2, a3;
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
          } else {
            const uint32_t sel = b | ((b + 4) << 4) | ((b + 1) << 8) | ((b + 5) << 12);
            const uint32_t w01 = __byte_perm(vw[0][i / 2], vw[1][i / 2], sel);
            const uint32_t w23 = __byte_perm(vw[2][i / 2], vw[3][i / 2], sel);
            a0 = fp8x2_to_f16x2<DT>(w01);
            a1 = fp8x2_to_f16x2<DT>(w01 >> 16);
            a2 = fp8x2_to_f16x2<DT>(w23);
            a3 = fp8x2_to_f16x2<DT>(w23 >> 16);
          }
        }
        mma16816<DT>(o[i], a0, a1, a2, a3, pa0, pa2);
      }
      if (has_next) {
        if constexpr (kPrefetch) {
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int w = 0; w < KW; ++w) kw[nt][w] = kn[nt][w];
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int w = 0; w < VW; ++w) vw[i][w] = vn[i][w];
          if constexpr (kPrefetch2) {
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
              for (int w = 0; w < KW; ++w) kn[nt][w] = k2[nt][w];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
              for (int w = 0; w < VW; ++w) vn[i][w] = v2[i][w];
          }
        } else {
          load_tile(it + TS, kw, vw);
        }
      }
    }
  }
  // Dependent (reduce) kernel may start launching: only epilogues remain.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  // Combine the 4 warps (fixed order). Each warp's partial O goes to its own
  // ring (no longer read): [kMaxGroup][D] floats.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (t == 0) { sm_m[warp * kMaxGroup + r] = m; sm_l[warp * kMaxGroup + r] = l; }
  {
    float* so = reinterpret_cast<float*>(smem + warp * C::RING);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int d = r * (D / 8) + 2 * i;
      *reinterpret_cast<float2*>(so + (2 * t) * D + d) = make_float2(o[i][0], o[i][2]);
      *reinterpret_cast<float2*>(so + (2 * t + 1) * D + d) = make_float2(o[i][1], o[i][3]);
    }
  }
  __syncthreads();
  const float vs = DT == kBf16 ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
  if constexpr (HPW) {
    // Each warp's heads are its own: its partial is final for this split.
    const float* so = reinterpret_cast<const float*>(smem + warp * C::RING);
    for (int idx = lane; idx < nh * D; idx += 32) {
      const int row = idx / D, d = idx % D;
      const float M = sm_m[warp * kMaxGroup + row], L = sm_l[warp * kMaxGroup + row], O = so[row * D + d];
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
  } else {
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
        O += reinterpret_cast<const float*>(smem + w * C::RING)[row * D + d] * f;
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
    if constexpr (FUSE) {
      if (nsplits > 1) fused_merge<D>(p, smem, b, h0, nh, nsplits);
    }
  }
}

template <int D, int DT, bool DEEP = false, bool LEAN = false, bool HPW = false, bool REG = false, bool FAST = false,
          bool FUSE = false>
__global__ void __launch_bounds__(kWarps * 32,
                                  LEAN ? 4 : FAST ? (D * (DT == kBf16 ? 2 : 1) <= 128 && !DEEP ? 3 : 2) : 0)
    decode_kernel(const DecodeParams p) {
  decode_body<D, DT, DEEP, LEAN, HPW, REG, FAST, FUSE, false>(p, nullptr, nullptr);
}

// TM's parameters: the tensor maps of the K and V caches (rows of
// num_kv_heads x 128 bytes, boxes of 16 rows x 128 bytes, 128-byte swizzle),
// passed as grid constants (the TMA instruction takes their address).
struct DecodeTmParams {
  DecodeParams p;
  CUtensorMap tmk, tmv;
};
__global__ void __launch_bounds__(kWarps * 32, 4) decode_kernel_tm(const __grid_constant__ DecodeTmParams q) {
  decode_body<128, kE4m3, false, false, false, false, true, false, true>(q.p, &q.tmk, &q.tmv);
}

// Combines the splits of one (sequence, head): out = sum_s w_s O_s / sum_s w_s,
// CW of the D columns per CTA (blockIdx.z = column chunk). 256 threads: R
// rows of CW/4 threads; row rho takes splits rho, rho+R, ... (float4 loads,
// several in flight), then the R partial sums are added in a fixed order.
// CW = D (default): one CTA per (sequence, head), R = 8 at D = 128.
// CW = 32 (FP8KV_DECODE_REDUCE=wide, version 8 variant): D/32 CTAs per head,
// R = 32, so a thread's chain of dependent-in-time loads is nsplits/32 long
// instead of nsplits/8 (B=1/64K: 49 splits, 2 loads instead of 7) and 4x
// more CTAs at small batches; another summation order (results differ from
// the default in rounding, within the bound; batched == single holds).
// (Version 7's fused variant, the combine in the decode kernel's last CTA
// per KV head, measured slower at every size in run H and was removed in
// version 8: docs/cuda.md.)
//
// Version 11: the context length is read before griddepcontrol.wait (a step
// input, copied before the step's first kernel, as decode_kernel reads it),
// and each thread's first PRE splits (log-sum-exp and float4 of partials) are
// loaded together with the log-sum-exps of the maximum, so the kernel waits
// on one round trip to the partials instead of three (the context length,
// the log-sum-exps, then the partials). Same sums in the same order: bitwise
// version 10's results (run P_4: 144 launches; GPU time 4.4% less at B=1/1K,
// the same elsewhere; docs/cuda.md "Decode v11").
template <int D, int CW = D>
__global__ void __launch_bounds__(kReduceThreads) decode_reduce_kernel(const DecodeParams p) {
  static_assert(D % CW == 0 && CW % 4 == 0 && kReduceThreads % (CW / 4) == 0, "column chunk");
  constexpr int TPS = CW / 4, R = kReduceThreads / TPS;
  __shared__ __align__(16) float red[R][CW];
  __shared__ float wsum[R], smax[kReduceThreads / 32];
  constexpr int PRE = 4;
  const int head = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, c0 = blockIdx.z * CW;
  const int ctx = p.context_lens[b];
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the decode kernel's results are visible
  // The next kernel (e.g. the engine's o_proj GEMV, PDL-launched: it
  // prefetches its weights before its own wait) may start now (version 10).
  if (p.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  int first, tstart, nsplits;
  seq_range(p, ctx, first, tstart, nsplits);
  if (nsplits <= 1) return;
  const int64_t base = (static_cast<int64_t>(b) * p.num_heads + head) * p.max_splits;
  const int rho = tid / TPS, col = tid % TPS;
  float pre_lse[PRE];
  float4 pre_o[PRE];
#pragma unroll
  for (int i = 0; i < PRE; ++i) {
    const int s = rho + i * R;
    pre_lse[i] = 0.0f;
    pre_o[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (s < nsplits) {
      pre_lse[i] = p.part_lse[base + s];
      pre_o[i] = *reinterpret_cast<const float4*>(p.part_o + (base + s) * D + c0 + col * 4);
    }
  }
  float M = -INFINITY;
  for (int s = tid; s < nsplits; s += kReduceThreads) M = fmaxf(M, p.part_lse[base + s]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if ((tid & 31) == 0) smax[tid >> 5] = M;
  __syncthreads();
  M = smax[0];
#pragma unroll
  for (int w = 1; w < kReduceThreads / 32; ++w) M = fmaxf(M, smax[w]);
  const float Mref = M == -INFINITY ? 0.0f : M;
  float W = 0.0f;
  float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < PRE; ++i) {
    if (rho + i * R < nsplits) {
      const float w = exp2f(pre_lse[i] - Mref);
      const float4 v = pre_o[i];
      W += w;
      O.x += w * v.x; O.y += w * v.y; O.z += w * v.z; O.w += w * v.w;
    }
  }
#pragma unroll 4
  for (int s = rho + PRE * R; s < nsplits; s += R) {
    const float w = exp2f(p.part_lse[base + s] - Mref);
    const float4 v = *reinterpret_cast<const float4*>(p.part_o + (base + s) * D + c0 + col * 4);
    W += w;
    O.x += w * v.x; O.y += w * v.y; O.z += w * v.z; O.w += w * v.w;
  }
  *reinterpret_cast<float4*>(&red[rho][col * 4]) = O;
  if (col == 0) wsum[rho] = W;
  __syncthreads();
  const int kvh = head / p.group;
  const float vs = p.v_scale == nullptr ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
  for (int d = tid; d < CW; d += kReduceThreads) {
    float Wt = 0.0f, Ot = 0.0f;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      Wt += wsum[i];
      Ot += red[i][d];
    }
    store_act(p.out, (static_cast<int64_t>(b) * p.num_heads + head) * D + c0 + d, Wt > 0.0f ? Ot / Wt * vs : 0.0f,
              p.out_bf16);
  }
}

// One FP8KV_DECODE_* switch (the callers below keep its value in a
// function-local static: read once per process): `unset` when the variable
// is unset or empty, else the value of the first of `choices` whose text it
// equals, else `other`.
int env_choice(const char* name, int unset, std::initializer_list<std::pair<const char*, int>> choices, int other) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == 0) return unset;
  for (const auto& [text, v] : choices)
    if (std::strcmp(e, text) == 0) return v;
  return other;
}

// FP8KV_DECODE_DEEP selects the DEEP variant at D = 128 for measurement
// (scripts/gpu_cuda.sh and gpu_decode.sh run the decode tests and the
// benchmark with it too): "1" for bf16 and e4m3, "bf16" for bf16 only (e4m3
// measured slower with it, run D). Read once per process.
// Defaults when a variable is unset (version 6: chosen from the H200 run,
// docs/cuda.md); "0" turns a variant off.
constexpr int kDefaultDeep = 2;         // 0 off, 1 bf16 + e4m3, 2 bf16 only
constexpr int kDefaultLean = 2;         // 0 off, 1 always (e4m3 d128), 2 auto (see launch_decode_t)
constexpr int kDefaultL2PrefetchBf16 = 0;  // tiles per warp (register path)
constexpr int kDefaultL2PrefetchFp8 = 0;   // every fp8 D (D = 256 too since decode v12); LEAN implies at least 2
int deep_env() {  // 0 off, 1 all, 2 bf16 only
  static const int v = env_choice("FP8KV_DECODE_DEEP", kDefaultDeep, {{"1", 1}, {"bf16", 2}}, 0);
  return v;
}
template <int DT>
bool deep_pipeline() {
  const int v = deep_env();
  return v == 1 || (v == 2 && DT == kBf16);
}
// FP8KV_DECODE_PF=n (0-8): the register path's L2 prefetch distance in tiles
// per warp (DecodeParams::l2_prefetch); 0 = off. Read once per process.
// FP8KV_DECODE_PF=n applies to every dtype; unset: the per-dtype defaults
// above (at least 2 for an e4m3 LEAN kernel).
int lean_mode() {
  static const int v = env_choice("FP8KV_DECODE_LEAN", kDefaultLean, {{"1", 1}, {"auto", 2}}, 0);
  return v;
}
bool lean_env() { return lean_mode() == 1; }
int l2_prefetch_env_value() {  // -1: unset
  static const int env = [] {
    const char* e = std::getenv("FP8KV_DECODE_PF");
    return e != nullptr && *e ? std::clamp(std::atoi(e), 0, 8) : -1;
  }();
  return env;
}
// FP8KV_DECODE_HPW=1: the heads-per-warp kernel (HPW) where it applies
// (use_hpw; version 7 variant).
constexpr bool kDefaultHpw = false;
bool hpw_env() {
  static const bool on = env_choice("FP8KV_DECODE_HPW", kDefaultHpw, {{"1", 1}}, 0) != 0;
  return on;
}
bool use_hpw(int head_dim, int num_heads, int num_kv_heads) {
  return hpw_env() && head_dim == 128 && num_kv_heads % kWarps == 0 && num_heads / num_kv_heads <= kMaxGroup;
}
// FP8KV_DECODE_D256REG (unset or "1": on; "0": off): fp8 D = 256 on the
// register path (REG); no L2 prefetch since decode v12 (2 tiles ahead
// before) unless FP8KV_DECODE_PF says otherwise.
// On by default (version 7, run H: fp8 d256 0.71-0.75x -> 0.46-0.58x SDPA,
// B=32/16K 902.4 -> 576.4 us); "0" selects the cp.async ring.
constexpr bool kDefaultD256Reg = true;
bool d256_reg_env() {
  static const bool on = env_choice("FP8KV_DECODE_D256REG", kDefaultD256Reg, {{"0", 0}}, 1) != 0;
  return on;
}
// FP8KV_DECODE_REDUCE=wide: the split reduction with 32 columns per CTA
// (decode_reduce_kernel<D, 32>; version 8 variant, off by default).
constexpr bool kDefaultReduceWide = false;
bool reduce_wide_env() {
  static const bool on = env_choice("FP8KV_DECODE_REDUCE", kDefaultReduceWide, {{"wide", 1}}, 0) != 0;
  return on;
}
// FP8KV_DECODE_V9 (version 9 variants; see decode_kernel):
// "1" the FAST kernels where instantiated (kHasFast), "0" (or anything else)
// the version-8 kernels. A bit set: kV9Fp8 (FAST fp8 e4m3 d128), kV9Bf16
// (FAST bf16 d128), kV9D256 (FAST fp8 e4m3 d256); kDefaultV9 applies when the
// variable is unset. (Version 9's "ring", fp8 d128 on a cp.async ring,
// measured 21-23% slower, is gone since decode v13, with its template flag.)
constexpr int kV9Fp8 = 1, kV9Bf16 = 2, kV9D256 = 4;
// Version 10: also e5m2 d128, every dtype at D = 64 and e5m2 d256 (REG),
// behind kV9Rest (FP8KV_DECODE_V9=all; not a default until measured): every
// register-path kernel of the default pipelines has a FAST form.
template <int D, int DT>
constexpr bool kHasFast = D == 64 || D == 128 || (D == 256 && DT != kBf16);
// Version 10: kV9Rest, FAST for the other register-path kernels (e5m2 d128
// and d256, D = 64 every dtype); "all" = every FAST bit (not ring).
constexpr int kV9Rest = 16;
// Default since run L of the eighth session (2026-12-01; docs/cuda.md "Decode
// v9"): the FAST kernels for fp8 e4m3 d128 (1.025-1.061x), bf16 d128
// (1.001-1.002x) and fp8 e4m3 d256 (1.017x); decode tests pass under them.
constexpr int kDefaultV9 = kV9Fp8 | kV9Bf16 | kV9D256;
int v9_mode() {
  static const int v = env_choice("FP8KV_DECODE_V9", kDefaultV9,
                                  {{"1", kV9Fp8 | kV9Bf16 | kV9D256},
                                   {"all", kV9Fp8 | kV9Bf16 | kV9D256 | kV9Rest}},
                                  0);
  return v;
}
template <int D, int DT>
bool v9_fast() {  // the FAST kernel of (D, DT), when instantiated
  const int v = v9_mode();
  if constexpr (D == 128 && DT == kE4m3) return (v & kV9Fp8) != 0;
  if constexpr (D == 128 && DT == kBf16) return (v & kV9Bf16) != 0;
  if constexpr (D == 256 && DT == kE4m3) return (v & kV9D256) != 0;
  if constexpr (kHasFast<D, DT>) return (v & kV9Rest) != 0;
  return false;
}
// FP8KV_DECODE_F4 (decode v13): where fp8 e4m3 d128 would run FAST, "1"
// runs F4 (FAST at 4 CTAs per SM) always, "0" never (FAST, and LEAN auto as
// before decode v13), unset, "auto" or anything else: the default, kF4Auto,
// where FAST's plan needs more than one wave: the plan is then made for F4's
// 4 CTAs per SM (plan_decode), and a grid above one FAST wave launches F4
// (docs/cuda.md "Decode v13": run R_6, B >= 32 rows 1.012x, B=64/16K 1.043x).
constexpr int kF4Off = 0, kF4On = 1, kF4Auto = 2;
constexpr int kDefaultF4 = kF4Auto;
int f4_mode() {
  static const int v =
      env_choice("FP8KV_DECODE_F4", kDefaultF4, {{"0", kF4Off}, {"1", kF4On}, {"auto", kF4Auto}}, kDefaultF4);
  return v;
}
// FP8KV_DECODE_TM (decode v14): "1" fp8 e4m3 d128 runs the TM kernel
// (decode_kernel_tm) wherever it would run FAST or F4, planned at TM's
// occupancy; "auto" (kTmAuto) TM where F4 auto would run F4 (grids above one
// FAST wave); "0" never. Unset or anything else: kDefaultTm, off: run S_4
// measured TM auto at 1.016x F4 auto over the B >= 32 rows by the isolated
// call but 1.009x by the stream method, short of the 1.01 its rule asked of
// both (docs/cuda.md "Decode v14"). Never with FUSE; FAST or F4 when the
// tensor maps cannot be made (no encoder in the driver, or a cache of
// unknown size). (Run S_3 also measured 3 stages per
// warp, 0.96-1.02x, and 5 CTAs per SM, which spills at 96 registers:
// 0.75-0.90x; both removed.)
constexpr int kTmOff = 0, kTmOn = 1, kTmAuto = 2;
constexpr int kDefaultTm = kTmOff;
int tm_mode() {
  static const int v =
      env_choice("FP8KV_DECODE_TM", kDefaultTm, {{"0", kTmOff}, {"1", kTmOn}, {"auto", kTmAuto}}, kDefaultTm);
  return v;
}
// FP8KV_DECODE_FUSE (version 10 variant, see fused_merge): "1" the FAST
// kernels merge the splits in their last CTA per (sequence, KV head, chunk)
// (no reduce kernel); "0" off. set_decode_fuse_override (kernels.h, for
// tests) overrides the variable at run time.
constexpr bool kDefaultFuse = false;
std::atomic<int> g_fuse_override{-1};
bool fuse_env() {
  const int o = g_fuse_override.load(std::memory_order_relaxed);
  if (o >= 0) return o != 0;
  static const bool on = env_choice("FP8KV_DECODE_FUSE", kDefaultFuse, {{"1", 1}}, 0) != 0;
  return on;
}
// FP8KV_DECODE_PDL (version 10; "1": on, unset or "0": off): the decode
// kernel launched with programmatic stream serialization, and the reduce
// kernel letting its dependent launch early (griddepcontrol.launch_dependents
// after its wait). Off: both as in version 9. Off by default since the
// ninth session's final run (docs/cuda.md "PDL for the decode kernel"): the
// engine's batch-1 1K step was 0.8% slower with it (three process pairs),
// 60K 0.6% faster; the flip rule written before the run asked for <= 0.5%.
constexpr bool kDefaultPdl = false;
bool pdl_env() {
  static const bool on = env_choice("FP8KV_DECODE_PDL", kDefaultPdl, {{"0", 0}}, 1) != 0;
  return on;
}
constexpr bool kDefaultL2PrefetchPair = false;
bool l2_prefetch_pair_env() {
  static const bool on = env_choice("FP8KV_DECODE_PFPAIR", kDefaultL2PrefetchPair, {{"1", 1}}, 0) != 0;
  return on;
}
int l2_prefetch_for(KvDtype dt, int head_dim) {
  const int env = l2_prefetch_env_value();
  if (env >= 0) return env;
  if (dt == KvDtype::bf16) return kDefaultL2PrefetchBf16;
  // (D = 256 on the register path ran 2 tiles ahead from version 7 to decode
  // v12; without it: e4m3 1.034-1.037x over the d256 rows, runs Q_3 and Q_5,
  // where the prefetch had every byte cross the L2 twice and the L2 ran at 95%
  // of its throughput; e5m2 1.013x, run Q_6. docs/cuda.md "Decode v12".)
  const bool lean = dt == KvDtype::fp8_e4m3 && head_dim == 128 && lean_env();
  return lean ? std::max(2, kDefaultL2PrefetchFp8) : kDefaultL2PrefetchFp8;
}
template <int D, int DT>
constexpr bool kHasDeep = D == 128 && DT != kE5m2;
// The pipeline variant of one (D, dtype): 0 default, 1 DEEP, 2 LEAN.
// LEAN only for e4m3: bf16 tiles (64 registers) spill under 128 registers.
template <int D, int DT>
int pipeline_variant() {
  if constexpr (kHasDeep<D, DT>) {
    if (DT == kE4m3 && lean_env()) return 2;
    if (deep_pipeline<DT>()) return 1;
  }
  return 0;
}

// One-time kernel attributes (dynamic shared memory above 48 KB, carveout),
// needed before a launch and before an occupancy query.
// Kernel attributes are per device: set once per device (TP ranks are threads
// of one process, one GPU each), by set_func_attribute_once (common.cuh).
template <int D, int DT, bool DEEP, bool LEAN, bool HPW = false, bool REG = false, bool FAST = false,
          bool FUSE = false>
void prepare_decode_t() {
  constexpr int smem = DecodeCfg<D, DT, REG>::SMEM;
  set_func_attribute_once(decode_kernel<D, DT, DEEP, LEAN, HPW, REG, FAST, FUSE>,
                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  // All of the unified L1 as shared memory for the ring (so 2 CTAs of 96 KB
  // fit per SM).
  if constexpr (DecodeCfg<D, DT, REG>::USE_RING)
    set_func_attribute_once(decode_kernel<D, DT, DEEP, LEAN, HPW, REG, FAST, FUSE>,
                            cudaFuncAttributePreferredSharedMemoryCarveout,
                            cudaSharedmemCarveoutMaxShared);
}

// Launches one decode kernel: with programmatic stream serialization when
// p.pdl (FP8KV_DECODE_PDL, version 10), so it may start while the previous
// kernel drains (griddepcontrol.wait in the kernel orders its reads and
// writes); stream capture keeps the attribute as a programmatic edge.
template <typename K>
void launch_decode_kernel(K kernel, dim3 grid, int smem, cudaStream_t stream, const DecodeParams& p) {
  FP8KV_CUDA_CHECK(launch_maybe_pdl(p.pdl, kernel, grid, dim3(kWarps * 32), smem, stream, p));
}

// Returns whether the kernel merged the splits itself (FUSE: a FAST kernel
// with p.fuse set; then no reduce kernel runs).
template <int D, int DT, bool DEEP, bool LEAN, bool HPW = false, bool REG = false, bool FAST = false>
bool launch_decode_tv(const DecodeParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = DecodeCfg<D, DT, REG>::SMEM;
  if constexpr (FAST && D >= 128) {  // (D = 64: R = 16 chains would not fit the registers; the reduce kernel)
    if (p.fuse) {
      prepare_decode_t<D, DT, DEEP, LEAN, HPW, REG, FAST, true>();
      launch_decode_kernel(decode_kernel<D, DT, DEEP, LEAN, HPW, REG, FAST, true>, grid, smem, stream, p);
      return true;
    }
  }
  prepare_decode_t<D, DT, DEEP, LEAN, HPW, REG, FAST>();
  launch_decode_kernel(decode_kernel<D, DT, DEEP, LEAN, HPW, REG, FAST>, grid, smem, stream, p);
  return false;
}

template <int D, int DT, bool DEEP, bool LEAN, bool HPW = false, bool REG = false, bool FAST = false>
int resident_ctas_t();

// TM: the kernel's attributes (all of the unified L1 as shared memory: 4 CTAs
// of 34 KB), and its tensor maps, made once per (cache, rows, row bytes) and
// kept (an engine's caches live as long as the process; a few hundred bytes
// each, the table cleared past 4,096 entries).
using TmCfg = DecodeCfg<128, kE4m3, false, true>;
void prepare_decode_tm() {
  set_func_attribute_once(decode_kernel_tm, cudaFuncAttributeMaxDynamicSharedMemorySize, TmCfg::SMEM);
  set_func_attribute_once(decode_kernel_tm, cudaFuncAttributePreferredSharedMemoryCarveout,
                          cudaSharedmemCarveoutMaxShared);
}
bool tm_map_for(const uint8_t* base, int64_t rows, int64_t row_bytes, CUtensorMap* out) {
  struct Entry {
    const uint8_t* base;
    int64_t rows, row_bytes;
    CUtensorMap map;
  };
  static std::mutex mu;
  static std::vector<Entry> table;
  std::lock_guard<std::mutex> lock(mu);
  for (const Entry& e : table)
    if (e.base == base && e.rows == rows && e.row_bytes == row_bytes) {
      *out = e.map;
      return true;
    }
  Entry e{base, rows, row_bytes, {}};
  if (!encode_row_tensor_map(&e.map, base, static_cast<uint64_t>(row_bytes), static_cast<uint64_t>(rows), 128, kTile,
                             true, nullptr))
    return false;
  if (table.size() >= 4096) table.clear();
  table.push_back(e);
  *out = e.map;
  return true;
}
// Launches TM; false (nothing launched) when its maps cannot be made.
bool launch_decode_tm(const DecodeParams& p, dim3 grid, cudaStream_t stream) {
  if (p.cache_rows <= 0 || p.cache_rows > INT32_MAX) return false;
  DecodeTmParams q;
  q.p = p;
  const int64_t row_bytes = static_cast<int64_t>(p.num_kv_heads) * 128;
  if (!tm_map_for(p.k_cache, p.cache_rows, row_bytes, &q.tmk) ||
      !tm_map_for(p.v_cache, p.cache_rows, row_bytes, &q.tmv))
    return false;
  prepare_decode_tm();
  FP8KV_CUDA_CHECK(launch_maybe_pdl(p.pdl, decode_kernel_tm, grid, dim3(kWarps * 32), TmCfg::SMEM, stream, q));
  return true;
}
// Resident CTAs per SM of `kernel` with `smem` bytes of dynamic shared
// memory (occupancy API), after prepare() (its attributes); 0 when it cannot
// be asked (no device). Cached per device in `cache` (thread-safe: atomics;
// 0 = not asked yet).
template <class Prepare, class Kernel>
int cached_resident_ctas(std::array<std::atomic<int>, 64>& cache, Prepare prepare, Kernel kernel, int smem) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  const bool cached = dev >= 0 && dev < static_cast<int>(cache.size());
  if (cached) {
    const int n = cache[dev].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int c = 0;
  bool ok = false;
  try {
    prepare();
    ok = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, kernel, kWarps * 32, smem) == cudaSuccess;
  } catch (const std::runtime_error&) {
  }
  if (!ok) {
    (void)cudaGetLastError();  // the failed query must not surface at the next launch check
    return 0;
  }
  if (cached) cache[dev].store(c, std::memory_order_relaxed);
  return c;
}
int resident_ctas_tm() {
  static std::array<std::atomic<int>, 64> cache{};
  return cached_resident_ctas(cache, prepare_decode_tm, decode_kernel_tm, TmCfg::SMEM);
}

// FAST instantiations (version 9, FP8KV_DECODE_V9=1): the defaults of e4m3
// d128 (3 CTAs per SM), bf16 d128 (DEEP) and e4m3 d256 (REG); kHasFast
// (with the FP8KV_DECODE_V9 bits above) lists every one.

// HPW instantiation (D = 128): the DEEP pipeline for bf16 (its default), the
// default one for fp8.
template <int D, int DT>
constexpr bool kHpwDeep = DT == kBf16;

template <int D, int DT>
bool launch_decode_t(const DecodeParams& p, dim3 grid, cudaStream_t stream, bool hpw) {
  if constexpr (D == 256 && DT != kBf16) {
    if constexpr (kHasFast<D, DT>) {
      if (d256_reg_env() && v9_fast<D, DT>()) return launch_decode_tv<D, DT, false, false, false, true, true>(p, grid, stream);
    }
    if (d256_reg_env()) return launch_decode_tv<D, DT, false, false, false, true>(p, grid, stream);
  }
  if constexpr (D == 128) {
    if (hpw) {
      return launch_decode_tv<D, DT, kHpwDeep<D, DT>, false, true>(p, grid, stream);
    }
  }
  if constexpr (D == 128 && DT == kE4m3) {
    // LEAN auto (version 6, run F): a grid of more than one wave at the
    // default's 3 CTAs per SM that fits one wave at LEAN's 4 (B=64 at 1K:
    // 512 CTAs, 64.9 -> 52.7 us) runs LEAN with the L2 prefetch 2 ahead as
    // measured. Same tile order and arithmetic: bitwise the same results.
    // (Only with F4 off: F4 covers these grids.)
    const bool f4_or_tm = f4_mode() != kF4Off || tm_mode() == kTmOn;
    if (lean_mode() == 2 && pipeline_variant<D, DT>() == 0 && !(f4_or_tm && v9_fast<D, DT>())) {
      const int64_t ctas = static_cast<int64_t>(grid.x) * grid.y * grid.z;
      const int64_t sms = device_sm_count();
      const int r0 = resident_ctas_t<D, DT, false, false>(), r1 = resident_ctas_t<D, DT, false, true>();
      if (r0 > 0 && r1 > r0 && ctas > sms * r0 && ctas <= sms * r1) {
        DecodeParams q = p;
        if (l2_prefetch_env_value() < 0) q.l2_prefetch = std::max(2, q.l2_prefetch);
        return launch_decode_tv<D, DT, false, true>(q, grid, stream);
      }
    }
  }
  if constexpr (D == 64) {
    if (v9_fast<D, DT>()) return launch_decode_tv<D, DT, false, false, false, false, true>(p, grid, stream);
  }
  if constexpr (D == 128 && kHasFast<D, DT>) {
    if (v9_fast<D, DT>()) {
      const int v = pipeline_variant<D, DT>();
      if constexpr (DT == kBf16) {
        if (v == 1) return launch_decode_tv<D, DT, true, false, false, false, true>(p, grid, stream);
      } else {
        if (v == 0) {
          if constexpr (DT == kE4m3) {
            const int tm = tm_mode();
            if (tm == kTmOn && !p.fuse && launch_decode_tm(p, grid, stream)) return false;
            const int m = f4_mode();
            if (m == kF4On || (m == kF4Auto && static_cast<int64_t>(grid.x) * grid.y * grid.z >
                                                   static_cast<int64_t>(device_sm_count()) *
                                                       resident_ctas_t<D, DT, false, false, false, false, true>())) {
              // TM auto: TM in F4 auto's band (same plan: 4 CTAs per SM).
              if (m == kF4Auto && tm == kTmAuto && !p.fuse && launch_decode_tm(p, grid, stream)) return false;
              return launch_decode_tv<D, DT, false, true, false, false, true>(p, grid, stream);
            }
          }
          return launch_decode_tv<D, DT, false, false, false, false, true>(p, grid, stream);
        }
      }
    }
  }
  if constexpr (kHasDeep<D, DT>) {
    switch (pipeline_variant<D, DT>()) {
      case 1: return launch_decode_tv<D, DT, true, false>(p, grid, stream);
      case 2:
        if constexpr (DT == kE4m3) return launch_decode_tv<D, DT, false, true>(p, grid, stream);
        break;
      default: break;
    }
  }
  return launch_decode_tv<D, DT, false, false>(p, grid, stream);
}

// Resident decode CTAs per SM (occupancy API) of one instantiation on the
// current device; 0 when it cannot be asked (no device). Cached per
// instantiation and device (thread-safe: atomics).
template <int D, int DT, bool DEEP, bool LEAN, bool HPW, bool REG, bool FAST>
int resident_ctas_t() {
  static std::array<std::atomic<int>, 64> cache{};
  return cached_resident_ctas(cache, [] { prepare_decode_t<D, DT, DEEP, LEAN, HPW, REG, FAST>(); },
                              decode_kernel<D, DT, DEEP, LEAN, HPW, REG, FAST>, DecodeCfg<D, DT, REG>::SMEM);
}

template <int D, int DT>
int resident_ctas_v(bool hpw) {
  if constexpr (D == 256 && DT != kBf16) {
    if constexpr (kHasFast<D, DT>) {
      if (d256_reg_env() && v9_fast<D, DT>()) return resident_ctas_t<D, DT, false, false, false, true, true>();
    }
    if (d256_reg_env()) return resident_ctas_t<D, DT, false, false, false, true>();
  }
  if constexpr (D == 128) {
    if (hpw) return resident_ctas_t<D, DT, kHpwDeep<D, DT>, false, true>();
  }
  if constexpr (D == 64) {
    if (v9_fast<D, DT>()) return resident_ctas_t<D, DT, false, false, false, false, true>();
  }
  if constexpr (D == 128 && kHasFast<D, DT>) {
    if (v9_fast<D, DT>()) {
      const int v = pipeline_variant<D, DT>();
      if constexpr (DT == kBf16) {
        if (v == 1) return resident_ctas_t<D, DT, true, false, false, false, true>();
      } else {
        if (v == 0) {
          if constexpr (DT == kE4m3) {
            if (tm_mode() == kTmOn) return resident_ctas_tm();
            if (f4_mode() == kF4On) return resident_ctas_t<D, DT, false, true, false, false, true>();
          }
          return resident_ctas_t<D, DT, false, false, false, false, true>();
        }
      }
    }
  }
  if constexpr (kHasDeep<D, DT>) {
    switch (pipeline_variant<D, DT>()) {
      case 1: return resident_ctas_t<D, DT, true, false>();
      case 2:
        if constexpr (DT == kE4m3) return resident_ctas_t<D, DT, false, true>();
        return 0;
      default: break;
    }
  }
  return resident_ctas_t<D, DT, false, false>();
}

template <int D>
int resident_ctas_d(KvDtype dt, bool hpw) {
  switch (dt) {
    case KvDtype::bf16: return resident_ctas_v<D, kBf16>(hpw);
    case KvDtype::fp8_e4m3: return resident_ctas_v<D, kE4m3>(hpw);
    case KvDtype::fp8_e5m2: return resident_ctas_v<D, kE5m2>(hpw);
  }
  return 0;
}

int resident_ctas(int head_dim, KvDtype dt, bool hpw) {
  switch (head_dim) {
    case 64: return resident_ctas_d<64>(dt, false);
    case 128: return resident_ctas_d<128>(dt, hpw);
    case 256: return resident_ctas_d<256>(dt, false);
  }
  return 0;
}

template <int D>
void launch_decode(const DecodeParams& p, KvDtype dt, dim3 grid, int batch, cudaStream_t stream, bool hpw) {
  bool fused = false;
  switch (dt) {
    case KvDtype::bf16: fused = launch_decode_t<D, kBf16>(p, grid, stream, hpw); break;
    case KvDtype::fp8_e4m3: fused = launch_decode_t<D, kE4m3>(p, grid, stream, hpw); break;
    case KvDtype::fp8_e5m2: fused = launch_decode_t<D, kE5m2>(p, grid, stream, hpw); break;
  }
  FP8KV_CUDA_CHECK(cudaGetLastError());
  if (p.max_splits > 1 && !fused) {
    // Programmatic dependent launch: the reduce grid is set up while the
    // decode grid drains; griddepcontrol.wait in it orders the reads.
    constexpr int kWideCols = 32;
    const bool wide = reduce_wide_env();
    FP8KV_CUDA_CHECK(launch_maybe_pdl(true, wide ? decode_reduce_kernel<D, kWideCols> : decode_reduce_kernel<D>,
                                      dim3(p.num_heads, batch, wide ? D / kWideCols : 1), dim3(kReduceThreads), 0,
                                      stream, p));
  }
}

int span_tokens(int max_context_len, int window) {
  return window > 0 ? std::min(max_context_len, window + kTile - 1) : max_context_len;
}

// Number of splits by a wave model (docs/cuda.md, version 5). With `slots`
// CTAs resident at once on the GPU, a grid of base * n CTAs runs in
// ceil(base * n / slots) waves, each as long as one CTA: its split's tiles per
// warp (split / 64) plus a fixed cost kCtaOverheadTiles (prologue: Q load and
// the first tile's latency; epilogue: the 4-warp combine and partial write),
// plus kReduceTiles once when there is a reduce kernel. Fitted to the
// 2026-11-30 split sweep at B=1/16K (time ~ 12 us + 1.0 us per tile,
// overhead ~6 tiles). Ties go to fewer splits (less reduce work).
constexpr int kCtaOverheadTiles = 6;
constexpr int kReduceTiles = 3;

// kpu: keys per tile unit of one CTA (64: 4 warps take 16-key tiles in turn;
// 16 under HPW, where one warp walks every tile of its head).
int choose_split_tokens(int64_t base, int span, int64_t slots, int kpu) {
  const int64_t max_n = std::min<int64_t>((span + 63) / 64, std::max<int64_t>(1, (8 * slots + base - 1) / base));
  int best_split = (span + 63) / 64 * 64;
  int64_t best_cost = -1;
  for (int64_t n = 1; n <= max_n; ++n) {
    const int64_t split = ((span + n - 1) / n + 63) / 64 * 64;
    const int64_t n_eff = (span + split - 1) / split;
    if (n > 1 && split == best_split) continue;
    const int64_t waves = (base * n_eff + slots - 1) / slots;
    const int64_t cost = waves * (split / kpu + kCtaOverheadTiles) + (n_eff > 1 ? kReduceTiles : 0);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_split = static_cast<int>(split);
    }
  }
  return best_split;
}

// Workspace: partial outputs [batch][heads][splits][D] and log-sum-exps
// [batch][heads][splits] (floats), then (8-byte aligned) the fused merge's
// split counters (FUSE, version 10), one 64-bit word per CTA column: batch x
// KV heads x head chunks of them (version 7 had the same layout).
size_t split_counters_offset(int batch, int num_heads, int max_splits, int head_dim) {
  const size_t partials = static_cast<size_t>(batch) * num_heads * max_splits * (head_dim + 1) * sizeof(float);
  return (partials + 7) / 8 * 8;
}
size_t workspace_for(int batch, int num_heads, int num_kv_heads, int max_splits, int head_dim) {
  const int gchunks = (num_heads / num_kv_heads + kMaxGroup - 1) / kMaxGroup;
  return split_counters_offset(batch, num_heads, max_splits, head_dim) +
         static_cast<size_t>(batch) * num_kv_heads * gchunks * sizeof(unsigned long long);
}

// The fused merge's counter tag (48 bits, fixed): a counter word is valid
// iff its upper 48 bits are this tag (see fused_merge).
constexpr unsigned long long kCounterTag = 0x5ec0de5eed42ull;

// F4 auto (decode v13): F4's resident CTAs per SM where a plan may count
// them (fp8 e4m3 d128 on FAST, FP8KV_DECODE_F4 auto), else 0.
int f4_auto_resident(int head_dim, KvDtype dt, bool hpw) {
  if (head_dim != 128 || dt != KvDtype::fp8_e4m3 || hpw || f4_mode() != kF4Auto || tm_mode() == kTmOn ||
      !v9_fast<128, kE4m3>() || pipeline_variant<128, kE4m3>() != 0)
    return 0;
  return resident_ctas_t<128, kE4m3, false, true, false, false, true>();
}

}  // namespace

DecodePlan plan_decode(int batch, int num_heads, int num_kv_heads, int head_dim, int max_context_len, int window,
                       int num_sms, int split_tokens, int ctas_per_sm, KvDtype dtype) {
  if (batch <= 0 || num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || max_context_len < 0)
    throw std::invalid_argument("plan_decode: bad shape (batch " + std::to_string(batch) + ", heads " +
                                std::to_string(num_heads) + "/" + std::to_string(num_kv_heads) + ")");
  const int span = std::max(1, span_tokens(max_context_len, window));
  const int gchunks = (num_heads / num_kv_heads + kMaxGroup - 1) / kMaxGroup;
  if (split_tokens <= 0) {
    // Fill every SM with its resident CTAs (occupancy API; 3 per SM when no
    // device answers: fp8 d128 at 167 registers), in as few and as full waves
    // as the wave model above finds.
    const bool hpw = use_hpw(head_dim, num_heads, num_kv_heads);
    const bool occupancy = ctas_per_sm <= 0;
    if (occupancy) ctas_per_sm = resident_ctas(head_dim, dtype, hpw);
    if (ctas_per_sm <= 0) ctas_per_sm = 3;
    const int64_t base = static_cast<int64_t>(batch) * (hpw ? num_kv_heads / kWarps : num_kv_heads * gchunks);
    const int64_t slots = static_cast<int64_t>(std::max(1, num_sms)) * ctas_per_sm;
    const int kpu = hpw ? kTile : kWarps * kTile;
    split_tokens = choose_split_tokens(base, span, slots, kpu);
    // F4 auto: a plan of more than one wave at FAST's occupancy is made again
    // for F4's, and runs F4 (launch_decode_t: its grid exceeds a FAST wave).
    if (occupancy) {
      const int r4 = f4_auto_resident(head_dim, dtype, hpw);
      if (r4 > ctas_per_sm && base * ((span + split_tokens - 1) / split_tokens) > slots)
        split_tokens = choose_split_tokens(base, span, static_cast<int64_t>(std::max(1, num_sms)) * r4, kpu);
    }
  }
  DecodePlan plan;
  plan.split_tokens = (split_tokens + 63) / 64 * 64;
  plan.max_splits = (span + plan.split_tokens - 1) / plan.split_tokens;
  if (plan.max_splits > 1) plan.workspace_bytes = workspace_for(batch, num_heads, num_kv_heads, plan.max_splits, head_dim);
  return plan;
}

void set_decode_fuse_override(int v) { g_fuse_override.store(v < 0 ? -1 : v != 0, std::memory_order_relaxed); }

void paged_decode(const DecodeArgs& a, cudaStream_t stream) {
  const KvCacheLayout& L = a.kv.layout;
  if (L.head_dim != 64 && L.head_dim != 128 && L.head_dim != 256)
    throw std::invalid_argument("paged_decode: head_dim must be 64, 128 or 256, got " + std::to_string(L.head_dim));
  if (L.block_size <= 0 || L.block_size % kTile != 0)
    throw std::invalid_argument("paged_decode: block_size must be a multiple of 16, got " + std::to_string(L.block_size));
  if (a.num_heads <= 0 || L.num_kv_heads <= 0 || a.num_heads % L.num_kv_heads != 0)
    throw std::invalid_argument("paged_decode: num_heads must be a multiple of num_kv_heads");
  if (a.batch <= 0) return;
  if (!a.q || !a.out || !a.kv.k_cache || !a.kv.v_cache || !a.kv.block_tables || !a.kv.context_lens)
    throw std::invalid_argument("paged_decode: null pointer argument");
  if (a.plan.split_tokens <= 0 || a.plan.split_tokens % 64 != 0)
    throw std::invalid_argument("paged_decode: plan.split_tokens must be a positive multiple of 64 (use plan_decode)");
  const int span = span_tokens(a.max_context_len, a.window);
  if (static_cast<int64_t>(a.plan.max_splits) * a.plan.split_tokens < span)
    throw std::invalid_argument("paged_decode: plan does not cover max_context_len (use plan_decode)");
  if (a.plan.max_splits > 1 && (!a.workspace || a.plan.workspace_bytes == 0))
    throw std::invalid_argument("paged_decode: plan needs a workspace of plan.workspace_bytes");
  const bool fp8 = kv_dtype_is_fp8(L.dtype);
  if (fp8 && (!a.kv.k_scale.values || !a.kv.v_scale.values))
    throw std::invalid_argument("paged_decode: fp8 cache needs k/v scales");
  DecodeParams p{};
  fill_paged_params(p, a);
  p.gchunks = (p.group + kMaxGroup - 1) / kMaxGroup;
  p.split_tokens = a.plan.split_tokens;
  p.max_splits = a.plan.max_splits;
  p.l2_prefetch = l2_prefetch_for(L.dtype, L.head_dim);
  p.pdl = pdl_env();
  p.cache_rows = static_cast<int64_t>(L.num_blocks) * L.block_size;
  const bool hpw = use_hpw(L.head_dim, a.num_heads, L.num_kv_heads);
  const int ctas_x = hpw ? L.num_kv_heads / kWarps : L.num_kv_heads * p.gchunks;
  p.l2_prefetch_pair = p.l2_prefetch > 0 && L.num_kv_heads % 2 == 0 && l2_prefetch_pair_env();
  if (p.max_splits > 1) {
    p.part_o = static_cast<float*>(a.workspace);
    p.part_lse = p.part_o + static_cast<size_t>(a.batch) * a.num_heads * p.max_splits * L.head_dim;
    // Fused merge (FUSE, version 10 variant): counters after the partials;
    // the weights of <= kMaxGroup heads x max_splits go in the CTA's shared
    // memory (at least kWarps x kMaxGroup x D floats at every D); the
    // workspace must hold the counters (a plan from this plan_decode does).
    const int heads_per_cta = std::min(p.group, kMaxGroup);
    p.fuse = !hpw && fuse_env() && L.head_dim >= 128 && p.max_splits < 65536 &&
             static_cast<int64_t>(heads_per_cta) * p.max_splits <= static_cast<int64_t>(kWarps) * kMaxGroup * L.head_dim &&
             a.plan.workspace_bytes >= workspace_for(a.batch, a.num_heads, L.num_kv_heads, p.max_splits, L.head_dim);
    if (p.fuse) {
      p.split_counters = reinterpret_cast<unsigned long long*>(
          static_cast<uint8_t*>(a.workspace) + split_counters_offset(a.batch, a.num_heads, p.max_splits, L.head_dim));
      p.epoch = kCounterTag;
    }
  }
  const dim3 grid(ctas_x, a.batch, p.max_splits);
  switch (L.head_dim) {
    case 64: launch_decode<64>(p, L.dtype, grid, a.batch, stream, hpw); break;
    case 128: launch_decode<128>(p, L.dtype, grid, a.batch, stream, hpw); break;
    case 256: launch_decode<256>(p, L.dtype, grid, a.batch, stream, hpw); break;
  }
}

}  // namespace fp8kv::cuda
