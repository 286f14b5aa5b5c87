// Gated DeltaNet kernels (gdn.h): the conv, the recurrent rule and the norm
// one thread per output column in the CPU reference's operation order
// (backend/cpu/gdn.cpp); the chunked rule register-tiled (its comment).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/gdn/gdn.h"

namespace fp8kv::cuda {

namespace {

__device__ __forceinline__ float silu_f(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float sigmoid_f(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float round_bf16_f(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// A recurrent-state element of the pool (State: float, or __nv_bfloat16 for
// --mamba-ssm-cache-dtype bfloat16), read widened to f32 when a step starts
// and written rounded to nearest even when it ends (the CPU's gdn_rule_step),
// so a step computes in f32 what it computes on an f32 state holding the
// same values. The f32 instantiations are the kernels as they were before
// bf16 states.
__device__ __forceinline__ float state_f32(float x) { return x; }
__device__ __forceinline__ float state_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class State>
__device__ __forceinline__ State state_from_f32(float x) {
  if constexpr (std::is_same_v<State, float>)
    return x;
  else
    return __float2bfloat16_rn(x);
}

// One thread per (sequence, channel, run of kConvRun rows): the K-1 inputs
// before its first row (from x, or from the state before the sequence's
// first row) in registers, then its rows in order; each output is the same
// sum in the same order as the CPU's, so the result does not depend on how
// the rows are cut into runs. The first run's thread (blockIdx.z == 0)
// reads the old state and, at its end, writes the new one (the last K-1
// inputs, from x and the old state): no other run touches the state, since
// a later run's window starts at row kConvRun - (K-1) >= 0.
constexpr int kConvRun = 64;
static_assert(kConvRun >= kGdnMaxConvKernel, "a later run's window must not reach the state");

__global__ void gdn_conv_kernel(GdnSeqs seqs, int64_t C, int K, const float* __restrict__ x,
                                const float* __restrict__ w, void* state, bool bf16, float* __restrict__ out) {
  const int s = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int r0 = seqs.q_start[s], n = seqs.q_start[s + 1] - r0;
  const int t0 = static_cast<int>(blockIdx.z) * kConvRun;
  const int t1 = gridDim.z == 1 ? n : min(n, t0 + kConvRun);
  if (t0 >= n) return;
  const int slot = seqs.slots[s];
  if (slot < 0) {
    for (int t = t0; t < t1; ++t) out[(r0 + t) * C + c] = 0.0f;
    return;
  }
  const int P = K - 1;
  const bool fresh = seqs.context_lens[s] - n == 0;
  const int64_t base = (static_cast<int64_t>(slot) * C + c) * P;
  auto* s16 = static_cast<__nv_bfloat16*>(state);
  auto* s32 = static_cast<float*>(state);
  auto in_x = [&](int t) {  // row t's input, rounded to the state type
    const float xi = x[(r0 + t) * C + c];
    return bf16 ? round_bf16_f(xi) : xi;
  };
  float win[kGdnMaxConvKernel], wc[kGdnMaxConvKernel], old[kGdnMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kGdnMaxConvKernel; ++j) {
    win[j] = 0.0f;
    old[j] = 0.0f;
    wc[j] = j < K ? w[c * K + j] : 0.0f;
  }
  if (t0 == 0) {
    if (!fresh) {
#pragma unroll
      for (int i = 0; i < kGdnMaxConvKernel - 1; ++i)
        if (i < P) old[i] = win[i] = bf16 ? __bfloat162float(s16[base + i]) : s32[base + i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kGdnMaxConvKernel - 1; ++i)
      if (i < P) win[i] = in_x(t0 - P + i);
  }
  for (int t = t0; t < t1; ++t) {
    // win[0..P-1]: the previous P inputs (oldest first); win[P]: this one.
    const float xi = in_x(t);
#pragma unroll
    for (int j = 0; j < kGdnMaxConvKernel; ++j)
      if (j == P) win[j] = xi;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kGdnMaxConvKernel; ++j)
      if (j < K) acc = __fadd_rn(acc, __fmul_rn(wc[j], win[j]));
    out[(r0 + t) * C + c] = silu_f(acc);
#pragma unroll
    for (int j = 0; j < kGdnMaxConvKernel - 1; ++j)
      if (j < P) win[j] = win[j + 1];
  }
  if (t0 != 0) return;
  // The new state: inputs n - P .. n - 1 of [old state (P), x (n)].
#pragma unroll
  for (int i = 0; i < kGdnMaxConvKernel - 1; ++i)
    if (i < P) {
      const int q = n + i;  // index into the concatenation
      float v = 0.0f;
#pragma unroll
      for (int j = 0; j < kGdnMaxConvKernel - 1; ++j)
        if (j < P && q == j) v = old[j];
      if (q >= P) v = in_x(q - P);
      if (bf16)
        s16[base + i] = __float2bfloat16_rn(v);  // exact: v holds bf16 values
      else
        s32[base + i] = v;
    }
}

// One CTA per (value head, sequence); thread d owns column d of the head's
// state S [Dk][Dv], so every sum over Dk is one thread's sequential loop, in
// the CPU's order. DK > 0 (the key head dims of kGdnRegDk): the column lives
// in DK registers, loaded and stored with DK independent accesses per
// thread, and shared memory holds only q and k of the token; DK == 0 (any
// other Dk): the column lives in shared memory (S, then q and k). Same
// operations in the same order either way: bitwise equal results. q and k
// are normalized once per token by the block (the l2 sums by threads 0 and
// 1, in the CPU's order), not by every thread. State: the pool's element
// type (float or bf16: widened on the read, rounded to nearest on the write).
template <int DK, class State>
__global__ void gdn_rule_kernel(GdnSeqs seqs, GdnDims dm, int chunk_begin, const float* __restrict__ qkv,
                                const float* __restrict__ a, const float* __restrict__ b,
                                const float* __restrict__ A_log, const float* __restrict__ dt_bias, State* pool,
                                float* __restrict__ out) {
  extern __shared__ float sm[];
  constexpr bool REG = DK > 0;
  const int h = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
  const int Hk = dm.num_k_heads, Hv = dm.num_v_heads, Dv = dm.v_head_dim;
  const int Dk = REG ? DK : dm.k_head_dim;
  const int64_t KD = dm.key_dim(), VD = dm.value_dim(), C = dm.conv_dim();
  const int r0 = seqs.q_start[s], n = seqs.q_start[s + 1] - r0;
  if (n <= 0 || (s >= chunk_begin && n >= 2)) return;
  const int slot = seqs.slots[s];
  const bool col = d < Dv;
  if (slot < 0) {
    if (col)
      for (int t = 0; t < n; ++t) out[(r0 + t) * VD + static_cast<int64_t>(h) * Dv + d] = 0.0f;
    return;
  }
  float Sr[REG ? DK : 1];
  float* Ssh = sm;
  // q and k of the token, normalized in place (q / |q| * scale, k / |k|),
  // then 1 / |q| and 1 / |k|.
  float* qs = REG ? sm : sm + Dk * Dv;
  float* ks = qs + Dk;
  float* inv = ks + Dk;
  // Element i of this thread's column.
  auto S_at = [&](int i) -> float& {
    if constexpr (REG) return Sr[i];
    else return Ssh[i * Dv + d];
  };
  State* S = pool + (static_cast<int64_t>(slot) * Hv + h) * Dk * Dv;
  const bool fresh = seqs.context_lens[s] - n == 0;
  if (col) {
#pragma unroll
    for (int i = 0; i < Dk; ++i) S_at(i) = fresh ? 0.0f : state_f32(S[static_cast<int64_t>(i) * Dv + d]);
  }
  const int kh = h / (Hv / Hk);
  const float scale = __fdiv_rn(1.0f, sqrtf(static_cast<float>(Dk)));
  const float neg_A = -expf(A_log[h]), dtb = dt_bias[h];
  for (int t = 0; t < n; ++t) {
    const int64_t r = r0 + t;
    const float* row = qkv + r * C;
    __syncthreads();  // the previous token's q, k are read
    for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
      qs[i] = row[static_cast<int64_t>(kh) * Dk + i];
      ks[i] = row[KD + static_cast<int64_t>(kh) * Dk + i];
    }
    __syncthreads();
    // l2norm_into: x / sqrt(sum x^2 + 1e-6), then * scale (q) or * 1 (k:
    // exact); each sum sequential (the CPU's), thread 0 q's, thread 1 k's.
    if (threadIdx.x < 2) {
      const float* x = threadIdx.x ? ks : qs;
      float ss = 0.0f;
      for (int i = 0; i < Dk; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
      inv[threadIdx.x] = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, 1e-6f)));
    }
    __syncthreads();
    {
      const float invq = inv[0], invk = inv[1];
      for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
        qs[i] = __fmul_rn(__fmul_rn(qs[i], invq), scale);
        ks[i] = __fmul_rn(ks[i], invk);
      }
    }
    __syncthreads();
    if (!col) continue;
    // gdn_gates (torch's softplus, threshold 20).
    const float xg = __fadd_rn(a[r * Hv + h], dtb);
    const float sp = xg > 20.0f ? xg : log1pf(expf(xg));
    const float decay = expf(__fmul_rn(neg_A, sp));
    const float beta = sigmoid_f(b[r * Hv + h]);
    // S *= decay; mem = S^T k; delta = (v - mem) beta; S += k delta^T; o = S^T q.
    // (REG: the loops go 8 rows at a time, the compiler barrier between
    // groups keeps it from loading every q / k element ahead at once, which
    // would hold Dk registers more than the column and spill at Dk = 128.)
    float mem = 0.0f;
#pragma unroll
    for (int i = 0; i < Dk; ++i) {
      const float sv = __fmul_rn(S_at(i), decay);
      S_at(i) = sv;
      mem = __fadd_rn(mem, __fmul_rn(sv, ks[i]));
      if (REG && i % 8 == 7) asm volatile("" ::: "memory");
    }
    const float v = row[2 * KD + static_cast<int64_t>(h) * Dv + d];
    const float delta = __fmul_rn(__fsub_rn(v, mem), beta);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < Dk; ++i) {
      const float sv = __fadd_rn(S_at(i), __fmul_rn(ks[i], delta));
      S_at(i) = sv;
      o = __fadd_rn(o, __fmul_rn(sv, qs[i]));
      if (REG && i % 8 == 7) asm volatile("" ::: "memory");
    }
    out[r * VD + static_cast<int64_t>(h) * Dv + d] = o;
  }
  if (col) {
#pragma unroll
    for (int i = 0; i < Dk; ++i) S[static_cast<int64_t>(i) * Dv + d] = state_from_f32<State>(S_at(i));
  }
}

