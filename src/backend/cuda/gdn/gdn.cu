// Gated DeltaNet kernels (gdn.h): the conv, the recurrent rule and the norm
// one thread per output column in the CPU reference's operation order
// (backend/cpu/gdn.cpp); the chunked rule's state pass on TF32 tensor cores
// (its comment).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
// a later run's window starts at row kConvRun - (K-1) >= 0. KC: the
// kernel size at compile time (4, Qwen3.5's: no runtime selects in the
// window), or 0 (K up to kGdnMaxConvKernel at run time).
constexpr int kConvRun = 64;
constexpr int kConvBatch = 8;
static_assert(kConvRun >= kGdnMaxConvKernel, "a later run's window must not reach the state");

template <int KC>
__global__ void gdn_conv_kernel(GdnSeqs seqs, int64_t C, int k_arg, const float* __restrict__ x,
                                const float* __restrict__ w, void* state, bool bf16, float* __restrict__ out) {
  constexpr int KM = KC > 0 ? KC : kGdnMaxConvKernel;  // the windows' size
  const int K = KC > 0 ? KC : k_arg;
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
  float win[KM], wc[KM], old[KM];
#pragma unroll
  for (int j = 0; j < KM; ++j) {
    win[j] = 0.0f;
    old[j] = 0.0f;
    wc[j] = j < K ? w[c * K + j] : 0.0f;
  }
  if (t0 == 0) {
    if (!fresh) {
#pragma unroll
      for (int i = 0; i < KM - 1; ++i)
        if (i < P) old[i] = win[i] = bf16 ? __bfloat162float(s16[base + i]) : s32[base + i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < KM - 1; ++i)
      if (i < P) win[i] = in_x(t0 - P + i);
  }
  // kConvBatch rows' inputs are loaded before any of them is computed, so
  // each thread has that many loads in flight (one at a time left the
  // kernel latency-bound).
  for (int tb = t0; tb < t1; tb += kConvBatch) {
    float xb[kConvBatch];
#pragma unroll
    for (int u = 0; u < kConvBatch; ++u) xb[u] = tb + u < t1 ? in_x(tb + u) : 0.0f;
#pragma unroll
    for (int u = 0; u < kConvBatch; ++u) {
      if (tb + u >= t1) break;
      // win[0..P-1]: the previous P inputs (oldest first); win[P]: this one.
#pragma unroll
      for (int j = 0; j < KM; ++j)
        if (j == P) win[j] = xb[u];
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < KM; ++j)
        if (j < K) acc = __fadd_rn(acc, __fmul_rn(wc[j], win[j]));
      out[(r0 + tb + u) * C + c] = silu_f(acc);
#pragma unroll
      for (int j = 0; j < KM - 1; ++j)
        if (j < P) win[j] = win[j + 1];
    }
  }
  if (t0 != 0) return;
  // The new state: inputs n - P .. n - 1 of [old state (P), x (n)].
#pragma unroll
  for (int i = 0; i < KM - 1; ++i)
    if (i < P) {
      const int q = n + i;  // index into the concatenation
      float v = 0.0f;
#pragma unroll
      for (int j = 0; j < KM - 1; ++j)
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
//     (one thread per row, the CPU's sequential sum), then q, k normalized
//     and rounded to TF32.
//  2. L = beta_i (k_i . k_j) exp(cum_i - cum_j) (j < i) -> LT [64][64] and
//     A = (q_i . k_j) exp(cum_i - cum_j) (j <= i), the products on TF32
//     tensor cores (the m16n8 tiles on or below the diagonal of each);
//     A^T (TF32) -> shared memory, then as f16 pairs (pair rows, below) to
//     the scratch, with KD = (k / |k|) exp(last - cum) and q / |q| scale.
//  3. Forward substitution of (I + L) X = B for every column of U = v beta
//     (Dv columns) and W = (k beta) exp(cum) (Dk columns), one thread per
//     column, the column in 64 registers (right-looking: when x_j is final
//     every x_i, i > j, takes its term, so each x_i takes its terms in the
//     CPU's order j = 0, 1, ... with 63 - j independent multiply-adds per
//     step instead of one dependent chain) -> the scratch.
// The scratch (ChunkScratch): per value head and row of the step W [Dk]
// (TF32), U [Dv] (f32), A^T and KD (f16 pairs), exp(cum) and exp(last); per
// key head and row q (f16 pairs). Every MMA operand the prep writes holds a
// TF32 value.
//
// Sequential (gdn_rule_chunked_kernel): one CTA of kChunkThreads per (value
// head h, Dv slice, sequence): the slice is columns [c0, c0 + Dvs) of the
// head's state, Dvs = Dv / split. The products run on TF32 tensor cores
// (mma.sync m16n8k8, f32 accumulators): each operand is rounded to TF32
// (round to nearest) when it is stored in shared memory, so a fragment load
// is a plain 32-bit load. The state S [Dk][Dvs] lives in f32 registers for
// the whole sequence (each warp owns 32 x 32 tiles of it as accumulator
// fragments; one read and one write of the pool per step) and its TF32
// copy Sr in shared memory. Per chunk:
//  4. v_new = U - W Sr (written over U, rounded to TF32);
//  5. o_i = exp(cum_i) (q_i Sr) + sum_{j <= i} A_ij v_new_j -> out (the warp
//     of rows i takes the A^T columns j < i + 16 only);
//  6. S = exp(last) S + KD^T v_new (in the registers), Sr = TF32(S), with
//     KD [64][Dk] = (k_i 1/|k_i|) exp(last - cum_i).
// The operands come by cp.async from the scratch, as the prep laid them
// out, in two groups per chunk: q, W and U (what the first phase reads)
// and A^T, KD, exp(cum) and exp(last) (what only the second reads); q, KD
// and A^T as f16 pairs (half the bytes of f32), widened exactly to f32 in
// the fragment loads. Two phases per chunk, three barriers: (1) v_new
// (step 4) and q S (step 5's first half, kept in registers), which read
// Sr; (2) the rest of step 5 and step 6 (the state in registers, then its
// TF32 copy, which no warp reads after phase 1). The next chunk's first group is issued as phase 2 starts (its
// buffers are free; two U buffers) and its second when phase 2 ends, so
// each group lands during a phase. Row strides are padded so that every
// fragment load and accumulator store is free of bank conflicts
// (SeqLayout). A column's arithmetic is the same whatever the split (the
// MMAs' reduction order over k does not depend on the columns), so the
// results are bitwise independent of it. Against the CPU's f32 rule the
// outputs move by ~1e-3 relative (tests/cuda_ops/test_gdn_cuda.cpp: the
// statistical bound). Dk <= 128 and Dv / split <= 64: a warp owns at most
// one 32 x 32 state tile and one 16 x 32 output tile.
// Shared memory (32-bit words): prep 2 Dk ld_t (ld_t = 72) + LT and A^T 2 x
// 64 x 64 + 7 x 64 + 4 (108.3 KB for Dk = 128: two CTAs per SM); sequential SeqLayout:
// Sr Dk ldS + q 64 x 68 + W 64 ldW + KD 32 ldK + U 2 x 64 ldS + A^T 32 x 72
// + 68; for Dk = Dv = 128: 151.8 KB at split 2, 119.1 KB at split 4 (one
// CTA per SM).

constexpr int kChunk = kGdnCudaChunk;
constexpr int kChunkThreads = 256;
constexpr int kChunkWarps = kChunkThreads / 32;
constexpr int kPrepVecFloats = 7 * kChunk + 4;  // g, beta, cum, exp(cum), exp(last - cum), 1/|q|, 1/|k|; exp(last)
constexpr int kLdAT = kChunk + 8;               // the sequential kernel's A^T row stride (% 32 = 8)
constexpr int kMmaMaxDk = 128;                  // the largest Dk the sequential kernel takes
constexpr int kMmaMaxDvs = 64;                  // ... and Dv / split: one state tile and one output tile per warp
constexpr int kRowVecs = 2;  // the scratch's per-row vectors: exp(cum), exp(last)

size_t prep_smem_bytes(int Dk, int ldt) {
  return sizeof(float) *
         (2 * static_cast<size_t>(Dk) * ldt + 2 * static_cast<size_t>(kChunk) * kChunk + kPrepVecFloats);
}

// Pair rows. An MMA operand that is at most 1 in magnitude (q, KD, A^T) is
// stored as two f16 per 32-bit word, each the operand's TF32 value (exact in
// f16 from 2^-14 up; below, f16's subnormal grid of 2^-24 stands in for
// TF32's relative one: an absolute error <= 2^-25, against 2^-12 relative for
// TF32 rounding), paired as one m16n8k8 fragment register pair reads them:
// the values at k and k + 4 of each group of 8 along the MMA's k. For a
// chunk's rows j (k along the rows: KD, A^T) pair row p holds rows j =
// 8 (p / 4) + p % 4 (low half) and j + 4 (high half); a chunk of nc rows has
// pair_rows(nc) <= nc of them, so they fit in the scratch rows of its own
// rows. For q (k along the columns) word w of a row holds columns 8 (w / 4) +
// w % 4 and that + 4.
__host__ __device__ constexpr int pair_rows(int nc) { return 4 * (nc / 8) + (nc % 8 < 4 ? nc % 8 : 4); }
__device__ __forceinline__ int pair_lo(int p) { return 8 * (p / 4) + p % 4; }
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The prep kernel's outputs over the step's T rows, per value head h and
// row r (pieces 256-byte aligned, in this order):
struct ChunkScratch {
  float* W = nullptr;    // [Hv][T][Dk]: row i of the chunk's (I + L)^{-1} (k beta exp(cum))
  float* U = nullptr;    // [Hv][T][Dv]: row i of (I + L)^{-1} (v beta)
  uint32_t* A = nullptr;   // [Hv][T][64]: pair row p of the chunk's A^T (A_ij at i; 0 for i < j), f16 pairs
  uint32_t* KD = nullptr;  // [Hv][T][Dk]: pair row p of the chunk's KD = (k / |k|) exp(last - cum), f16 pairs
  uint32_t* Q = nullptr;   // [Hk][T][Dk / 2]: row i of q / |q| scale, f16 pairs (by key head)
  float* vec = nullptr;    // [kRowVecs][Hv][T]
  int64_t T = 0;
};

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// The scratch's layout for dims d and T rows at `base` (nullptr: offsets
// from 0); returns its size in bytes.
size_t chunk_scratch_layout(const GdnDims& d, int64_t T, void* base, ChunkScratch* sc) {
  const size_t rows = static_cast<size_t>(std::max<int64_t>(T, 0)) * static_cast<size_t>(d.num_v_heads);
  const size_t krows = static_cast<size_t>(std::max<int64_t>(T, 0)) * static_cast<size_t>(d.num_k_heads);
  const size_t w = align256(rows * d.k_head_dim * sizeof(float)), u = align256(rows * d.v_head_dim * sizeof(float)),
               a = align256(rows * kChunk * sizeof(uint32_t)), kd = align256(rows * d.k_head_dim * sizeof(uint32_t)),
               q = align256(krows * (d.k_head_dim / 2) * sizeof(uint32_t)),
               v = align256(rows * kRowVecs * sizeof(float));
  if (sc) {
    char* p = static_cast<char*>(base);
    sc->W = reinterpret_cast<float*>(p);
    sc->U = reinterpret_cast<float*>(p + w);
    sc->A = reinterpret_cast<uint32_t*>(p + w + u);
    sc->KD = reinterpret_cast<uint32_t*>(p + w + u + a);
    sc->Q = reinterpret_cast<uint32_t*>(p + w + u + a + kd);
    sc->vec = reinterpret_cast<float*>(p + w + u + a + kd + q);
    sc->T = T;
  }
  return w + u + a + kd + q + v;
}

struct ChunkArgs {
  GdnSeqs seqs;
  GdnDims dm;
  int split, prep_ldt, seq_begin;
  const float* qkv;
  const float* a;
  const float* b;
  const float* A_log;
  const float* dt_bias;
  void* pool;  // [slots][Hv][Dk][Dv] of the kernel's State
  float* out;
  ChunkScratch sc;
};

// x rounded to TF32 (10 mantissa bits), to nearest with ties away from zero:
// the value an MMA operand holds (the tensor cores read only those bits).
__device__ __forceinline__ float tf32_rna(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// d += a b, one m16n8k8 TF32 MMA with f32 accumulators (PTX ISA fragment
// layouts; g = lane / 4, t = lane % 4): a = A(g, t), A(g + 8, t), A(g, t + 4),
// A(g + 8, t + 4); b = B(t, g), B(t + 4, g); d = D(g, 2t), D(g, 2t + 1),
// D(g + 8, 2t), D(g + 8, 2t + 1).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One warp's (16 MT) x (8 NT) tile of a product: acc[mt][nt] += sum over k in
// [0, K) (K a multiple of 8, in steps of 8) of A(16 mt + m, k) B(k, 8 nt + n),
// for the first mts row tiles and nts column tiles (the rest untouched).
// load_a(mt, k0, a) fills row tile mt's A fragment at k0 (the loaders
// below); B(k, n) = B[k ldb + n] holds TF32 values (rounded when they were
// stored). The strides are chosen so that the fragment loads are free of
// bank conflicts (the loaders say which).
template <int MT, int NT, class LoadA>
__device__ __forceinline__ void warp_mma(LoadA&& load_a, const float* B, int ldb, int K, int mts, int nts,
                                         float (&acc)[MT][NT][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll 2
  for (int k0 = 0; k0 < K; k0 += 8) {
    uint32_t a[MT][4], b[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a(mt, k0, a[mt]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float* q = B + (k0 + t) * ldb + 8 * nt + g;
      b[nt][0] = __float_as_uint(q[0]);
      b[nt][1] = __float_as_uint(q[4 * ldb]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        if (mt < mts && nt < nts) mma_tf32(acc[mt][nt], a[mt], b[nt]);
  }
}

// A fragment loaders (g = lane / 4, t = lane % 4). f32_rows: A(m, k) =
// A[m ld + k], TF32 values (ld % 32 = 4). Pair loaders (pair rows, above):
// pairs_rows: row m of A is a q row, word k0 / 2 + t of it holds A(m, k0 +
// t) and A(m, k0 + t + 4) (ld words, % 32 = 4); pairs_cols: A(m, k) = X(k,
// m) for row-paired X, pair row k0 / 2 + t, word m (ld words, % 32 = 8).
__device__ __forceinline__ void unpack_pair(uint32_t w, uint32_t& lo, uint32_t& hi) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
  lo = __float_as_uint(f.x);
  hi = __float_as_uint(f.y);
}
__device__ __forceinline__ auto f32_rows(const float* A, int ld) {
  return [A, ld](int mt, int k0, uint32_t(&a)[4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float* p = A + (16 * mt + g) * ld + k0 + t;
    a[0] = __float_as_uint(p[0]);
    a[1] = __float_as_uint(p[8 * ld]);
    a[2] = __float_as_uint(p[4]);
    a[3] = __float_as_uint(p[8 * ld + 4]);
  };
}
__device__ __forceinline__ auto f32_cols(const float* A, int ld) {  // A(m, k) = A[k ld + m] (ld % 32 = 8)
  return [A, ld](int mt, int k0, uint32_t(&a)[4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float* p = A + (k0 + t) * ld + 16 * mt + g;
    a[0] = __float_as_uint(p[0]);
    a[1] = __float_as_uint(p[8]);
    a[2] = __float_as_uint(p[4 * ld]);
    a[3] = __float_as_uint(p[4 * ld + 8]);
  };
}
__device__ __forceinline__ auto pairs_rows(const uint32_t* A, int ld) {
  return [A, ld](int mt, int k0, uint32_t(&a)[4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t* p = A + (16 * mt + g) * ld + k0 / 2 + t;
    unpack_pair(p[0], a[0], a[2]);
    unpack_pair(p[8 * ld], a[1], a[3]);
  };
}
__device__ __forceinline__ auto pairs_cols(const uint32_t* X, int ld) {
  return [X, ld](int mt, int k0, uint32_t(&a)[4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const uint32_t* p = X + (k0 / 2 + t) * ld + 16 * mt + g;
    unpack_pair(p[0], a[0], a[2]);
    unpack_pair(p[8], a[1], a[3]);
  };
}

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
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of the thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
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
  float* LT = KT + Dk * ldt;          // [64][64]
  float* ATs = LT + kChunk * kChunk;  // [64][64]: A^T, TF32 (entries of the tiles above the diagonal unwritten)
  float* gv = ATs + kChunk * kChunk;  // [64] g
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
  uint32_t* __restrict__ Ag = p.sc.A + hT * kChunk;
  uint32_t* __restrict__ KDg = p.sc.KD + hT * Dk;
  // q is the key head's: written by the first of its value heads.
  uint32_t* __restrict__ Qg = h % (Hv / Hk) == 0 ? p.sc.Q + static_cast<int64_t>(kh) * T * (Dk / 2) : nullptr;
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
        const float kn = tf32_rna(__fmul_rn(KT[x], ik));
        QT[x] = tf32_rna(__fmul_rn(__fmul_rn(QT[x], iq), scale));
        KT[x] = kn;
      }
      if (tid < nc) {
        const int64_t HT = static_cast<int64_t>(Hv) * T, r = row0 + tid;
        vg[r] = ev[tid];
        vg[HT + r] = misc[0];
      }
    }
    __syncthreads();

    // 2. L = beta_i (k_i . k_j) exp(cum_i - cum_j) (j < i) -> LT and A =
    // (q_i . k_j) exp(cum_i - cum_j) (j <= i) -> ATs, the products on TF32
    // tensor cores (q and k TF32 since 1c): the 20 m16n8 tiles of each
    // that hold an entry on or below the diagonal (row tile mt: column
    // tiles nt <= 2 mt + 1), five per warp (warps 0-3: L, 4-7: A). Row
    // tiles from nc on are zeros (what their zero q, k rows and beta give);
    // entries above the diagonal are written 0 where a tile holds them.
    {
      const bool isA = warp >= kChunkWarps / 2;
      const int g = lane / 4, t4 = lane % 4;
      for (int k5 = 0; k5 < 5; ++k5) {
        const int tile = 5 * (warp % 4) + k5;
        int mt = 0, base = 0;
        while (base + 2 * mt + 2 <= tile) {
          base += 2 * mt + 2;
          ++mt;
        }
        const int nt = tile - base;
        float acc[1][1][4] = {};
        if (16 * mt < nc) warp_mma<1, 1>(f32_cols((isA ? QT : KT) + 16 * mt, ldt), KT + 8 * nt, ldt, Dk, 1, 1, acc);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 16 * mt + g + 8 * (e / 2), j = 8 * nt + 2 * t4 + e % 2;
          const float x = acc[0][0][e], d = expf(__fsub_rn(cum[i], cum[j]));
          if (isA)  // A^T: an MMA operand of the sequential kernel, TF32
            ATs[j * kChunk + i] = j <= i ? tf32_rna(__fmul_rn(x, d)) : 0.0f;
          else
            LT[j * kChunk + i] = j < i ? __fmul_rn(__fmul_rn(bet[i], x), d) : 0.0f;
        }
      }
    }
    __syncthreads();

    // 2b. The sequential kernel's f16 pair rows (above), 16 bytes per thread
    // and store: A^T (the tiles above the diagonal 0) and KD =
    // TF32((k / |k|) exp(last - cum)) (rows past nc 0: so are their
    // exp(last - cum)), pair rows [0, pair_rows(nc)); q / |q| scale (TF32),
    // rows [0, nc).
    {
      const int np = pair_rows(nc);
      for (int e = tid; e < np * (kChunk / 4); e += kChunkThreads) {
        const int pr = e / (kChunk / 4), i = 4 * (e % (kChunk / 4)), j = pair_lo(pr);
        uint32_t w[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float lo = i + c >= j ? ATs[j * kChunk + i + c] : 0.0f;
          const float hi = i + c >= j + 4 ? ATs[(j + 4) * kChunk + i + c] : 0.0f;
          w[c] = pack_pair(lo, hi);
        }
        *reinterpret_cast<uint4*>(Ag + static_cast<int64_t>(row0 + pr) * kChunk + i) = make_uint4(w[0], w[1], w[2], w[3]);
      }
      // Lanes: 8 pair rows x 4 column groups (two-way bank conflicts on KT).
      const int kq = Dk / 4;
      for (int e = tid; e < 32 * kq; e += kChunkThreads) {
        const int pr = e % 8 + 8 * (e / (8 * kq)), a = 4 * ((e / 8) % kq), j = pair_lo(pr);
        if (pr >= np) continue;
        uint32_t w[4];
#pragma unroll
        for (int c = 0; c < 4; ++c)
          w[c] = pack_pair(tf32_rna(__fmul_rn(KT[(a + c) * ldt + j], dl[j])),
                           tf32_rna(__fmul_rn(KT[(a + c) * ldt + j + 4], dl[j + 4])));
        *reinterpret_cast<uint4*>(KDg + static_cast<int64_t>(row0 + pr) * Dk + a) = make_uint4(w[0], w[1], w[2], w[3]);
      }
      if (Qg) {
        for (int e = tid; e < kChunk * (Dk / 8); e += kChunkThreads) {
          const int i = e % kChunk, c8 = e / kChunk;
          if (i >= nc) continue;
          uint32_t w[4];
#pragma unroll
          for (int c = 0; c < 4; ++c)
            w[c] = pack_pair(tf32_rna(QT[(8 * c8 + c) * ldt + i]), tf32_rna(QT[(8 * c8 + c + 4) * ldt + i]));
          *reinterpret_cast<uint4*>(Qg + static_cast<int64_t>(row0 + i) * (Dk / 2) + 4 * c8) =
              make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }

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
      for (int i = 0; i < kChunk; ++i)  // W: an MMA operand of the sequential kernel, TF32; U: f32
        if (i < nc) dst[static_cast<int64_t>(i) * ld] = isU ? x[i] : tf32_rna(x[i]);
    }
    row0 += nc;
  }
}

// The sequential kernel's shared-memory layout for Dk x Dvs (floats; every
// row stride a multiple of 4, so rows are 16-byte aligned for cp.async).
struct SeqLayout {
  // In 32-bit words: Sr, U: % 32 = 8 (f32); W: % 32 = 4 (f32); q: % 32 = 4,
  // KD, A^T: % 32 = 8 (f16 pairs).
  int ldS, ldW, ldQ, ldK;
  size_t sr, q, w, kd, u0, u1, at, ev, floats;
  __host__ __device__ SeqLayout(int Dk, int Dvs) {
    const int dk32 = (Dk + 31) / 32 * 32, dv32 = (Dvs + 31) / 32 * 32;
    ldS = dv32 + 8;
    ldW = dk32 + 4;
    ldQ = (Dk / 2 + 31) / 32 * 32 + 4;
    ldK = dk32 + 8;
    sr = 0;
    q = sr + static_cast<size_t>(Dk) * ldS;         // [64][ldQ]
    w = q + static_cast<size_t>(kChunk) * ldQ;      // [64][ldW]
    kd = w + static_cast<size_t>(kChunk) * ldW;     // [32][ldK]
    u0 = kd + static_cast<size_t>(kChunk / 2) * ldK;
    u1 = u0 + static_cast<size_t>(kChunk) * ldS;
    at = u1 + static_cast<size_t>(kChunk) * ldS;    // [32][kLdAT]
    ev = at + static_cast<size_t>(kChunk / 2) * kLdAT;
    floats = ev + kChunk + 4;  // exp(cum) [64], exp(last)
  }
};

// Steps 4-6 (the header comment) on TF32 tensor cores; State: the pool's
// element type. Dvs <= 64 and Dk <= 128 (the plan's limits), so each warp
// owns at most one 32 x 32 state tile and one 16 x 32 output tile.
template <class State>
__global__ void __launch_bounds__(kChunkThreads, 1) gdn_rule_chunked_kernel(ChunkArgs p) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int split = p.split;
  const int h = blockIdx.x / split, part = blockIdx.x % split, s = p.seq_begin + blockIdx.y;
  const int Hk = p.dm.num_k_heads, Hv = p.dm.num_v_heads, Dk = p.dm.k_head_dim, Dv = p.dm.v_head_dim;
  const int Dvs = Dv / split, cs = part * Dvs;  // this CTA's columns [cs, cs + Dvs)
  const int64_t VD = p.dm.value_dim(), T = p.sc.T;
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
  const SeqLayout L(Dk, Dvs);
  const int ldS = L.ldS, ldW = L.ldW, ldQ = L.ldQ, ldK = L.ldK;
  float* Sr = sm + L.sr;  // [Dk][ldS]: the state, TF32
  uint32_t* Qs = reinterpret_cast<uint32_t*>(sm + L.q);   // [64][ldQ]: q / |q| scale, f16 pairs
  float* Ws = sm + L.w;                                    // [64][ldW]: W (TF32 from the prep)
  uint32_t* Ks = reinterpret_cast<uint32_t*>(sm + L.kd);  // [32][ldK]: KD pair rows
  float* const Ub0 = sm + L.u0;  // [64][ldS]: U, then v_new (TF32) in place; two buffers
  float* const Ub1 = sm + L.u1;
  uint32_t* AT = reinterpret_cast<uint32_t*>(sm + L.at);  // [32][kLdAT]: A^T pair rows
  float* ev = sm + L.ev;  // [64] exp(cum), 0 past the chunk; [64]: exp(last)

  const int pos0 = p.seqs.context_lens[s] - n;
  const int kh = h / (Hv / Hk);
  const int64_t hT = static_cast<int64_t>(h) * T, HT = static_cast<int64_t>(Hv) * T;
  const float* __restrict__ Wg = p.sc.W + hT * Dk;                                     // + row Dk
  const float* __restrict__ Ug = p.sc.U + hT * Dv + cs;                                // + row Dv
  const float* __restrict__ Ag = reinterpret_cast<const float*>(p.sc.A + hT * kChunk);  // + row 64
  const float* __restrict__ KDg = reinterpret_cast<const float*>(p.sc.KD + hT * Dk);    // + row Dk
  const float* __restrict__ Qg =
      reinterpret_cast<const float*>(p.sc.Q + static_cast<int64_t>(kh) * T * (Dk / 2));  // + row Dk / 2
  const float* __restrict__ vg = p.sc.vec + hT;  // + k HT + row: vector k
  const int dq = Dk / 4;                         // 16-byte pieces of a W or KD row
  const int uq = Dvs / 4;                        // ... of a U row

  // This warp's tiles: rows a0.., columns d0.. of the 32 x 32 state tile
  // (S in f32 registers for the whole sequence, Sr its TF32 copy), rows
  // i0.., columns e0.. of the 16 x 32 tile of steps 4 and 5.
  const int stn = (Dvs + 31) / 32, stm = (Dk + 31) / 32;
  const bool has_s = warp < stm * stn, has_o = warp < 4 * stn;
  const int a0 = (warp / stn) * 32, d0 = (warp % stn) * 32, i0 = (warp / stn) * 16;
  const int smt = has_s ? min(2, (Dk - a0) / 16) : 0, snt = has_s ? min(4, (Dvs - d0) / 8) : 0;
  const int ont = has_o ? min(4, (Dvs - d0) / 8) : 0;
  float S[2][4][4] = {};
  State* Sg = static_cast<State*>(p.pool) + (static_cast<int64_t>(slot) * Hv + h) * Dk * Dv + cs;
  // f(x, pool element) for each element x of the warp's state tile.
  auto each_state = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int a = a0 + 16 * mt + g + 8 * (e / 2), d = d0 + 8 * nt + 2 * t4 + e % 2;
          if (mt < smt && nt < snt) f(S[mt][nt][e], Sg[static_cast<int64_t>(a) * Dv + d], Sr[a * ldS + d]);
        }
  };
  const bool fresh = pos0 == 0;
  each_state([&](float& x, const State& pool, float& copy) {
    x = fresh ? 0.0f : state_f32(pool);
    copy = tf32_rna(x);
  });

  auto chunk_rows = [&](int t) { return min(n - t, kChunk - (pos0 + t) % kChunk); };
  // cp.async of rows [0, nc) of a [rows][pieces] source at src (row stride
  // sld floats) into dst (stride dld); rows nc..63 zeroed.
  auto stage_rows = [&](float* dst, int dld, const float* src, int64_t sld, int pieces, int nc, int rows) {
    for (int e = tid; e < rows * pieces; e += kChunkThreads) {
      const int i = e / pieces, c = 4 * (e % pieces);
      if (i < nc)
        cp_async16(dst + i * dld + c, src + i * sld + c);
      else
        *reinterpret_cast<float4*>(dst + i * dld + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  auto stage = [&](float* dst, int dld, const float* src, int64_t sld, int pieces, int nc) {
    stage_rows(dst, dld, src, sld, pieces, nc, kChunk);
  };
  // The chunk at row t (nc rows) in two cp.async groups: G1 = q, W, U (into
  // ubuf): what the first phase reads; G2 = A^T, KD, exp(cum), exp(last):
  // what only the second phase reads. (Words are copied as floats.)
  auto stage_g1 = [&](int t, int nc, float* ubuf) {
    const int64_t rs = r0 + t;
    stage(reinterpret_cast<float*>(Qs), ldQ, Qg + rs * (Dk / 2), Dk / 2, Dk / 8, nc);
    stage(Ws, ldW, Wg + rs * Dk, Dk, dq, nc);
    stage(ubuf, ldS, Ug + rs * Dv, Dv, uq, nc);
    cp_async_commit();
  };
  auto stage_g2 = [&](int t, int nc) {
    const int64_t rs = r0 + t;
    const int np = pair_rows(nc);
    stage_rows(reinterpret_cast<float*>(AT), kLdAT, Ag + rs * kChunk, kChunk, kChunk / 4, np, kChunk / 2);
    stage_rows(reinterpret_cast<float*>(Ks), ldK, KDg + rs * Dk, Dk, dq, np, kChunk / 2);
    if (tid < kChunk) {
      if (tid < nc)
        cp_async4(ev + tid, vg + rs + tid);
      else
        ev[tid] = 0.0f;
    }
    if (tid == 0) cp_async4(ev + kChunk, vg + HT + rs);
    cp_async_commit();
  };

  stage_g1(0, chunk_rows(0), Ub0);
  stage_g2(0, chunk_rows(0));
  int buf = 0;
  for (int t0 = 0; t0 < n;) {
    const int nc = chunk_rows(t0), nc8 = (nc + 7) / 8 * 8;
    const int64_t row0 = r0 + t0;
    float* const U = buf ? Ub1 : Ub0;
    cp_async_wait_group<1>();  // G1 of this chunk (its G2 may still be in flight)
    __syncthreads();  // q, W, U and the state's TF32 copy are in place

    // Phase 1: v_new = U - W S (over U, TF32) and q S (kept for step 5).
    float qs[1][4][4] = {};
    if (has_o && i0 < nc) {
      float acc[1][4][4] = {};
      warp_mma<1, 4>(f32_rows(Ws + i0 * ldW, ldW), Sr + d0, ldS, Dk, 1, ont, acc);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        if (nt < ont)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            float2* u = reinterpret_cast<float2*>(U + (i0 + g + 8 * hf) * ldS + d0 + 8 * nt + 2 * t4);
            const float2 x = *u;
            *u = make_float2(tf32_rna(__fsub_rn(x.x, acc[0][nt][2 * hf])),
                             tf32_rna(__fsub_rn(x.y, acc[0][nt][2 * hf + 1])));
          }
      warp_mma<1, 4>(pairs_rows(Qs + i0 * ldQ, ldQ), Sr + d0, ldS, Dk, 1, ont, qs);
    }
    cp_async_wait_group<0>();  // G2: A^T, KD, exp(cum), exp(last)
    __syncthreads();  // v_new, KD, A^T, exp(cum) in place; q, W and Sr are free

    const bool more = t0 + nc < n;
    const int nn = more ? chunk_rows(t0 + nc) : 0;
    if (more) stage_g1(t0 + nc, nn, buf ? Ub0 : Ub1);

    // Phase 2: o = exp(cum) (q S) + A v_new -> out; S = exp(last) S + KD^T
    // v_new (registers), Sr = TF32(S).
    if (has_o && i0 < nc) {
      const float e0 = ev[i0 + g], e1 = ev[i0 + g + 8];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        qs[0][nt][0] = __fmul_rn(qs[0][nt][0], e0);
        qs[0][nt][1] = __fmul_rn(qs[0][nt][1], e0);
        qs[0][nt][2] = __fmul_rn(qs[0][nt][2], e1);
        qs[0][nt][3] = __fmul_rn(qs[0][nt][3], e1);
      }
      warp_mma<1, 4>(pairs_cols(AT + i0, kLdAT), U + d0, ldS, min(i0 + 16, nc8), 1, ont, qs);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        if (nt < ont)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int i = i0 + g + 8 * hf;
            if (i < nc)
              *reinterpret_cast<float2*>(out + (row0 + i) * VD + ocol + d0 + 8 * nt + 2 * t4) =
                  make_float2(qs[0][nt][2 * hf], qs[0][nt][2 * hf + 1]);
          }
    }
    if (has_s) {
      const float el = ev[kChunk];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[mt][nt][e] = __fmul_rn(S[mt][nt][e], el);
      warp_mma<2, 4>(pairs_cols(Ks + a0, ldK), U + d0, ldS, nc8, smt, snt, S);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          if (mt < smt && nt < snt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf)
              *reinterpret_cast<float2*>(Sr + (a0 + 16 * mt + g + 8 * hf) * ldS + d0 + 8 * nt + 2 * t4) =
                  make_float2(tf32_rna(S[mt][nt][2 * hf]), tf32_rna(S[mt][nt][2 * hf + 1]));
    }
    __syncthreads();  // A^T, exp(cum), KD and v_new are free
    if (more) stage_g2(t0 + nc, nn);
    buf ^= 1;
    t0 += nc;
  }
  each_state([&](float x, State& pool, float&) { pool = state_from_f32<State>(x); });
}

using ChunkKernel = void (*)(ChunkArgs);

template <class State>
ChunkKernel chunk_kernel() {
  return gdn_rule_chunked_kernel<State>;
}

// The sequential kernel's work per CTA and chunk (the plan's cost), in
// f32 multiply-add units: per column of its slice W S, Q S, A v_new and the
// state update (on the tensor cores: kMmaSpeedup of them per unit, an
// estimate of TF32 MMA against f32 FMA throughput, not a fit), plus the
// chunk's loads (q, W, k, A^T: one unit per element), plus the chunk's fixed
// latency (the dependent steps and barriers every chunk waits through
// whatever its width): kChunkLatencyUnits, fitted on an H100 for the SIMT
// kernel this one replaced (1.20e-3 us per unit), not refitted. The latency
// dominates, so the plan takes the fewest waves of CTAs: split 2 for one
// 27B prefill (split 4 measured 1.50x slower at 1 x 8K), split 4 at TP 2.
constexpr double kChunkLatencyUnits = 1.28e6;
constexpr double kMmaSpeedup = 8.0;

double chunk_cost(const GdnDims& d, int split) {
  const double Dk = d.k_head_dim, Dvs = static_cast<double>(d.v_head_dim) / split, c = kChunk;
  const double cols = Dvs * (3 * c * Dk + c * (c + 1) / 2) / kMmaSpeedup;
  const double loads = c * (3 * Dk + c);
  return cols + loads + kChunkLatencyUnits;
}

// The gated norm's rows: V-float vectors (V = 4 when Dv % 4 == 0 and the
// pointers are 16-byte aligned, else 1), nv = Dv / V per row, staged in
// shared memory at a row stride of nv | 1 vectors. An odd stride keeps
// thread r's sequential walk along its row free of bank conflicts (32
// threads on scalars, each quarter warp's 8 on float4s); a warp's
// consecutive vectors of one row are conflict-free at any stride. R rows
// per block with their R inverse norms, at most 48 KB.
__host__ __device__ constexpr int gated_norm_stride(int nv) { return nv | 1; }
int gated_norm_rows(int Dv, int V) {
  const int S = gated_norm_stride(Dv / V) * V;
  return std::max(1, std::min(32, (12288 - 32) / S));
}

// The gated norm of R rows per block: each warp loads whole rows, coalesced,
// into shared memory (kNormRowsInFlight rows' loads issued before any is
// stored); thread r < R sums row r's squares sequentially (the CPU's order,
// no contraction); then each warp writes y = w (x inv) silu(z) for its
// rows, f32 or bf16 rounded once (out_proj's input). y may alias x (each
// block reads its rows before it writes them).
template <int V>
using NormVec = std::conditional_t<V == 4, float4, float>;
template <int V>
__device__ __forceinline__ float vec_at(const NormVec<V>& v, int e) {
  if constexpr (V == 4)
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
  else
    return v;
}
constexpr int kNormRowsInFlight = 8;

template <int V, bool OutBf16>
__global__ void gdn_gated_rmsnorm_kernel(const float* x, const float* __restrict__ z, int64_t rows, int Dv, int R,
                                         const float* __restrict__ w, float eps, void* y) {
  using Vec = NormVec<V>;
  extern __shared__ float smem[];
  const int nv = Dv / V, S = gated_norm_stride(nv);
  Vec* xs = reinterpret_cast<Vec*>(smem);  // [R][S]
  float* inv = smem + static_cast<size_t>(R) * S * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * R;
  const int nr = static_cast<int>(min(static_cast<int64_t>(R), rows - r0));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  const Vec* xb = reinterpret_cast<const Vec*>(x + r0 * Dv);
  for (int j = lane; j < nv; j += 32) {
#pragma unroll kNormRowsInFlight
    for (int r = warp; r < nr; r += nw) xs[r * S + j] = xb[static_cast<int64_t>(r) * nv + j];
  }
  __syncthreads();
  if (threadIdx.x < nr) {
    const Vec* xr = xs + threadIdx.x * S;
    float ss = 0.0f;
    for (int j = 0; j < nv; ++j) {
      const Vec v = xr[j];
#pragma unroll
      for (int e = 0; e < V; ++e) ss = __fadd_rn(ss, __fmul_rn(vec_at<V>(v, e), vec_at<V>(v, e)));
    }
    inv[threadIdx.x] = __fdiv_rn(1.0f, sqrtf(__fadd_rn(__fdiv_rn(ss, static_cast<float>(Dv)), eps)));
  }
  __syncthreads();
  const Vec* zb = reinterpret_cast<const Vec*>(z + r0 * Dv);
  const Vec* wv = reinterpret_cast<const Vec*>(w);
  for (int j = lane; j < nv; j += 32) {
    const Vec wj = wv[j];
#pragma unroll kNormRowsInFlight
    for (int r = warp; r < nr; r += nw) {
      const int64_t at = static_cast<int64_t>(r) * nv + j;
      const Vec xv = xs[r * S + j], zv = zb[at];
      float o[V];
#pragma unroll
      for (int e = 0; e < V; ++e)
        o[e] = __fmul_rn(__fmul_rn(vec_at<V>(wj, e), __fmul_rn(vec_at<V>(xv, e), inv[r])), silu_f(vec_at<V>(zv, e)));
      if constexpr (OutBf16) {
        __nv_bfloat16* yo = static_cast<__nv_bfloat16*>(y) + (r0 * Dv + at * V);
        if constexpr (V == 4) {
          *reinterpret_cast<__nv_bfloat162*>(yo) = __floats2bfloat162_rn(o[0], o[1]);
          *reinterpret_cast<__nv_bfloat162*>(yo + 2) = __floats2bfloat162_rn(o[2], o[3]);
        } else {
          *yo = __float2bfloat16_rn(o[0]);
        }
      } else {
        reinterpret_cast<Vec*>(static_cast<float*>(y) + r0 * Dv)[at] = *reinterpret_cast<const Vec*>(o);
      }
    }
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

// y[r][c] = x[r][c] * sigmoid(gate[r * gate_row_stride + h * gate_head_stride
// + i]) with c = h D + i (y f32, may be x, or bf16 rounded to nearest); V
// consecutive columns per thread (V = 4: D and the strides multiples of 4,
// the bases 16-byte aligned).
template <int V, bool OutBf16>
__global__ void mul_sigmoid_kernel(const float* x, int64_t rows, int cols, const float* __restrict__ gate,
                                   int64_t gate_row_stride, int D, int64_t gate_head_stride, void* y) {
  const int nv = cols / V;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* xr = x + r * cols;
    const float* gr = gate + r * gate_row_stride;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < nv; j += gridDim.x * blockDim.x) {
      const int c = j * V, h = c / D;
      const float* g = gr + h * gate_head_stride + (c - h * D);
      float v[V], gv[V];
      if constexpr (V == 4) {
        *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(xr + c);
        *reinterpret_cast<float4*>(gv) = *reinterpret_cast<const float4*>(g);
      } else {
        v[0] = xr[c];
        gv[0] = *g;
      }
#pragma unroll
      for (int e = 0; e < V; ++e) v[e] = __fmul_rn(v[e], sigmoid_f(gv[e]));
      if constexpr (OutBf16) {
        __nv_bfloat16* yr = static_cast<__nv_bfloat16*>(y) + r * cols + c;
        if constexpr (V == 4) {
          *reinterpret_cast<__nv_bfloat162*>(yr) = __floats2bfloat162_rn(v[0], v[1]);
          *reinterpret_cast<__nv_bfloat162*>(yr + 2) = __floats2bfloat162_rn(v[2], v[3]);
        } else {
          *yr = __float2bfloat16_rn(v[0]);
        }
      } else {
        float* yr = static_cast<float*>(y) + r * cols + c;
        if constexpr (V == 4)
          *reinterpret_cast<float4*>(yr) = *reinterpret_cast<const float4*>(v);
        else
          *yr = v[0];
      }
    }
  }
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
  if (d.conv_kernel == 4)
    gdn_conv_kernel<4><<<grid, kThreads, 0, stream>>>(seqs, C, d.conv_kernel, x, w, conv_state, state_bf16, out);
  else
    gdn_conv_kernel<0><<<grid, kThreads, 0, stream>>>(seqs, C, d.conv_kernel, x, w, conv_state, state_bf16, out);
  FP8KV_CU_LAUNCH();
}

GdnChunkPlan gdn_chunk_plan_at(const GdnDims& d, int split, size_t max_smem) {
  const int Dk = d.k_head_dim, Dv = d.v_head_dim;
  if (split <= 0 || Dk <= 0 || Dv <= 0 || Dk % 16 != 0 || Dk > kMmaMaxDk || Dv % split != 0 || (Dv / split) % 8 != 0 ||
      Dv / split > kMmaMaxDvs)
    return {};
  GdnChunkPlan p;
  for (const int ldt : {kChunk + 8, kChunk}) {
    const size_t bytes = prep_smem_bytes(Dk, ldt);
    if (bytes <= max_smem) {
      p.prep_ld_t = ldt;
      p.prep_smem = bytes;
      break;
    }
  }
  if (p.prep_ld_t == 0) return {};
  const size_t bytes = sizeof(float) * SeqLayout(Dk, Dv / split).floats;
  if (bytes > max_smem) return {};
  p.split = split;
  p.smem = bytes;
  // One CTA per SM (its launch bounds let it take more than half the registers).
  p.ctas_per_sm = 1;
  return p;
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
            " (Dk must be a multiple of 16 up to " + std::to_string(kMmaMaxDk) +
            ", Dv / split a multiple of 8 up to " + std::to_string(kMmaMaxDvs) + ", and its " +
            std::to_string(sizeof(float) * SeqLayout(d.k_head_dim, std::max(d.v_head_dim / opt.chunk_split, 8)).floats) +
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
  const ChunkArgs args{seqs, d, plan.split, plan.prep_ld_t, seq_begin, qkv, a, b, A_log, dt_bias,
                       ssm_state, out, sc};
  // Steps 1-3 of every chunk, then the sequences' walks through the state.
  if (plan.prep_smem > 48 * 1024) allow_smem(reinterpret_cast<const void*>(gdn_chunk_prep_kernel), plan.prep_smem);
  const dim3 pgrid(static_cast<unsigned>((seqs.num_tokens + kChunk - 1) / kChunk),
                   static_cast<unsigned>(d.num_v_heads));
  gdn_chunk_prep_kernel<<<pgrid, kChunkThreads, plan.prep_smem, stream>>>(args);
  FP8KV_CU_LAUNCH();
  const ChunkKernel kern = state_bf16 ? chunk_kernel<__nv_bfloat16>() : chunk_kernel<float>();
  if (plan.smem > 48 * 1024) allow_smem(reinterpret_cast<const void*>(kern), plan.smem);
  const dim3 cgrid(static_cast<unsigned>(d.num_v_heads * plan.split), static_cast<unsigned>(seqs.num_seqs - seq_begin));
  kern<<<cgrid, kChunkThreads, plan.smem, stream>>>(args);
  FP8KV_CU_LAUNCH();
}

void gdn_gated_rmsnorm(const float* x, const float* z, int64_t T, int Hv, int Dv, const float* w, float eps,
                       void* y, bool y_bf16, cudaStream_t stream) {
  const int64_t rows = T * Hv;
  if (rows <= 0) return;
  if (Dv <= 0) throw std::invalid_argument("cuda::gdn_gated_rmsnorm: Dv must be positive");
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int V = Dv % 4 == 0 && a16(x) && a16(z) && a16(w) && a16(y) ? 4 : 1;
  const int R = gated_norm_rows(Dv, V);
  const int64_t blocks = (rows + R - 1) / R;
  if (blocks > 0x7fffffff) throw std::invalid_argument("cuda::gdn_gated_rmsnorm: too many rows");
  const size_t smem = sizeof(float) * (static_cast<size_t>(R) * gated_norm_stride(Dv / V) * V + R);
  if (smem > 48 * 1024) throw std::invalid_argument("cuda::gdn_gated_rmsnorm: Dv " + std::to_string(Dv) + " is too large");
  auto go = [&](auto kernel) {
    kernel<<<static_cast<unsigned>(blocks), 128, smem, stream>>>(x, z, rows, Dv, R, w, eps, y);
  };
  if (V == 4)
    y_bf16 ? go(gdn_gated_rmsnorm_kernel<4, true>) : go(gdn_gated_rmsnorm_kernel<4, false>);
  else
    y_bf16 ? go(gdn_gated_rmsnorm_kernel<1, true>) : go(gdn_gated_rmsnorm_kernel<1, false>);
  FP8KV_CU_LAUNCH();
}

void split_q_gate(const float* qg, int64_t T, int Hq, int D, float* q, float* gate, cudaStream_t stream) {
  const int64_t n = T * Hq * D;
  if (n <= 0) return;
  split_q_gate_kernel<<<grid_1d(n, 256), 256, 0, stream>>>(qg, T * Hq, D, q, gate);
  FP8KV_CU_LAUNCH();
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n > INT_MAX) throw std::invalid_argument("cuda::mul_sigmoid: more than INT_MAX elements");
  mul_sigmoid_heads(x, 1, static_cast<int>(n), static_cast<int>(n), gate, n, 0, x, false, stream);
}

void mul_sigmoid_heads(const float* x, int64_t rows, int cols, int D, const float* gate, int64_t gate_row_stride,
                       int64_t gate_head_stride, void* y, bool y_bf16, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (!x || !gate || !y || D <= 0 || cols % D != 0)
    throw std::invalid_argument("cuda::mul_sigmoid_heads: bad arguments (cols " + std::to_string(cols) + ", D " +
                                std::to_string(D) + ")");
  const bool v4 = D % 4 == 0 && gate_row_stride % 4 == 0 && gate_head_stride % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(gate) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(y) % 16 == 0;
  const dim3 grid(std::min(grid_1d(v4 ? cols / 4 : cols, 256), 1024u),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  auto go = [&](auto kernel) {
    kernel<<<grid, 256, 0, stream>>>(x, rows, cols, gate, gate_row_stride, D, gate_head_stride, y);
  };
  if (v4)
    y_bf16 ? go(mul_sigmoid_kernel<4, true>) : go(mul_sigmoid_kernel<4, false>);
  else
    y_bf16 ? go(mul_sigmoid_kernel<1, true>) : go(mul_sigmoid_kernel<1, false>);
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
