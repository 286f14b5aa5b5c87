// Gated DeltaNet kernels (gdn.h): the conv, the recurrent rule and the norm
// one thread per output column in the CPU reference's operation order
// (backend/cpu/gdn.cpp); the chunked rule's products on the tensor cores in
// 3xTF32 (its comment).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
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
// are normalized once per token by the block (the l2 sums by one thread
// each, in the CPU's order), not by every thread. State: the pool's
// element type (float or bf16: widened on the read, rounded to nearest on
// the write).
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
  // q and k of the token, normalized in place (qh = q / |q| * scale, kh = k / |k|),
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
    // exact); the sums sequential (the CPU's), one thread each.
    if (threadIdx.x == 0 || threadIdx.x == 32) {
      const float* x = threadIdx.x ? ks : qs;
      float ss = 0.0f;
      for (int i = 0; i < Dk; ++i) ss = __fadd_rn(ss, __fmul_rn(x[i], x[i]));
      inv[threadIdx.x ? 1 : 0] = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, 1e-6f)));
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

// ---- 3xTF32 on the tensor cores ---------------------------------------------------
//
// The chunked rule's products run on the tensor cores in 3xTF32 (CUTLASS's
// "fast accurate" f32): an f32 x splits into hi = tf32(x) (cvt.rna: 11
// significant bits, |x - hi| <= 2^-11 |x|) and lo = tf32(x - hi) (x - hi is
// exact in f32), so x = hi + lo within 2^-22 |x|. A product a b is taken as
// lo_a hi_b + hi_a lo_b + hi_a hi_b, three m16n8k8 TF32 MMAs accumulating in
// f32 in that order (each tf32 product is exact in f32), within 12 x 2^-24
// |a b| of the exact product (lo_a lo_b, which it leaves out, and the two
// splits' remainders). tests/cuda_ops/test_gdn_cuda.cpp bounds the whole.

// The tf32 bit patterns of x's two parts.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  const float rest = __fsub_rn(x, __uint_as_float(hi));  // exact
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(rest));
}

// c += a b on one 16 x 8 x 8 tile (mma.sync m16n8k8, tf32 in, f32
// accumulators). The PTX ISA's fragments, g = lane / 4, t = lane % 4:
// a = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]; b = B[t][g], B[t+4][g];
// c = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- the chunked delta rule -------------------------------------------------------
//
// One CTA of kChunkThreads (8 warps) per (value head h, Dv slice, sequence):
// the slice is columns [c0, c0 + Dvs) of the head's state, Dvs = Dv / split.
// The CTA keeps its slice of S [Dk][Dvs] in shared memory for the whole
// sequence (one read and one write of the pool per step) and walks the
// sequence's chunks; per chunk, with n <= 64 rows (rows n..63 of every
// buffer zero):
//  1. q, k rows -> QT, KT [Dk][64] (transposed), the gates (one warp: g,
//     beta, cum = running sum of g, exp(cum), exp(last - cum)), the l2 norms
//     (one thread per row, the CPU's sequential sum), then q, k normalized,
//     W^T = (k beta) exp(cum), U = v beta [64][Dvs].
//  2. L = beta_i (k_i . k_j) exp(cum_i - cum_j) (j < i) -> LA [64][64].
//  3. Forward substitution of (I + L) X = B for every column of U and W, one
//     thread per column, the column in 64 registers (right-looking: when
//     x_j is final every x_i, i > j, takes its term, so each x_i takes its
//     terms in the CPU's order j = 0, 1, ... with 63 - j independent
//     multiply-adds per step instead of one dependent chain).
//  4. v_new = U - W S (into U); A = (q_i . k_j) exp(cum_i - cum_j) (j <= i)
//     -> LA (L is dead).
//  5. o = exp(cum_i) (q_i S) + sum_{j <= i} A_ij v_new_j -> out; KD [Dk][64]
//     = k_i exp(last - cum_i) over W^T (dead).
//  6. S = exp(last) S + sum_i KD_i v_new_i^T.
// The products of 2, 4, 5 and 6 are warp-level 3xTF32 MMAs (above) on tiles
// of 16 rows x 8 columns: L and A only the 20 tiles that reach the diagonal
// or below it, A v_new for row tile r only j < 16 (r + 1) (A_ij = 0 for
// j > i), the state update only over the chunk's rows (rounded up to 8).
// Every output element is one f32 accumulator that takes its reduction index
// in order, 8 per k-step, each k-step's three MMAs in the order above; which
// warp computes an element, and where in its tile, does not change that (a
// column keeps its place in its 8-column tile at every split, Dvs being a
// multiple of 8). So the results are bitwise independent of the split, and a
// prefill split at a multiple of 64 gives the one-shot prefill's bits (its
// chunks are the same).
// Layouts (floats). Element (k, x) of a k-major buffer, k the reduction index
// of its products, sits at k ld + (x ^ swz (k % 4)), so the 32 lanes of a
// fragment load (k = t or t + 4 above a multiple of 8, x = g above a multiple
// of 8) hit 32 different banks: ld a multiple of 32 with swz = 8 (an XOR
// swizzle of 8-float groups), or ld = 8 or 24 mod 32 with swz = 0 (padding).
// S [Dk][ldv] (k = a), QT, KT, WT [Dk][64] (k = a), U [64][ldv] (k = row),
// LA [64][64] (k = column j), then the per-row vectors; ldv = Dvs, swizzled,
// when Dvs is a multiple of 32, else Dvs padded to 8 or 24 mod 32 (chunk_ld_v).
// KD [Dk][64] (over WT) is the state update's m-major A operand: element
// (a, i) at a 64 + (i ^ 4 (a % 8)), conflict-free for its fragment loads
// (row a = g above a multiple of 8, column i = t or t + 4). For Dk = Dv = 128:
// 214,800 bytes at split 1, 165,648 at split 2, 141,072 at split 4, so one
// CTA per SM.