// ---- the chunked delta rule -------------------------------------------------------
//
// Two kernels per step. Within a chunk of n <= 64 rows (rows n..63 of every
// buffer zero), steps 1-3 do not depend on the state, so a prep kernel runs
// them for every chunk of the step at once; the sequential kernel walks each
// sequence's chunks through the state (steps 4-6).
//
// Prep (gdn_chunk_prep_kernel): one CTA of kChunkThreads per (block of 64
// rows of the step's T rows, value head h); it takes every chunk whose first
// row lies in its block (a block holds one chunk start per sequence it
// overlaps and one per multiple of 64 of the positions: ceil(T / 64) blocks
// cover every chunk once). Per chunk:
//  1. q, k rows -> QT, KT [Dk][ld_t] (transposed), the gates (one warp: g,
//     beta, cum = running sum of g, exp(cum), exp(last - cum)), the l2 norms
//     (one thread per row, the CPU's sequential sum), then q, k normalized.
//  2. L = beta_i (k_i . k_j) exp(cum_i - cum_j) (j < i) -> LT [64][64] and
//     A = (q_i . k_j) exp(cum_i - cum_j) (j <= i) -> the scratch: the 136 4x4
//     tiles on or below the diagonal of each, one per thread.
//  3. Forward substitution of (I + L) X = B for every column of U = v beta
//     (Dv columns) and W = (k beta) exp(cum) (Dk columns), one thread per
//     column, the column in 64 registers (right-looking: when x_j is final
//     every x_i, i > j, takes its term, so each x_i takes its terms in the
//     CPU's order j = 0, 1, ... with 63 - j independent multiply-adds per
//     step instead of one dependent chain) -> the scratch.
// The scratch (ChunkScratch, per value head and row of the step): W [Dk], U
// [Dv], row j of A^T (A_ij for the chunk's i in [0, 64)), and exp(cum),
// exp(last - cum), 1 / |q|, 1 / |k|, exp(last).
//
// Sequential (gdn_rule_chunked_kernel): one CTA of kChunkThreads per (value
// head h, Dv slice, sequence): the slice is columns [c0, c0 + Dvs) of the
// head's state, Dvs = Dv / split. The CTA keeps its slice of S [Dk][Dvs] in
// shared memory for the whole sequence (one read and one write of the pool
// per step) and walks the sequence's chunks; per chunk:
//  0. QT = ((q 1/|q|) scale)^T from qkv, W^T [Dk][ld_t], U [64][Dvs], A^T
//     [64][64] and the row vectors from the scratch (q normalized by the
//     prep's expression, so QT holds the prep's bits).
//  4. v_new = U - W S (into U).
//  5. o = exp(cum_i) (q_i S) + sum_{j <= i} A_ij v_new_j -> out; KD [64][Dk]
//     = (k_i 1/|k_i|) exp(last - cum_i) from qkv (over W^T, dead).
//  6. S = exp(last) S + sum_i KD_i v_new_i^T.
// The chunk's loads overlap rather than wait in turn: A^T and the row
// vectors go to shared memory by cp.async during the previous chunk's step
// 6 (their buffers are dead then; the first chunk's before the walk), U by
// cp.async at the start of step 0, and each thread issues every q and W
// load of its transpose blocks (16-byte pieces of rows: 8 of q and 8 of W
// at Dk = 128, all its blocks for Dk <= 128) before it writes the first
// into QT or W^T; one wait for all, then the barrier. The k rows of KD go
// raw from qkv into W^T's buffer (dead after step 4) by cp.async before
// step 5's products, and each thread scales the elements it copied after
// them. So a chunk waits for global memory about once, in step 0. (U is
// not staged during step 6, which reads it: a second U buffer would cost
// the second CTA per SM at split 4. q and k rows go in 4-byte pieces where
// qkv is not 16-byte aligned.) Every buffer holds the same bits when a
// product reads it, and the arithmetic is unchanged.
// Products 4, 5, 6 give each thread TM x 4 outputs (TM = 4 or 2: the
// template arguments, so that all 8 warps have tiles), every output one
// register summed in the order of its reduction index with fused
// multiply-adds; the operands are stored so that each step's loads are 16-
// or 8-byte vectors that a warp shares (at most 4 and 8 distinct words). So
// a column's arithmetic does not depend on the split or on which thread
// computes it: results are bitwise independent of the split.
// Shared memory (floats): prep 2 Dk ld_t + LT 64 x 64 + 7 x 64 + 4 (87.8 KB
// for Dk = 128: two CTAs per SM); sequential S Dk Dvs + QT, WT 2 Dk ld_t +
// U 64 Dvs + AT 64 x 64 + 3 x 64 + 4; for Dk = Dv = 128 (ld_t 68): 185.1 KB
// at split 1, 136.0 KB at split 2, 111.4 KB at split 4 (two CTAs per SM).

constexpr int kChunk = kGdnCudaChunk;
constexpr int kChunkThreads = 256;
constexpr int kChunkWarps = kChunkThreads / 32;
constexpr int kStageBlocks = 2;  // q and W warp blocks per warp whose loads step 0 issues together
static_assert(kChunkWarps % 4 == 0, "step 0: a warp's blocks share their rows");
constexpr int kTriTiles = (kChunk / 4) * (kChunk / 4 + 1) / 2;  // 4x4 tiles on or below the diagonal: 136
constexpr int kPrepVecFloats = 7 * kChunk + 4;  // g, beta, cum, exp(cum), exp(last - cum), 1/|q|, 1/|k|; exp(last)
constexpr int kSeqVecFloats = 3 * kChunk + 4;   // exp(cum), exp(last - cum), 1/|k|; exp(last)
constexpr int kRowVecs = 5;  // the scratch's per-row vectors: exp(cum), exp(last - cum), 1/|q|, 1/|k|, exp(last)
constexpr size_t kSmemReservedPerBlock = 1024;  // shared memory the runtime reserves per resident block