constexpr int kChunk = kGdnCudaChunk;
constexpr int kChunkThreads = 256;
constexpr int kChunkWarps = kChunkThreads / 32;
constexpr int kVecFloats = 7 * kChunk + 4;  // g, beta, cum, exp(cum), exp(last - cum), 1/|q|, 1/|k|; exp(last)

// The row stride of the [*][Dvs] buffers (S, U; Dvs a multiple of 8).
int chunk_ld_v(int Dvs) { return Dvs % 32 == 16 ? Dvs + 8 : Dvs; }

size_t chunk_smem_bytes(int Dk, int Dvs) {
  const size_t k = static_cast<size_t>(Dk), v = static_cast<size_t>(chunk_ld_v(Dvs)), c = kChunk;
  return sizeof(float) * (k * v + 3 * k * c + c * v + c * c + kVecFloats);
}

// The 20 tiles of 16 x 8 of a 64 x 64 matrix on or below the diagonal (row
// tile r: column tiles 0 .. 2r + 1) dealt to the 8 warps, one row tile each
// (its A fragments loaded once per k-step): warp w takes column tiles
// [first, first + count) of row tile `row`, nibble w of each constant.
// Row tile 3's 8 as 3 + 3 + 2, row tile 2's 6 as 3 + 3, 1's 4 as 2 + 2, 0's 2.
constexpr uint32_t kTriRow = 0x01122333u, kTriFirst = 0x02030630u, kTriCount = 0x22233233u;
constexpr int kTriMax = 3;  // the most column tiles of one warp

constexpr bool tri_deal_covers() {
  for (int r = 0; r < 4; ++r) {
    int covered[8] = {};
    for (int w = 0; w < kChunkWarps; ++w) {
      const int row = (kTriRow >> (4 * w)) & 15, first = (kTriFirst >> (4 * w)) & 15, n = (kTriCount >> (4 * w)) & 15;
      if (n > kTriMax) return false;
      if (row == r)
        for (int j = first; j < first + n; ++j) {
          if (j >= 2 * r + 2) return false;
          ++covered[j];
        }
    }
    for (int j = 0; j < 8; ++j)
      if (covered[j] != (j < 2 * r + 2 ? 1 : 0)) return false;
  }
  return true;
}
static_assert(tri_deal_covers(), "each lower tile of L and A exactly once");

struct ChunkArgs {
  GdnSeqs seqs;
  GdnDims dm;
  int split, ldv, seq_begin;
  const float* qkv;
  const float* a;
  const float* b;
  const float* A_log;
  const float* dt_bias;
  void* pool;  // [slots][Hv][Dk][Dv] of the kernel's State
  float* out;
};

// Offset of element (k, x) of a k-major buffer of row stride ld (the layouts above).
__device__ __forceinline__ int kmaj(int k, int x, int ld, int swz) { return k * ld + (x ^ (swz * (k & 3))); }

// The lane's offset of element (t, x0 + g) of a k-major buffer at `base`,
// x0 a multiple of 8; element (t + 8 s + 4 h, x0 + g) is (8 s + 4 h) ld
// further (the swizzle depends on k % 4 = t only).
__device__ __forceinline__ int frag_at(int base, int ld, int swz, int x0, int g, int t) {
  return base + t * ld + ((x0 ^ (swz * t)) + g);
}

// A fragments of rows [m0, m0 + 16) of a k-major buffer, k-step s.
struct FragKMajor {
  int o0, o8, ld;
  __device__ FragKMajor(int base, int ld_, int swz, int m0, int g, int t)
      : o0(frag_at(base, ld_, swz, m0, g, t)), o8(frag_at(base, ld_, swz, m0 + 8, g, t)), ld(ld_) {}
  __device__ void operator()(const float* sm, int s, float (&a)[4]) const {
    const int k = 8 * s * ld;
    a[0] = sm[o0 + k];
    a[1] = sm[o8 + k];
    a[2] = sm[o0 + k + 4 * ld];
    a[3] = sm[o8 + k + 4 * ld];
  }
};

// A fragments of rows [m0, m0 + 16) of KD (m-major [Dk][64], element (a, i)
// at a 64 + (i ^ 4 (a % 8))), k-step s: rows m0 + g and m0 + 8 + g (a % 8 =
// g), columns 8 s + t and 8 s + 4 + t at ((8 s) ^ 4 g) + t and
// ((8 s + 4) ^ 4 g) + t.
struct FragKD {
  int r0, r8, g4, t;
  __device__ FragKD(int base, int m0, int g, int t_)
      : r0(base + (m0 + g) * kChunk), r8(base + (m0 + 8 + g) * kChunk), g4(4 * g), t(t_) {}
  __device__ void operator()(const float* sm, int s, float (&a)[4]) const {
    const int c0 = ((8 * s) ^ g4) + t, c4 = ((8 * s + 4) ^ g4) + t;
    a[0] = sm[r0 + c0];
    a[1] = sm[r8 + c0];
    a[2] = sm[r0 + c4];
    a[3] = sm[r8 + c4];
  }
};

// acc[j] += A x B for one warp: A's rows [m0, m0 + 16) (the fragment loader
// `a`), B's columns [8 n, 8 n + 8) for n = n0 + j n_step, j < nts <= NT, B
// k-major at (b_base, b_ld, b_swz); k-steps [0, ksteps), 8 reduction indices
// each, in order. Every product in 3xTF32.
template <int NT, class FragA>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const float* sm, const FragA& a, int b_base, int b_ld,
                                         int b_swz, int n0, int n_step, int nts, int ksteps) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int bo[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) bo[j] = frag_at(b_base, b_ld, b_swz, 8 * (n0 + j * n_step), g, t);
#pragma unroll 2
  for (int s = 0; s < ksteps; ++s) {
    float av[4];
    a(sm, s, av);
    uint32_t ah[4], al[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) split_tf32(av[v], ah[v], al[v]);
    const int k0 = 8 * s * b_ld, k4 = k0 + 4 * b_ld;
#pragma unroll
    for (int j = 0; j < NT; ++j)
      if (j < nts) {
        uint32_t bh[2], bl[2];
        split_tf32(sm[bo[j] + k0], bh[0], bl[0]);
        split_tf32(sm[bo[j] + k4], bh[1], bl[1]);
        mma_tf32(acc[j], al, bh);
        mma_tf32(acc[j], ah, bl);
        mma_tf32(acc[j], ah, bh);
      }
  }
}