size_t prep_smem_bytes(int Dk, int ldt) {
  return sizeof(float) * (2 * static_cast<size_t>(Dk) * ldt + static_cast<size_t>(kChunk) * kChunk + kPrepVecFloats);
}

size_t chunk_smem_bytes(int Dk, int Dvs, int ldt) {
  const size_t k = static_cast<size_t>(Dk), v = static_cast<size_t>(Dvs);
  return sizeof(float) * (k * v + 2 * k * static_cast<size_t>(ldt) + static_cast<size_t>(kChunk) * v +
                          static_cast<size_t>(kChunk) * kChunk + kSeqVecFloats);
}

// The prep kernel's outputs over the step's T rows, per value head h and
// row r (pieces 256-byte aligned, in this order):
struct ChunkScratch {
  float* W = nullptr;    // [Hv][T][Dk]: row i of the chunk's (I + L)^{-1} (k beta exp(cum))
  float* U = nullptr;    // [Hv][T][Dv]: row i of (I + L)^{-1} (v beta)
  float* A = nullptr;    // [Hv][T][64]: row j of the chunk's A^T (A_ij at i; 0 for i < j)
  float* vec = nullptr;  // [kRowVecs][Hv][T]
  int64_t T = 0;
};

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// The scratch's layout for dims d and T rows at `base` (nullptr: offsets
// from 0); returns its size in bytes.
size_t chunk_scratch_layout(const GdnDims& d, int64_t T, void* base, ChunkScratch* sc) {
  const size_t rows = static_cast<size_t>(std::max<int64_t>(T, 0)) * static_cast<size_t>(d.num_v_heads);
  const size_t w = align256(rows * d.k_head_dim * sizeof(float)), u = align256(rows * d.v_head_dim * sizeof(float)),
               a = align256(rows * kChunk * sizeof(float)), v = align256(rows * kRowVecs * sizeof(float));
  if (sc) {
    char* p = static_cast<char*>(base);
    sc->W = reinterpret_cast<float*>(p);
    sc->U = reinterpret_cast<float*>(p + w);
    sc->A = reinterpret_cast<float*>(p + w + u);
    sc->vec = reinterpret_cast<float*>(p + w + u + a);
    sc->T = T;
  }
  return w + u + a + v;
}

struct ChunkArgs {
  GdnSeqs seqs;
  GdnDims dm;
  int split, ldt, prep_ldt, seq_begin;
  const float* qkv;
  const float* a;
  const float* b;
  const float* A_log;
  const float* dt_bias;
  void* pool;  // [slots][Hv][Dk][Dv] of the kernel's State
  float* out;
  ChunkScratch sc;
};

// Asynchronous copies global -> shared of 16 bytes (both addresses 16-byte
// aligned) or 4: issued without waiting; cp_async_wait_all makes the
// thread's copies visible to itself, a barrier after it to the CTA.
__device__ __forceinline__ void cp_async16(float* dst, const float* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// acc[r][c] += sum_k A[k][r] B[k][c] over k in [0, K), in the order of k,
// one fused multiply-add per term. A and B point at the tile's first row
// and column of row-major arrays [K][lda] and [K][ldb] (TM and 4
// consecutive values per k, 16-byte aligned).
template <int TM>
__device__ __forceinline__ void tile_fma(const float* A, int lda, const float* B, int ldb, int K, float (&acc)[TM][4]) {
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float av[TM];
    if constexpr (TM == 4) {
      const float4 t = *reinterpret_cast<const float4*>(A + static_cast<ptrdiff_t>(k) * lda);
      av[0] = t.x;
      av[1] = t.y;
      av[2] = t.z;
      av[3] = t.w;
    } else {
      const float2 t = *reinterpret_cast<const float2*>(A + static_cast<ptrdiff_t>(k) * lda);
      av[0] = t.x;
      av[1] = t.y;
    }
    const float4 bv = *reinterpret_cast<const float4*>(B + static_cast<ptrdiff_t>(k) * ldb);
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      acc[r][0] = fmaf(av[r], bv.x, acc[r][0]);
      acc[r][1] = fmaf(av[r], bv.y, acc[r][1]);
      acc[r][2] = fmaf(av[r], bv.z, acc[r][2]);
      acc[r][3] = fmaf(av[r], bv.w, acc[r][3]);
    }
  }
}

// The TM x 4 output tiles of an M x N product (M a multiple of TM, N of 4),
// dealt out as warp tiles of 4 TM rows x 32 columns (lanes: 4 row groups x
// 8 column groups): f(row0, col0) per tile.
template <int TM, class F>
__device__ __forceinline__ void for_tiles(int M, int N, F&& f) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wrows = 4 * TM, wcols = (N + 31) / 32, wts = (M + wrows - 1) / wrows * wcols;
  for (int wt = warp; wt < wts; wt += kChunkWarps) {
    const int r0 = (wt / wcols) * wrows + (lane / 8) * TM, c0 = (wt % wcols) * 32 + (lane % 8) * 4;
    if (r0 < M && c0 < N) f(r0, c0);
  }
}

// x <- (I + L)^{-1} x for one column x[64] (registers), L strictly lower
// triangular, LT[j][i] = L_ij. x_i takes -L_ij x_j for j = 0, 1, ..., i-1
// in that order (the CPU's); rows from n on are zero and stay zero.
__device__ __forceinline__ void forward_subst(float (&x)[kChunk], const float* LT, int n) {
#pragma unroll
  for (int j = 0; j < kChunk - 1; ++j) {
    if (j + 1 < n) {
#pragma unroll
      for (int q = (j + 1) / 4; q < kChunk / 4; ++q) {
        const float4 l = *reinterpret_cast<const float4*>(LT + j * kChunk + 4 * q);
        if (4 * q + 0 > j) x[4 * q + 0] = fmaf(-l.x, x[j], x[4 * q + 0]);
        if (4 * q + 1 > j) x[4 * q + 1] = fmaf(-l.y, x[j], x[4 * q + 1]);
        if (4 * q + 2 > j) x[4 * q + 2] = fmaf(-l.z, x[j], x[4 * q + 2]);
        if (4 * q + 3 > j) x[4 * q + 3] = fmaf(-l.w, x[j], x[4 * q + 3]);
      }
    }
  }
}

// Steps 1-3 of every chunk whose first row lies in rows [64 blockIdx.x,
// 64 blockIdx.x + 64) of the step, for value head blockIdx.y (the header
// comment). A chunk belongs to a sequence the sequential kernel takes (from
// seq_begin on, two or more rows, not padding); its first row is the
// sequence's first or sits at a position that is a multiple of 64.
__global__ void __launch_bounds__(kChunkThreads, 2) gdn_chunk_prep_kernel(ChunkArgs p) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int ldt = p.prep_ldt, h = blockIdx.y;
  const int Hk = p.dm.num_k_heads, Hv = p.dm.num_v_heads, Dk = p.dm.k_head_dim, Dv = p.dm.v_head_dim;
  const int64_t KD = p.dm.key_dim(), C = p.dm.conv_dim(), T = p.sc.T;
  const int* __restrict__ q_start = p.seqs.q_start;
  const int rb = static_cast<int>(blockIdx.x) * kChunk;
  const int re = static_cast<int>(min(static_cast<int64_t>(rb) + kChunk, T));
  float* QT = sm;                    // [Dk][ldt]: q^T
  float* KT = QT + Dk * ldt;         // [Dk][ldt]: k^T
  float* LT = KT + Dk * ldt;         // [64][64]
  float* gv = LT + kChunk * kChunk;  // [64] g
  float* bet = gv + kChunk;          // [64] beta
  float* cum = bet + kChunk;         // [64] running sum of g
  float* ev = cum + kChunk;          // [64] exp(cum)
  float* dl = ev + kChunk;           // [64] exp(last - cum), 0 past the chunk
  float* invq = dl + kChunk;         // [64]
  float* invk = invq + kChunk;       // [64]
  float* misc = invk + kChunk;       // [0] exp(last)

  const int kh = h / (Hv / Hk);
  const float scale = __fdiv_rn(1.0f, sqrtf(static_cast<float>(Dk)));
  const float neg_A = -expf(p.A_log[h]), dtb = p.dt_bias[h];
  const float* __restrict__ qkv = p.qkv;
  const int wba = (Dk + 31) / 32, nwb = wba * 4;  // warp blocks of 32 (Dk) x 16 (rows) per matrix
  const int64_t hT = static_cast<int64_t>(h) * T;
  float* __restrict__ Wg = p.sc.W;
  float* __restrict__ Ug = p.sc.U;
  float* __restrict__ Ag = p.sc.A;
  float* __restrict__ vg = p.sc.vec + hT;  // + k Hv T: vector k

  // The sequence holding row rb: the last s with q_start[s] <= rb.
  int s = 0;
  {
    int hi = p.seqs.num_seqs - 1;
    while (s < hi) {
      const int mid = (s + hi + 1) / 2;
      if (q_start[mid] <= rb) s = mid;
      else hi = mid - 1;
    }
  }
  for (int row0 = rb; row0 < re;) {
    while (s + 1 < p.seqs.num_seqs && q_start[s + 1] <= row0) ++s;  // skips empty sequences
    if (q_start[s + 1] <= row0) break;  // past the step's rows (q_start[num_seqs] = T)
    const int r0 = q_start[s], n = q_start[s + 1] - r0, t = row0 - r0;
    if (s < p.seq_begin || n < 2 || p.seqs.slots[s] < 0) {  // the recurrent kernel's, or padding
      row0 = r0 + n;
      continue;
    }
    // Chunks end at absolute multiples of 64 (the CPU's rule).
    const int rem = kChunk - (p.seqs.context_lens[s] - n + t) % kChunk;
    if (t != 0 && rem != kChunk) {  // inside a chunk: on to the next chunk start
      row0 += min(rem, n - t);
      continue;
    }
    const int nc = min(n - t, rem);
    __syncthreads();  // the previous chunk's buffers are read

    // 1a. The gates (the last warp), then q and k rows transposed into QT,
    // KT by 4x4 register blocks (lanes: 8 column blocks x 4 row blocks).
    if (warp == kChunkWarps - 1) {
      for (int i = lane; i < kChunk; i += 32) {
        float g = 0.0f, bt = 0.0f;
        if (i < nc) {
          const int64_t r = row0 + i;
          const float xg = __fadd_rn(p.a[r * Hv + h], dtb);
          const float sp = xg > 20.0f ? xg : log1pf(expf(xg));  // torch's softplus
          g = __fmul_rn(neg_A, sp);
          bt = sigmoid_f(p.b[r * Hv + h]);
        }
        gv[i] = g;
        bet[i] = bt;
      }
      __syncwarp();
      if (lane == 0) {
        float run = 0.0f;
        for (int i = 0; i < kChunk; ++i) {
          if (i < nc) run = __fadd_rn(run, gv[i]);
          cum[i] = run;
        }
      }
      __syncwarp();
      const float last = cum[nc - 1];
      for (int i = lane; i < kChunk; i += 32) {
        ev[i] = expf(cum[i]);
        dl[i] = i < nc ? expf(__fsub_rn(last, cum[i])) : 0.0f;
      }
      if (lane == 0) misc[0] = expf(last);
    }
    for (int wb = warp; wb < 2 * nwb; wb += kChunkWarps) {
      const int m = wb / nwb, w = wb % nwb;  // m 0: q, 1: k
      const int a0 = ((w / 4) * 8 + lane % 8) * 4, i0 = ((w % 4) * 4 + lane / 8) * 4;
      if (a0 >= Dk) continue;
      float v[4][4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (i0 + r < nc) {
          const float* src = qkv + (row0 + i0 + r) * C + m * KD + static_cast<int64_t>(kh) * Dk + a0;
#pragma unroll
          for (int c = 0; c < 4; ++c) v[r][c] = src[c];
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c) v[r][c] = 0.0f;
        }
      }
      float* Tm = m ? KT : QT;
#pragma unroll
      for (int c = 0; c < 4; ++c)
        *reinterpret_cast<float4*>(Tm + (a0 + c) * ldt + i0) = make_float4(v[0][c], v[1][c], v[2][c], v[3][c]);
    }
    __syncthreads();

    // 1b. 1 / sqrt(sum x^2 + 1e-6) per q and k row: the CPU's sequential sum.
    if (tid < 2 * kChunk) {
      const float* Tm = tid < kChunk ? QT : KT;
      const int i = tid % kChunk;
      float ss = 0.0f;
      for (int a = 0; a < Dk; ++a) {
        const float x = Tm[a * ldt + i];
        ss = __fadd_rn(ss, __fmul_rn(x, x));
      }
      (tid < kChunk ? invq : invk)[i] = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, 1e-6f)));
    }
    __syncthreads();

    // 1c. q (x inv) scale, k x inv (the CPU's * 1.0f is exact); the chunk's
    // row vectors to the scratch.
    {
      const int i = tid % kChunk;
      const float iq = invq[i], ik = invk[i];
      for (int a = tid / kChunk; a < Dk; a += kChunkThreads / kChunk) {
        const int x = a * ldt + i;
        const float kn = __fmul_rn(KT[x], ik);
        QT[x] = __fmul_rn(__fmul_rn(QT[x], iq), scale);
        KT[x] = kn;
      }
      if (tid < nc) {
        const int64_t HT = static_cast<int64_t>(Hv) * T, r = row0 + tid;
        vg[r] = ev[tid];
        vg[HT + r] = dl[tid];
        vg[2 * HT + r] = iq;
        vg[3 * HT + r] = ik;
        vg[4 * HT + r] = misc[0];
      }
    }
    __syncthreads();

    // 2. L and A, 4x4 tiles on or below the diagonal (jobs [0, 136): L from
    // K K^T into LT, [136, 272): A from Q K^T into the scratch, rows j < nc);
    // tiles of rows i >= nc are zeros (what their zero q, k rows and beta
    // give). Then A^T's entries above the diagonal tiles: zeros.
    for (int job = tid; job < 2 * kTriTiles; job += kChunkThreads) {
      const bool isA = job >= kTriTiles;
      const int tt = isA ? job - kTriTiles : job;
      int ti = 0;
      while ((ti + 1) * (ti + 2) / 2 <= tt) ++ti;
      const int tj = tt - ti * (ti + 1) / 2;
      float acc[4][4] = {};
      if (4 * ti < nc) tile_fma<4>((isA ? QT : KT) + 4 * ti, ldt, KT + 4 * tj, ldt, Dk, acc);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int j = 4 * tj + c;
        float o[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i = 4 * ti + r;
          o[r] = 0.0f;
          if (4 * ti >= nc) continue;
          if (isA) {
            if (j <= i) o[r] = __fmul_rn(acc[r][c], expf(__fsub_rn(cum[i], cum[j])));
          } else if (j < i) {
            o[r] = __fmul_rn(__fmul_rn(bet[i], acc[r][c]), expf(__fsub_rn(cum[i], cum[j])));
          }
        }
        if (!isA)
          *reinterpret_cast<float4*>(LT + j * kChunk + 4 * ti) = make_float4(o[0], o[1], o[2], o[3]);
        else if (j < nc)
          *reinterpret_cast<float4*>(Ag + (hT + row0 + j) * kChunk + 4 * ti) = make_float4(o[0], o[1], o[2], o[3]);
      }
    }
    for (int e = tid; e < nc * (kChunk / 4); e += kChunkThreads) {
      const int j = e / (kChunk / 4), q = e % (kChunk / 4);
      if (q < j / 4)
        *reinterpret_cast<float4*>(Ag + (hT + row0 + j) * kChunk + 4 * q) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();

    // 3. U = (I + L)^{-1} (v beta) (columns [0, Dv)), W = (I + L)^{-1} ((k
    // beta) exp(cum)) (columns [Dv, Dv + Dk)), one column per thread; rows
    // i < nc to the scratch.
    for (int c = tid; c < Dv + Dk; c += kChunkThreads) {
      float x[kChunk];
      const bool isU = c < Dv;
      if (isU) {
        const float* vsrc = qkv + 2 * KD + static_cast<int64_t>(h) * Dv + c;
#pragma unroll
        for (int i = 0; i < kChunk; ++i) x[i] = i < nc ? __fmul_rn(vsrc[(row0 + i) * C], bet[i]) : 0.0f;
      } else {
        const float4* krow = reinterpret_cast<const float4*>(KT + (c - Dv) * ldt);
#pragma unroll
        for (int q = 0; q < kChunk / 4; ++q) {
          const float4 kn = krow[q];
          x[4 * q] = __fmul_rn(__fmul_rn(kn.x, bet[4 * q]), ev[4 * q]);
          x[4 * q + 1] = __fmul_rn(__fmul_rn(kn.y, bet[4 * q + 1]), ev[4 * q + 1]);
          x[4 * q + 2] = __fmul_rn(__fmul_rn(kn.z, bet[4 * q + 2]), ev[4 * q + 2]);
          x[4 * q + 3] = __fmul_rn(__fmul_rn(kn.w, bet[4 * q + 3]), ev[4 * q + 3]);
        }
      }
      forward_subst(x, LT, nc);
      const int ld = isU ? Dv : Dk;
      float* dst = (isU ? Ug + (hT + row0) * Dv + c : Wg + (hT + row0) * Dk + (c - Dv));
#pragma unroll
      for (int i = 0; i < kChunk; ++i)
        if (i < nc) dst[static_cast<int64_t>(i) * ld] = x[i];
    }
    row0 += nc;
  }
}