// x <- (I + L)^{-1} x for one column x[64] (registers), L strictly lower
// triangular in LA (L_ij at kmaj(j, i, 64, 8)). x_i takes -L_ij x_j for
// j = 0, 1, ..., i-1 in that order (the CPU's); rows from n on are zero and
// stay zero.
__device__ __forceinline__ void forward_subst(float (&x)[kChunk], const float* LA, int n) {
#pragma unroll
  for (int j = 0; j < kChunk - 1; ++j) {
    if (j + 1 < n) {
#pragma unroll
      for (int q = (j + 1) / 4; q < kChunk / 4; ++q) {
        const float4 l = *reinterpret_cast<const float4*>(LA + kmaj(j, 4 * q, kChunk, 8));
        if (4 * q + 0 > j) x[4 * q + 0] = fmaf(-l.x, x[j], x[4 * q + 0]);
        if (4 * q + 1 > j) x[4 * q + 1] = fmaf(-l.y, x[j], x[4 * q + 1]);
        if (4 * q + 2 > j) x[4 * q + 2] = fmaf(-l.z, x[j], x[4 * q + 2]);
        if (4 * q + 3 > j) x[4 * q + 3] = fmaf(-l.w, x[j], x[4 * q + 3]);
      }
    }
  }
}

// State: the pool's element type.
template <class State>
__global__ void __launch_bounds__(kChunkThreads, 1) gdn_rule_chunked_kernel(ChunkArgs p) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int split = p.split, ldv = p.ldv, swv = ldv % 32 == 0 ? 8 : 0;
  const int h = blockIdx.x / split, part = blockIdx.x % split, s = p.seq_begin + blockIdx.y;
  const int Hk = p.dm.num_k_heads, Hv = p.dm.num_v_heads, Dk = p.dm.k_head_dim, Dv = p.dm.v_head_dim;
  const int Dvs = Dv / split, cs = part * Dvs;  // this CTA's columns [cs, cs + Dvs)
  const int64_t KD = p.dm.key_dim(), VD = p.dm.value_dim(), C = p.dm.conv_dim();
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
  // Buffer offsets in floats (the layouts above).
  const int oS = 0, oQ = oS + Dk * ldv, oK = oQ + Dk * kChunk, oW = oK + Dk * kChunk, oU = oW + Dk * kChunk,
            oLA = oU + kChunk * ldv, oVec = oLA + kChunk * kChunk;
  float* Ssh = sm + oS;   // [Dk][ldv]
  float* QT = sm + oQ;    // [Dk][64]: q^T
  float* KT = sm + oK;    // [Dk][64]: k^T
  float* WT = sm + oW;    // [Dk][64]: W^T; from step 5 KD
  float* U = sm + oU;     // [64][ldv]
  float* LA = sm + oLA;   // [64][64]: L, from step 4 A
  float* gv = sm + oVec;  // [64] g
  float* bet = gv + kChunk;    // [64] beta
  float* cum = bet + kChunk;   // [64] running sum of g
  float* ev = cum + kChunk;    // [64] exp(cum)
  float* dl = ev + kChunk;     // [64] exp(last - cum), 0 past the chunk
  float* invq = dl + kChunk;   // [64]
  float* invk = invq + kChunk; // [64]
  float* misc = invk + kChunk; // [0] exp(last)

  const int pos0 = p.seqs.context_lens[s] - n;
  const bool fresh = pos0 == 0;
  State* S = static_cast<State*>(p.pool) + (static_cast<int64_t>(slot) * Hv + h) * Dk * Dv + cs;
  for (int e = tid; e < Dk * Dvs; e += kChunkThreads) {
    const int a = e / Dvs, d = e % Dvs;
    Ssh[kmaj(a, d, ldv, swv)] = fresh ? 0.0f : state_f32(S[static_cast<int64_t>(a) * Dv + d]);
  }
  const int kh = h / (Hv / Hk);
  const float scale = __fdiv_rn(1.0f, sqrtf(static_cast<float>(Dk)));
  const float neg_A = -expf(p.A_log[h]), dtb = p.dt_bias[h];
  const float* __restrict__ qkv = p.qkv;
  const int wba = (Dk + 31) / 32, nwb = wba * 4;  // warp blocks of 32 (Dk) x 16 (rows) per matrix
  // The warps' tiles. 64 x Dvs products (4, 5): row tile vr, the column
  // tiles vp, vp + 2, ... (vn of them). The Dk x Dvs state update (6): units
  // (row tile, column tiles p0, p0 + P, ...) over Dk / 16 row tiles, P
  // interleaved sets of column tiles so that the 8 warps have work.
  const int ntv = Dvs / 8, vr = warp % 4, vp = warp / 4, vn = (ntv - vp + 1) / 2;
  const int srows = Dk / 16, sP = srows >= kChunkWarps ? 1 : min(ntv, kChunkWarps / srows);
  // L and A: the warp's tiles of the triangle (kTri*).
  const int tr = (kTriRow >> (4 * warp)) & 15, tf = (kTriFirst >> (4 * warp)) & 15, tn = (kTriCount >> (4 * warp)) & 15;
  // L (beta_i (k_i . k_j) exp(cum_i - cum_j), j < i; the CPU: b[i] * dot *
  // exp(cum[i] - cum[j])) or A ((q_i . k_j) exp(cum_i - cum_j), j <= i) into LA.
  auto triangle = [&](bool isA) {
    float acc[kTriMax][4] = {};
    warp_mma<kTriMax>(acc, sm, FragKMajor(isA ? oQ : oK, kChunk, 8, 16 * tr, g, t), oK, kChunk, 8, tf, 1, tn, Dk / 8);
#pragma unroll
    for (int j = 0; j < kTriMax; ++j)
      if (j < tn) {
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int i = 16 * tr + g + 8 * (v / 2), c = 8 * (tf + j) + 2 * t + v % 2;
          float x = 0.0f;
          if (isA ? c <= i : c < i) {
            const float e = expf(__fsub_rn(cum[i], cum[c]));
            x = isA ? __fmul_rn(acc[j][v], e) : __fmul_rn(__fmul_rn(bet[i], acc[j][v]), e);
          }
          LA[kmaj(c, i, kChunk, 8)] = x;
        }
      }
  };

  for (int t0 = 0; t0 < n;) {
    // Chunks end at absolute multiples of 64 (the CPU's rule).
    const int nc = min(n - t0, kChunk - (pos0 + t0) % kChunk);
    const int64_t row0 = r0 + t0;
    __syncthreads();  // the previous chunk's buffers are read (and S is loaded)

    // 1a. The gates (the last warp), then q and k rows transposed into QT,
    // KT by 4x4 register blocks (lanes: 8 column blocks x 4 row blocks).
    if (warp == kChunkWarps - 1) {
      for (int i = lane; i < kChunk; i += 32) {
        float gi = 0.0f, bt = 0.0f;
        if (i < nc) {
          const int64_t r = row0 + i;
          const float xg = __fadd_rn(p.a[r * Hv + h], dtb);
          const float sp = xg > 20.0f ? xg : log1pf(expf(xg));  // torch's softplus
          gi = __fmul_rn(neg_A, sp);
          bt = sigmoid_f(p.b[r * Hv + h]);
        }
        gv[i] = gi;
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
      float* T = m ? KT : QT;
#pragma unroll
      for (int c = 0; c < 4; ++c)  // row a0 + c: (a0 + c) % 4 = c
        *reinterpret_cast<float4*>(T + kmaj(a0 + c, i0, kChunk, 8)) = make_float4(v[0][c], v[1][c], v[2][c], v[3][c]);
    }
    __syncthreads();

    // 1b. 1 / sqrt(sum x^2 + 1e-6) per q and k row: the CPU's sequential sum.
    if (tid < 2 * kChunk) {
      const float* T = tid < kChunk ? QT : KT;
      const int i = tid % kChunk;
      float ss = 0.0f;
      for (int a = 0; a < Dk; a += 4) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float x = T[kmaj(a + c, i, kChunk, 8)];
          ss = __fadd_rn(ss, __fmul_rn(x, x));
        }
      }
      (tid < kChunk ? invq : invk)[i] = __fdiv_rn(1.0f, sqrtf(__fadd_rn(ss, 1e-6f)));
    }
    __syncthreads();

    // 1c. q (x inv) scale, k x inv (the CPU's * 1.0f is exact), W^T = (k
    // beta) exp(cum), U = v beta.
    {
      const int i = tid % kChunk;
      const float iq = invq[i], ik = invk[i], bi = bet[i], ei = ev[i];
      for (int a = tid / kChunk; a < Dk; a += kChunkThreads / kChunk) {
        const int x = kmaj(a, i, kChunk, 8);
        const float kn = __fmul_rn(KT[x], ik);
        QT[x] = __fmul_rn(__fmul_rn(QT[x], iq), scale);
        KT[x] = kn;
        WT[x] = __fmul_rn(__fmul_rn(kn, bi), ei);
      }
      const float* vsrc = qkv + 2 * KD + ocol;
      for (int e = tid; e < kChunk * Dvs; e += kChunkThreads) {
        const int r = e / Dvs, d = e % Dvs;
        U[kmaj(r, d, ldv, swv)] = r < nc ? __fmul_rn(vsrc[(row0 + r) * C + d], bet[r]) : 0.0f;
      }
    }
    __syncthreads();

    // 2. L.
    triangle(false);
    __syncthreads();

    // 3. U <- (I + L)^{-1} U, W <- (I + L)^{-1} W, one column per thread.
    for (int c = tid; c < Dvs + Dk; c += kChunkThreads) {
      float x[kChunk];
      if (c < Dvs) {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) x[i] = U[kmaj(i, c, ldv, swv)];
        forward_subst(x, LA, nc);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) U[kmaj(i, c, ldv, swv)] = x[i];
      } else {
        // Row a of W^T: its float4 q at a 64 + (4 q ^ 8 (a % 4)).
        const int a = c - Dvs, sw = 8 * (a & 3);
        float* wrow = WT + a * kChunk;
#pragma unroll
        for (int q = 0; q < kChunk / 4; ++q) {
          const float4 v = *reinterpret_cast<const float4*>(wrow + ((4 * q) ^ sw));
          x[4 * q] = v.x;
          x[4 * q + 1] = v.y;
          x[4 * q + 2] = v.z;
          x[4 * q + 3] = v.w;
        }
        forward_subst(x, LA, nc);
#pragma unroll
        for (int q = 0; q < kChunk / 4; ++q)
          *reinterpret_cast<float4*>(wrow + ((4 * q) ^ sw)) =
              make_float4(x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
      }
    }
    __syncthreads();

    // 4. v_new = U - W S (the CPU: ws = sum_a W_ia S_ad, then U -= ws); then A
    // over L (read in step 3).
    if (16 * vr < nc)
      for (int j0 = 0; j0 < vn; j0 += 8) {
        const int nts = min(8, vn - j0);
        float acc[8][4] = {};
        warp_mma<8>(acc, sm, FragKMajor(oW, kChunk, 8, 16 * vr, g, t), oS, ldv, swv, vp + 2 * j0, 2, nts, Dk / 8);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < nts) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int i = 16 * vr + g + 8 * hh, c = 8 * (vp + 2 * (j0 + j)) + 2 * t;
              float2* u = reinterpret_cast<float2*>(U + kmaj(i, c, ldv, swv));  // i % 4 = g % 4: c, c + 1 adjacent
              float2 x = *u;
              x.x = __fsub_rn(x.x, acc[j][2 * hh]);
              x.y = __fsub_rn(x.y, acc[j][2 * hh + 1]);
              *u = x;
            }
          }
      }
    triangle(true);
    __syncthreads();

    // 5. The outputs: o_i = (q_i S) exp(cum_i), then + A_ij v_new_j for j =
    // 0..i in order (row tile vr: j < 16 (vr + 1); A_ij = 0 for j > i). Then
    // KD = k_i exp(last - cum_i) over W^T (the CPU: ka = k[i][a] * di).
    if (16 * vr < nc) {
      const int ks_a = min(2 * vr + 2, (nc + 7) / 8);
      for (int j0 = 0; j0 < vn; j0 += 8) {
        const int nts = min(8, vn - j0);
        float acc[8][4] = {};
        warp_mma<8>(acc, sm, FragKMajor(oQ, kChunk, 8, 16 * vr, g, t), oS, ldv, swv, vp + 2 * j0, 2, nts, Dk / 8);
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) acc[j][v] = __fmul_rn(acc[j][v], ev[16 * vr + g + 8 * (v / 2)]);
        warp_mma<8>(acc, sm, FragKMajor(oLA, kChunk, 8, 16 * vr, g, t), oU, ldv, swv, vp + 2 * j0, 2, nts, ks_a);
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < nts) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int i = 16 * vr + g + 8 * hh, c = 8 * (vp + 2 * (j0 + j)) + 2 * t;
              if (i < nc) {
                float* o = out + (row0 + i) * VD + ocol + c;
                o[0] = acc[j][2 * hh];
                o[1] = acc[j][2 * hh + 1];
              }
            }
          }
      }
    }
    for (int e = tid; e < Dk * kChunk; e += kChunkThreads) {
      const int a = e / kChunk, i = e % kChunk;
      WT[a * kChunk + (i ^ (4 * (a & 7)))] = __fmul_rn(KT[kmaj(a, i, kChunk, 8)], dl[i]);
    }
    __syncthreads();

    // 6. S = exp(last) S, then += KD_i v_new_i^T for i = 0..n-1 in order.
    {
      const float el = misc[0];
      for (int u = warp; u < srows * sP; u += kChunkWarps) {
        const int sr = u / sP, sc = u % sP, sn = (ntv - sc + sP - 1) / sP;
        for (int j0 = 0; j0 < sn; j0 += 8) {
          const int nts = min(8, sn - j0);
          float acc[8][4];
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              float2 x = make_float2(0.0f, 0.0f);
              if (j < nts) {
                const int a = 16 * sr + g + 8 * hh, c = 8 * (sc + sP * (j0 + j)) + 2 * t;
                x = *reinterpret_cast<const float2*>(Ssh + kmaj(a, c, ldv, swv));  // a % 4 = g % 4
              }
              acc[j][2 * hh] = __fmul_rn(x.x, el);
              acc[j][2 * hh + 1] = __fmul_rn(x.y, el);
            }
          warp_mma<8>(acc, sm, FragKD(oW, 16 * sr, g, t), oU, ldv, swv, sc + sP * j0, sP, nts, (nc + 7) / 8);
#pragma unroll
          for (int j = 0; j < 8; ++j)
            if (j < nts) {
#pragma unroll
              for (int hh = 0; hh < 2; ++hh) {
                const int a = 16 * sr + g + 8 * hh, c = 8 * (sc + sP * (j0 + j)) + 2 * t;
                *reinterpret_cast<float2*>(Ssh + kmaj(a, c, ldv, swv)) =
                    make_float2(acc[j][2 * hh], acc[j][2 * hh + 1]);
              }
            }
        }
      }
    }
    t0 += nc;
  }
  __syncthreads();
  for (int e = tid; e < Dk * Dvs; e += kChunkThreads) {
    const int a = e / Dvs, d = e % Dvs;
    S[static_cast<int64_t>(a) * Dv + d] = state_from_f32<State>(Ssh[kmaj(a, d, ldv, swv)]);
  }
}