// Steps 4-6 (the header comment). TV, TS: the rows per thread tile of the
// 64 x Dvs products (4, 5) and of the Dk x Dvs state update (6); State: the
// pool's element type.
template <int TV, int TS, class State>
__global__ void __launch_bounds__(kChunkThreads, 2) gdn_rule_chunked_kernel(ChunkArgs p) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int split = p.split, ldt = p.ldt;
  const int h = blockIdx.x / split, part = blockIdx.x % split, s = p.seq_begin + blockIdx.y;
  const int Hk = p.dm.num_k_heads, Hv = p.dm.num_v_heads, Dk = p.dm.k_head_dim, Dv = p.dm.v_head_dim;
  const int Dvs = Dv / split, cs = part * Dvs;  // this CTA's columns [cs, cs + Dvs)
  const int64_t KD = p.dm.key_dim(), VD = p.dm.value_dim(), C = p.dm.conv_dim(), T = p.sc.T;
  const int r0 = p.seqs.q_start[s], n = p.seqs.q_start[s + 1] - r0;
  if (n < 2) return;  // the recurrent kernel's
  const int slot = p.seqs.slots[s];
  float* __restrict__ out = p.out;
  const int64_t ocol = static_cast<int64_t>(h) * Dv + cs;
  if (slot < 0) {  // padding: zero rows, no state
    for (int e = tid; e < n * Dvs; e += kChunkThreads)
      out[static_cast<int64_t>(r0 + e / Dvs) * VD + ocol + e % Dvs] = 0.0f;
    return;
  }
  float* Ssh = sm;                   // [Dk][Dvs]
  float* QT = Ssh + Dk * Dvs;        // [Dk][ldt]: q^T
  float* WT = QT + Dk * ldt;         // [Dk][ldt]: W^T; from step 5 KD [64][Dk]
  float* U = WT + Dk * ldt;          // [64][Dvs]
  float* AT = U + kChunk * Dvs;      // [64][64]
  float* ev = AT + kChunk * kChunk;  // [64] exp(cum), 0 past the chunk
  float* dl = ev + kChunk;           // [64] exp(last - cum), 0 past the chunk
  float* invk = dl + kChunk;         // [64]
  float* misc = invk + kChunk;       // [0] exp(last)
  float* KDm = WT;

  const int pos0 = p.seqs.context_lens[s] - n;
  const bool fresh = pos0 == 0;
  State* S = static_cast<State*>(p.pool) + (static_cast<int64_t>(slot) * Hv + h) * Dk * Dv + cs;
  for (int e = tid; e < Dk * Dvs; e += kChunkThreads)
    Ssh[e] = fresh ? 0.0f : state_f32(S[static_cast<int64_t>(e / Dvs) * Dv + e % Dvs]);
  const int kh = h / (Hv / Hk);
  const float scale = __fdiv_rn(1.0f, sqrtf(static_cast<float>(Dk)));
  const float* __restrict__ qkv = p.qkv;
  const int64_t qcol = static_cast<int64_t>(kh) * Dk;  // the key head's q columns (its k columns: KD + qcol)
  // q and k rows in 16-byte pieces where qkv is 16-byte aligned (C, KD and
  // Dk are multiples of 4 at every shape the plan takes), else in floats.
  const bool qkv16 = reinterpret_cast<uintptr_t>(qkv) % 16 == 0 && C % 4 == 0;
  const int wba = (Dk + 31) / 32, nwb = wba * 4;  // warp blocks of 32 (Dk) x 16 (rows) per matrix
  const int64_t hT = static_cast<int64_t>(h) * T, HT = static_cast<int64_t>(Hv) * T;
  const float* __restrict__ Wg = p.sc.W + hT * Dk;       // + row Dk
  const float* __restrict__ Ug = p.sc.U + hT * Dv + cs;  // + row Dv
  const float* __restrict__ Ag = p.sc.A + hT * kChunk;   // + row 64
  const float* __restrict__ vg = p.sc.vec + hT;          // + k HT + row: vector k

  // The rows of the chunk that starts at row t: chunks end at absolute
  // multiples of 64 (the CPU's rule).
  auto chunk_rows = [&](int t) { return min(n - t, kChunk - (pos0 + t) % kChunk); };
  // A^T (rows j < nc: the only ones step 5 reads) and the row vectors (0
  // from nc on) of the chunk at row t, into AT, ev, dl, invk and misc by
  // cp.async; waited for at the end of the chunk's step 0.
  auto stage_at_vecs = [&](int t) {
    const int ncs = chunk_rows(t);
    const int64_t rs = r0 + t;
    for (int e = tid; e < ncs * (kChunk / 4); e += kChunkThreads) cp_async16(AT + 4 * e, Ag + rs * kChunk + 4 * e);
    if (tid < kChunk) {
      if (tid < ncs) {
        cp_async4(ev + tid, vg + rs + tid);
        cp_async4(dl + tid, vg + HT + rs + tid);
        cp_async4(invk + tid, vg + 3 * HT + rs + tid);
      } else {
        ev[tid] = 0.0f;
        dl[tid] = 0.0f;
        invk[tid] = 0.0f;
      }
      if (tid == 0) cp_async4(misc, vg + 4 * HT + rs);
    }
  };

  // Step 0's QT and W^T for the chunk of nc rows at row0 (vec16: q rows
  // in 16-byte pieces; a constant, so that each form is straight-line code).
  auto stage_qw = [&](int64_t row0, int nc, auto vec16) {
    for (int wq = warp; wq < nwb; wq += kStageBlocks * kChunkWarps) {
      // Block wq + j kChunkWarps: rows i0 + r, columns a0 + 32 (kChunkWarps / 4) j (+ c).
      const int a0 = ((wq / 4) * 8 + lane % 8) * 4, i0 = ((wq % 4) * 4 + lane / 8) * 4;
      float4 qv[kStageBlocks][4], wv[kStageBlocks][4];  // q (raw) and W
      float iq[4];                                      // 1 / |q| of the rows
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t row = row0 + i0 + r;
        iq[r] = i0 + r < nc ? vg[2 * HT + row] : 0.0f;
#pragma unroll
        for (int j = 0; j < kStageBlocks; ++j) {
          const int a = a0 + 32 * (kChunkWarps / 4) * j;
          qv[j][r] = wv[j][r] = make_float4(0.f, 0.f, 0.f, 0.f);
          if (wq + j * kChunkWarps < nwb && a < Dk && i0 + r < nc) {
            const float* src = qkv + row * C + qcol + a;
            qv[j][r] = decltype(vec16)::value ? *reinterpret_cast<const float4*>(src)
                                              : make_float4(src[0], src[1], src[2], src[3]);
            wv[j][r] = *reinterpret_cast<const float4*>(Wg + row * Dk + a);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kStageBlocks; ++j) {
        const int a = a0 + 32 * (kChunkWarps / 4) * j;
        if (wq + j * kChunkWarps >= nwb || a >= Dk) continue;
        float qn[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float x[4] = {qv[j][r].x, qv[j][r].y, qv[j][r].z, qv[j][r].w};
#pragma unroll
          for (int c = 0; c < 4; ++c) qn[r][c] = i0 + r < nc ? __fmul_rn(__fmul_rn(x[c], iq[r]), scale) : 0.0f;
        }
        const float4* wr = wv[j];
        *reinterpret_cast<float4*>(QT + (a + 0) * ldt + i0) = make_float4(qn[0][0], qn[1][0], qn[2][0], qn[3][0]);
        *reinterpret_cast<float4*>(QT + (a + 1) * ldt + i0) = make_float4(qn[0][1], qn[1][1], qn[2][1], qn[3][1]);
        *reinterpret_cast<float4*>(QT + (a + 2) * ldt + i0) = make_float4(qn[0][2], qn[1][2], qn[2][2], qn[3][2]);
        *reinterpret_cast<float4*>(QT + (a + 3) * ldt + i0) = make_float4(qn[0][3], qn[1][3], qn[2][3], qn[3][3]);
        *reinterpret_cast<float4*>(WT + (a + 0) * ldt + i0) = make_float4(wr[0].x, wr[1].x, wr[2].x, wr[3].x);
        *reinterpret_cast<float4*>(WT + (a + 1) * ldt + i0) = make_float4(wr[0].y, wr[1].y, wr[2].y, wr[3].y);
        *reinterpret_cast<float4*>(WT + (a + 2) * ldt + i0) = make_float4(wr[0].z, wr[1].z, wr[2].z, wr[3].z);
        *reinterpret_cast<float4*>(WT + (a + 3) * ldt + i0) = make_float4(wr[0].w, wr[1].w, wr[2].w, wr[3].w);
      }
    }
  };

  stage_at_vecs(0);
  for (int t0 = 0; t0 < n;) {
    const int nc = chunk_rows(t0);
    const int64_t row0 = r0 + t0;
    __syncthreads();  // the previous chunk's buffers are read (and S is loaded)

    // 0. The chunk's operands (A^T and the row vectors are in flight since
    // the previous chunk's step 6, or the start): U from the scratch by
    // cp.async (rows from nc on zero); QT = ((q 1/|q|) scale)^T from qkv and
    // W^T from the scratch, transposed by 4x4 register blocks (lanes: 8
    // column blocks x 4 row blocks; rows from nc on zero). A warp takes q
    // and W blocks kStageBlocks at a time (all of them for Dk <= 128) and
    // issues every load of them before the first transpose, so a chunk's
    // loads wait for memory once.
    {
      const int q4 = Dvs / 4;
      for (int e = tid; e < kChunk * q4; e += kChunkThreads) {
        const int i = e / q4, c = 4 * (e % q4);
        if (i < nc)
          cp_async16(U + i * Dvs + c, Ug + (row0 + i) * Dv + c);
        else
          *reinterpret_cast<float4*>(U + i * Dvs + c) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    if (qkv16)
      stage_qw(row0, nc, std::true_type{});
    else
      stage_qw(row0, nc, std::false_type{});
    cp_async_wait_all();
    __syncthreads();

    // 4. v_new = U - W S (the CPU: ws = sum_a W_ia S_ad, then U -= ws).
    for_tiles<TV>(kChunk, Dvs, [&](int i0, int d0) {
      if (i0 >= nc) return;
      float acc[TV][4] = {};
      tile_fma<TV>(WT + i0, ldt, Ssh + d0, Dvs, Dk, acc);
#pragma unroll
      for (int r = 0; r < TV; ++r) {
        float4* u = reinterpret_cast<float4*>(U + (i0 + r) * Dvs + d0);
        float4 x = *u;
        x.x = __fsub_rn(x.x, acc[r][0]);
        x.y = __fsub_rn(x.y, acc[r][1]);
        x.z = __fsub_rn(x.z, acc[r][2]);
        x.w = __fsub_rn(x.w, acc[r][3]);
        *u = x;
      }
    });
    __syncthreads();

    // 5. The k rows of KD [64][Dk] (rows from nc on zero) go from qkv into
    // KDm (over W^T, dead) by cp.async during the outputs: o_i = (q_i S)
    // exp(cum_i), then + A_ij v_new_j for j = 0..i in order (A_ij = 0 for j
    // > i inside the tile). Then each thread scales the k elements it copied
    // in place: KD = (k_i 1/|k_i|) exp(last - cum_i).
    for (int e = tid; e < kChunk * (Dk / 4); e += kChunkThreads) {
      const int i = e / (Dk / 4), a0 = 4 * (e % (Dk / 4));
      float* dst = KDm + i * Dk + a0;
      if (i >= nc) {
        *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
      } else {
        const float* src = qkv + (row0 + i) * C + KD + qcol + a0;
        if (qkv16) {
          cp_async16(dst, src);
        } else {
#pragma unroll
          for (int c = 0; c < 4; ++c) cp_async4(dst + c, src + c);
        }
      }
    }
    for_tiles<TV>(kChunk, Dvs, [&](int i0, int d0) {
      if (i0 >= nc) return;
      float acc[TV][4] = {};
      tile_fma<TV>(QT + i0, ldt, Ssh + d0, Dvs, Dk, acc);
#pragma unroll
      for (int r = 0; r < TV; ++r) {
        const float e = ev[i0 + r];
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = __fmul_rn(acc[r][c], e);
      }
      tile_fma<TV>(AT + i0, kChunk, U + d0, Dvs, min(i0 + TV, nc), acc);
#pragma unroll
      for (int r = 0; r < TV; ++r)
        if (i0 + r < nc) {
          float* o = out + (row0 + i0 + r) * VD + ocol + d0;
#pragma unroll
          for (int c = 0; c < 4; ++c) o[c] = acc[r][c];
        }
    });
    cp_async_wait_all();
    for (int e = tid; e < nc * (Dk / 4); e += kChunkThreads) {
      const int i = e / (Dk / 4), a0 = 4 * (e % (Dk / 4));
      float4* x = reinterpret_cast<float4*>(KDm + i * Dk + a0);
      const float ik = invk[i], d = dl[i];
      const float4 k = *x;
      *x = make_float4(__fmul_rn(__fmul_rn(k.x, ik), d), __fmul_rn(__fmul_rn(k.y, ik), d),
                       __fmul_rn(__fmul_rn(k.z, ik), d), __fmul_rn(__fmul_rn(k.w, ik), d));
    }
    const float el = misc[0];  // exp(last), read before step 6 stages the next chunk's
    __syncthreads();

    // 6. The next chunk's A^T and row vectors are staged (their buffers are
    // dead) during S = exp(last) S, then += KD_i v_new_i^T for i = 0..n-1 in
    // order.
    if (t0 + nc < n) stage_at_vecs(t0 + nc);
    for_tiles<TS>(Dk, Dvs, [&](int a0, int d0) {
      float acc[TS][4];
#pragma unroll
      for (int r = 0; r < TS; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(Ssh + (a0 + r) * Dvs + d0);
        acc[r][0] = __fmul_rn(x.x, el);
        acc[r][1] = __fmul_rn(x.y, el);
        acc[r][2] = __fmul_rn(x.z, el);
        acc[r][3] = __fmul_rn(x.w, el);
      }
      tile_fma<TS>(KDm + a0, Dk, U + d0, Dvs, nc, acc);
#pragma unroll
      for (int r = 0; r < TS; ++r)
        *reinterpret_cast<float4*>(Ssh + (a0 + r) * Dvs + d0) = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    });
    t0 += nc;
  }
  __syncthreads();
  for (int e = tid; e < Dk * Dvs; e += kChunkThreads)
    S[static_cast<int64_t>(e / Dvs) * Dv + e % Dvs] = state_from_f32<State>(Ssh[e]);
}

using ChunkKernel = void (*)(ChunkArgs);

// Rows per thread tile of an M x N product: 4 where that still gives every
// warp a tile, else 2.
int chunk_tile_rows(int M, int N) { return ((M + 15) / 16) * ((N + 31) / 32) >= kChunkWarps ? 4 : 2; }

template <class State>
ChunkKernel chunk_kernel(int tv, int ts) {
  if (tv == 4) return ts == 4 ? gdn_rule_chunked_kernel<4, 4, State> : gdn_rule_chunked_kernel<4, 2, State>;
  return ts == 4 ? gdn_rule_chunked_kernel<2, 4, State> : gdn_rule_chunked_kernel<2, 2, State>;
}

// The sequential kernel's work per CTA and chunk (the plan's cost), in
// multiply-adds: per column of its slice W S, Q S, A v_new and the state
// update, plus the chunk's loads (q, W, k, A^T: one unit per element).
// One CTA's estimated time per chunk, in multiply-add units: its columns'
// products and its loads, plus the chunk's fixed latency (the dependent
// steps and barriers every chunk waits through whatever its width):
// kChunkLatencyUnits, fitted on an H100 from bench_gdn's 1 x 8K rows at
// split 1 and 2, each CTA alone on its SM (5,658.6 and 3,615.0 us for 128
// chunks: 1.20e-3 us per unit over the chunks, and 1,537 us that do not
// scale with the columns, i.e. 1.28e6 units). Without it the estimate took
// split 4 (two CTAs per SM) for one to four 27B prefills, measured 1.09x to
// 1.12x slower than split 2 once the loads overlap.
constexpr double kChunkLatencyUnits = 1.28e6;

double chunk_cost(const GdnDims& d, int split) {
  const double Dk = d.k_head_dim, Dvs = static_cast<double>(d.v_head_dim) / split, c = kChunk;
  const double cols = Dvs * (3 * c * Dk + c * (c + 1) / 2);
  const double loads = c * (3 * Dk + c);
  return cols + loads + kChunkLatencyUnits;
}

// One CTA per (token, head) row: thread 0 sums the squares in order (the
// CPU's), then every thread scales its elements.
__global__ void gdn_gated_rmsnorm_kernel(const float* x, const float* __restrict__ z, int Dv,
                                         const float* __restrict__ w, float eps, float* y) {
  __shared__ float inv;
  const int64_t r = blockIdx.x;
  const float* xr = x + r * Dv;
  if (threadIdx.x == 0) {
    float ss = 0.0f;
    for (int i = 0; i < Dv; ++i) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
    inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(Dv)), eps)));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < Dv; i += blockDim.x) {
    const float xv = xr[i], zv = z[r * Dv + i];
    y[r * Dv + i] = __fmul_rn(__fmul_rn(w[i], __fmul_rn(xv, inv)), silu_f(zv));
  }
}

__global__ void split_q_gate_kernel(const float* __restrict__ qg, int64_t rows, int D, float* __restrict__ q,
                                    float* __restrict__ gate) {
  // rows = T * Hq; element i of row r.
  const int64_t n = rows * D;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = j / D, i = j % D;
    q[j] = qg[r * 2 * D + i];
    gate[j] = qg[r * 2 * D + D + i];
  }
}

__global__ void mul_sigmoid_kernel(float* x, const float* __restrict__ gate, int64_t n) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[j] = __fmul_rn(x[j], sigmoid_f(gate[j]));
}

unsigned grid_1d(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

void check_dims(const GdnDims& d, const char* op) {
  if (d.num_k_heads <= 0 || d.num_v_heads <= 0 || d.num_v_heads % d.num_k_heads != 0 || d.k_head_dim <= 0 ||
      d.v_head_dim <= 0 || d.conv_kernel < 1 || d.conv_kernel > kGdnMaxConvKernel)
    throw std::invalid_argument(std::string("cuda::") + op + ": bad Gated DeltaNet shape (Hk " +
                                std::to_string(d.num_k_heads) + ", Hv " + std::to_string(d.num_v_heads) + ", Dk " +
                                std::to_string(d.k_head_dim) + ", Dv " + std::to_string(d.v_head_dim) +
                                ", conv kernel " + std::to_string(d.conv_kernel) + ", at most " +
                                std::to_string(kGdnMaxConvKernel) + ")");
}

// A rule kernel's dynamic shared memory above 48 KB needs an opt-in per
// kernel and device; set once per (kernel, device) and size, outside any
// graph capture (the first call is the runner's eager warm-up; the chunked
// kernel is never in a captured decode graph).
void allow_smem(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> allowed;
  int dev = 0;
  FP8KV_CU(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  size_t& a = allowed[{kernel, dev}];
  if (a >= bytes) return;
  FP8KV_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  a = bytes;
}

// The recurrent kernel's launch (gdn_rule) on a pool of State: the state
// column in registers for the key head dims of real checkpoints and the
// tests (16 .. 128), else in shared memory (any Dk whose state fits; smem:
// its bytes).
template <class State>
void launch_rule_kernel(dim3 grid, int threads, size_t smem, cudaStream_t stream, const GdnSeqs& seqs,
                        const GdnDims& d, int chunk_begin, const float* qkv, const float* a, const float* b,
                        const float* A_log, const float* dt_bias, void* pool, float* out) {
  State* ssm_state = static_cast<State*>(pool);
  const size_t qk_smem = (2 * static_cast<size_t>(d.k_head_dim) + 2) * sizeof(float);
  switch (d.k_head_dim) {
    case 16: gdn_rule_kernel<16, State><<<grid, threads, qk_smem, stream>>>(seqs, d, chunk_begin, qkv, a, b, A_log,
                                                                            dt_bias, ssm_state, out); break;
    case 32: gdn_rule_kernel<32, State><<<grid, threads, qk_smem, stream>>>(seqs, d, chunk_begin, qkv, a, b, A_log,
                                                                            dt_bias, ssm_state, out); break;
    case 64: gdn_rule_kernel<64, State><<<grid, threads, qk_smem, stream>>>(seqs, d, chunk_begin, qkv, a, b, A_log,
                                                                            dt_bias, ssm_state, out); break;
    case 128: gdn_rule_kernel<128, State><<<grid, threads, qk_smem, stream>>>(seqs, d, chunk_begin, qkv, a, b, A_log,
                                                                              dt_bias, ssm_state, out); break;
    default:
      if (smem > 48 * 1024) allow_smem(reinterpret_cast<const void*>(gdn_rule_kernel<0, State>), smem);
      gdn_rule_kernel<0, State><<<grid, threads, smem, stream>>>(seqs, d, chunk_begin, qkv, a, b, A_log, dt_bias,
                                                                 ssm_state, out);
  }
}

}  // namespace

void gdn_conv(const GdnDims& d, const GdnSeqs& seqs, const float* x, const float* w, void* conv_state,
              bool state_bf16, float* out, cudaStream_t stream) {
  check_dims(d, "gdn_conv");
  if (seqs.num_seqs <= 0) return;
  const int64_t C = d.conv_dim();
  constexpr int kThreads = 128;
  // Runs of kConvRun rows in parallel when the longest sequence is known
  // (a captured decode step: one run); unknown: one run per sequence.
  const int runs = seqs.max_query_len > kConvRun ? (seqs.max_query_len + kConvRun - 1) / kConvRun : 1;
  const dim3 grid(static_cast<unsigned>((C + kThreads - 1) / kThreads), static_cast<unsigned>(seqs.num_seqs),
                  static_cast<unsigned>(runs));
  gdn_conv_kernel<<<grid, kThreads, 0, stream>>>(seqs, C, d.conv_kernel, x, w, conv_state, state_bf16, out);
  FP8KV_CU_LAUNCH();
}

GdnChunkPlan gdn_chunk_plan_at(const GdnDims& d, int split, size_t max_smem) {
  const int Dk = d.k_head_dim, Dv = d.v_head_dim;
  if (split <= 0 || Dk <= 0 || Dv <= 0 || Dk % 4 != 0 || Dv % split != 0 || (Dv / split) % 4 != 0) return {};
  GdnChunkPlan p;
  for (const int ldt : {kChunk + 4, kChunk}) {
    const size_t bytes = prep_smem_bytes(Dk, ldt);
    if (bytes <= max_smem) {
      p.prep_ld_t = ldt;
      p.prep_smem = bytes;
      break;
    }
  }
  if (p.prep_ld_t == 0) return {};
  for (const int ldt : {kChunk + 4, kChunk}) {
    const size_t bytes = chunk_smem_bytes(Dk, Dv / split, ldt);
    if (bytes <= max_smem) {
      p.split = split;
      p.ld_t = ldt;
      p.smem = bytes;
      // Resident CTAs per SM: the SM's shared memory is the block opt-in
      // plus one block's reservation; at most 2 (the launch bounds'
      // registers).
      p.ctas_per_sm = static_cast<int>(
          std::min<size_t>(2, (max_smem + kSmemReservedPerBlock) / (bytes + kSmemReservedPerBlock)));
      return p;
    }
  }
  return {};
}

GdnChunkPlan gdn_chunk_plan(const GdnDims& d, int multi_seqs, int num_sms, size_t max_smem) {
  GdnChunkPlan best;
  double best_t = 0.0;
  const double ctas = static_cast<double>(std::max(multi_seqs, 1)) * std::max(d.num_v_heads, 1);
  for (const int split : {1, 2, 4, 8}) {
    if (split > 1 && d.v_head_dim / split < 32) break;
    const GdnChunkPlan p = gdn_chunk_plan_at(d, split, max_smem);
    if (!p.ok()) continue;
    // m CTAs per SM, run r at a time; r co-resident CTAs take 1 + (r - 1) / 2
    // times one CTA's time (an estimate: the kernel is latency-bound).
    const double m = std::ceil(ctas * split / std::max(num_sms, 1)), r = p.ctas_per_sm;
    const double t = std::ceil(m / r) * (1.0 + 0.5 * (std::min(r, m) - 1.0)) * chunk_cost(d, split);
    if (!best.ok() || t < best_t) {
      best = p;
      best_t = t;
    }
  }
  return best;
}

size_t gdn_rule_scratch_bytes(const GdnDims& d, int64_t T) { return chunk_scratch_layout(d, T, nullptr, nullptr); }

void gdn_rule(const GdnDims& d, const GdnSeqs& seqs, const float* qkv, const float* a, const float* b,
              const float* A_log, const float* dt_bias, void* ssm_state, bool state_bf16, float* out, void* scratch,
              size_t scratch_bytes, cudaStream_t stream, const GdnRuleOptions& opt) {
  check_dims(d, "gdn_rule");
  if (seqs.num_seqs <= 0) return;
  const size_t smem = (static_cast<size_t>(d.k_head_dim) * d.v_head_dim + 2 * static_cast<size_t>(d.k_head_dim) + 2) *
                      sizeof(float);
  int dev = 0, max_smem = 0, num_sms = 0;
  FP8KV_CU(cudaGetDevice(&dev));
  FP8KV_CU(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  FP8KV_CU(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
  if (smem > static_cast<size_t>(max_smem) || d.v_head_dim > 1024)
    throw std::invalid_argument("cuda::gdn_rule: a head's state (Dk " + std::to_string(d.k_head_dim) + " x Dv " +
                                std::to_string(d.v_head_dim) + " f32, " + std::to_string(smem) +
                                " bytes with q and k) does not fit in the " + std::to_string(max_smem) +
                                " bytes of shared memory of one block (or Dv > 1024)");
  // The chunked kernels take the sequences of two or more rows from
  // seq_begin on, unless the step has none (a decode step: not launched).
  const int seq_begin = std::clamp(seqs.num_decodes, 0, seqs.num_seqs);
  GdnChunkPlan plan;
  if (!opt.recurrent_only && (seqs.max_query_len < 0 || seqs.max_query_len >= 2) && seq_begin < seqs.num_seqs) {
    if (opt.chunk_split > 0) {
      plan = gdn_chunk_plan_at(d, opt.chunk_split, static_cast<size_t>(max_smem));
      if (!plan.ok())
        throw std::invalid_argument(
            "cuda::gdn_rule: the chunked delta rule does not take split " + std::to_string(opt.chunk_split) +
            " for Dk " + std::to_string(d.k_head_dim) + " x Dv " + std::to_string(d.v_head_dim) +
            " (Dk and Dv / split must be multiples of 4, and its " +
            std::to_string(chunk_smem_bytes(d.k_head_dim, std::max(d.v_head_dim / opt.chunk_split, 1), kChunk)) +
            " bytes of buffers must fit in the " + std::to_string(max_smem) + " bytes of shared memory of one block)");
    } else {
      plan = gdn_chunk_plan(d, seqs.num_seqs - seq_begin, num_sms, static_cast<size_t>(max_smem));
    }
  }
  ChunkScratch sc;
  if (plan.ok()) {
    if (seqs.num_tokens < 0)
      throw std::invalid_argument(
          "cuda::gdn_rule: a step with sequences of two or more rows needs GdnSeqs::num_tokens");
    const size_t need = chunk_scratch_layout(d, seqs.num_tokens, scratch, &sc);
    if (!scratch || scratch_bytes < need)
      throw std::invalid_argument("cuda::gdn_rule: the chunked delta rule needs " + std::to_string(need) +
                                  " bytes of scratch for " + std::to_string(seqs.num_tokens) + " rows, given " +
                                  std::to_string(scratch ? scratch_bytes : 0));
  }
  const int threads = (d.v_head_dim + 31) / 32 * 32;
  const dim3 grid(static_cast<unsigned>(d.num_v_heads), static_cast<unsigned>(seqs.num_seqs));
  const int chunk_begin = plan.ok() ? seq_begin : INT_MAX;
  if (state_bf16)
    launch_rule_kernel<__nv_bfloat16>(grid, threads, smem, stream, seqs, d, chunk_begin, qkv, a, b, A_log, dt_bias,
                                      ssm_state, out);
  else
    launch_rule_kernel<float>(grid, threads, smem, stream, seqs, d, chunk_begin, qkv, a, b, A_log, dt_bias, ssm_state,
                              out);
  FP8KV_CU_LAUNCH();
  if (!plan.ok() || seqs.num_tokens == 0) return;
  const ChunkArgs args{seqs, d, plan.split, plan.ld_t, plan.prep_ld_t, seq_begin, qkv, a, b, A_log, dt_bias,
                       ssm_state, out, sc};
  // Steps 1-3 of every chunk, then the sequences' walks through the state.
  if (plan.prep_smem > 48 * 1024) allow_smem(reinterpret_cast<const void*>(gdn_chunk_prep_kernel), plan.prep_smem);
  const dim3 pgrid(static_cast<unsigned>((seqs.num_tokens + kChunk - 1) / kChunk),
                   static_cast<unsigned>(d.num_v_heads));
  gdn_chunk_prep_kernel<<<pgrid, kChunkThreads, plan.prep_smem, stream>>>(args);
  FP8KV_CU_LAUNCH();
  const int Dvs = d.v_head_dim / plan.split;
  const int tv = chunk_tile_rows(kChunk, Dvs), ts = chunk_tile_rows(d.k_head_dim, Dvs);
  const ChunkKernel kern = state_bf16 ? chunk_kernel<__nv_bfloat16>(tv, ts) : chunk_kernel<float>(tv, ts);
  if (plan.smem > 48 * 1024) allow_smem(reinterpret_cast<const void*>(kern), plan.smem);
  const dim3 cgrid(static_cast<unsigned>(d.num_v_heads * plan.split), static_cast<unsigned>(seqs.num_seqs - seq_begin));
  kern<<<cgrid, kChunkThreads, plan.smem, stream>>>(args);
  FP8KV_CU_LAUNCH();
}

void gdn_gated_rmsnorm(const float* x, const float* z, int64_t T, int Hv, int Dv, const float* w, float eps,
                       float* y, cudaStream_t stream) {
  const int64_t rows = T * Hv;
  if (rows <= 0) return;
  if (rows > 0x7fffffff) throw std::invalid_argument("cuda::gdn_gated_rmsnorm: too many rows");
  const int threads = Dv >= 128 ? 128 : (Dv + 31) / 32 * 32;
  gdn_gated_rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, z, Dv, w, eps, y);
  FP8KV_CU_LAUNCH();
}

void split_q_gate(const float* qg, int64_t T, int Hq, int D, float* q, float* gate, cudaStream_t stream) {
  const int64_t n = T * Hq * D;
  if (n <= 0) return;
  split_q_gate_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(qg, T * Hq, D, q, gate);
  FP8KV_CU_LAUNCH();
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  mul_sigmoid_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(x, gate, n);
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