using ChunkKernel = void (*)(ChunkArgs);

// The plan's estimate of one CTA's time per chunk, in f32 multiply-add
// slots of a CUDA core: the forward substitution of the Dk + Dvs columns
// (every CTA repeats W's) on the CUDA cores, plus the 3xTF32 products at
// three tensor-core multiply-adds each, a quarter slot apiece (an SM: 128
// f32 FMAs per clock; mma.sync tf32 taken at ~512 multiply-adds per clock,
// half the H100's dense peak): L and A (20 tiles of 16 x 8 each, Dk deep),
// W S and Q S (64 x Dvs, Dk deep), A v_new (row tile r: 16 (r + 1) deep) and
// the state update (Dk x Dvs, 64 deep).
double chunk_cost(const GdnDims& d, int split) {
  const double Dk = d.k_head_dim, Dvs = static_cast<double>(d.v_head_dim) / split, c = kChunk;
  const double fwd = (Dk + Dvs) * c * (c - 1) / 2;
  const double mma = 2 * 20 * 16 * 8 * Dk + 2 * c * Dvs * Dk + 16 * Dvs * 16 * (1 + 2 + 3 + 4) + Dk * Dvs * c;
  return fwd + 3 * mma / 4;
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
  // The state column in registers for the key head dims of real checkpoints
  // and the tests (16 .. 128), else in shared memory (any Dk whose state fits).
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
  // Dk: the state update's 16-row tiles (and the 8-deep k-steps over Dk);
  // Dv / split: 8-column tiles.
  if (split <= 0 || Dk <= 0 || Dv <= 0 || Dk % 16 != 0 || Dv % split != 0 || (Dv / split) % 8 != 0) return {};
  const size_t bytes = chunk_smem_bytes(Dk, Dv / split);
  if (bytes > max_smem) return {};
  return GdnChunkPlan{split, chunk_ld_v(Dv / split), bytes};
}

GdnChunkPlan gdn_chunk_plan(const GdnDims& d, int multi_seqs, int num_sms, size_t max_smem) {
  GdnChunkPlan best;
  double best_t = 0.0;
  const double ctas = static_cast<double>(std::max(multi_seqs, 1)) * std::max(d.num_v_heads, 1);
  for (const int split : {1, 2, 4, 8}) {
    if (split > 1 && d.v_head_dim / split < 32) break;
    const GdnChunkPlan p = gdn_chunk_plan_at(d, split, max_smem);
    if (!p.ok()) continue;
    const double t = std::ceil(ctas * split / std::max(num_sms, 1)) * chunk_cost(d, split);
    if (!best.ok() || t < best_t) {
      best = p;
      best_t = t;
    }
  }
  return best;
}

void gdn_rule(const GdnDims& d, const GdnSeqs& seqs, const float* qkv, const float* a, const float* b,
              const float* A_log, const float* dt_bias, void* ssm_state, bool state_bf16, float* out,
              cudaStream_t stream, const GdnRuleOptions& opt) {
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
  // The chunked kernel takes the sequences of two or more rows from
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
            " (Dk must be a multiple of 16 and Dv / split of 8, and its " +
            std::to_string(chunk_smem_bytes(d.k_head_dim, std::max(d.v_head_dim / opt.chunk_split, 1))) +
            " bytes of buffers must fit in the " + std::to_string(max_smem) + " bytes of shared memory of one block)");
    } else {
      plan = gdn_chunk_plan(d, seqs.num_seqs - seq_begin, num_sms, static_cast<size_t>(max_smem));
    }
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
  if (!plan.ok()) return;
  const ChunkKernel kern = state_bf16 ? gdn_rule_chunked_kernel<__nv_bfloat16> : gdn_rule_chunked_kernel<float>;
  if (plan.smem > 48 * 1024) allow_smem(reinterpret_cast<const void*>(kern), plan.smem);
  const ChunkArgs args{seqs, d, plan.split, plan.ld_v, seq_begin, qkv, a, b, A_log, dt_bias, ssm_state, out};
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
