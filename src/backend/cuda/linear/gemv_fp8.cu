// Linear layers on fp8 (e4m3) weights, W8A16 (ops.h "fp8 weights"): the
// decode GEMV on the tensor cores, with each 128-column group's scale
// applied in registers, and the row-slice dequantization to bf16 that the
// cuBLASLt path past the GEMV rows reads. docs/cuda_backend.md "FP8 weights".
//
// The GEMV (gemv_fp8_kernel). At decode rows it is a weight stream, and the
// instructions spent per weight byte limit it once a GPU has bandwidth per
// SM to spare (the SIMT kernel this replaces spent ~87 SASS instructions
// per lane and 16 bytes at T = 1: e4m3 -> f16 -> f32 converts, bf16 x
// unpacks, one fmaf per product and row). Here one mma.sync.m16n8k16 (bf16
// in, fp32 accumulate, as gemv.cu's gemv_mma_kernel) does 16 x 8 x 16
// multiply-adds, and a lane spends ~67 instructions per 32 bytes at T = 1
// (70 at T = 8), 48 of them converting e4m3 to bf16:
//
// - Tile: 16 output rows n0..n0 + 15 (A = W, M = 16) against the T <= 8 rows
//   of x (B, N = 8: column t of B and of C is row t of x and of y). Lane
//   (g = lane / 4, q = lane % 4) loads 16 bytes of W row n0 + g and 16 bytes
//   of row n0 + g + 8 at k = kc + 16 q .. 16 q + 15: one warp step covers 64
//   k with two 16-byte loads per lane, straight from global memory (__ldcs:
//   streamed once).
// - The dot product does not care which k a fragment slot stands for as long
//   as A and B agree, so mma k16 step s = 0..3 of a warp step maps its k
//   slots (2q, 2q+1, 2q+8, 2q+9) to real k = 16q + 4s .. 16q + 4s + 3: the A
//   fragment of step s is byte word s of each row's 16 bytes, and the B
//   fragment is the 4 bf16 of x row g at the same k, two 32-bit words that
//   need no conversion (two 16-byte x loads per lane and 64-k step). Lanes
//   g >= T read x row T - 1: C columns past T are never stored, and a C
//   element depends on its own B column only.
// - e4m3 -> bf16 without a convert instruction (e4m3_bf16.h): one PRMT, one
//   shift and one AND per pair of weights; the bf16 holds e4m3 * 2^-120
//   exactly, subnormals included.
// - Scales: a 128-column scale group is two warp steps, done by one warp
//   into a fresh accumulator (8 mma), then acc = fmaf(part * 2^120, scale,
//   acc) per row (rows g and g + 8 take their own scales: per-channel ones
//   differ, block / tensor ones are the same value). part * 2^120 is exact:
//   a power of two times an fp32, subnormal or not, giving the group's sum
//   sum_k x_k e4m3_k (to within the accumulation error), which overflows
//   only where that sum exceeds fp32's range; the fmaf rounds once. Folding
//   2^120 into the scale instead would overflow for scales >= 2^8 (the
//   loader checks scales finite and > 0, nothing more), for no saving at
//   T = 1 (two multiplies per group either way).
// - Split K: S warps per tile (gemv_fp8_split), warp sub taking the groups
//   sub, sub + S, ...; the S partial sums are added in fixed warp order
//   through shared memory: deterministic. The next group's weights are in
//   flight while the current group is used (two register buffers, 2 KB per
//   warp), the first ones issued before the PDL wait (gemv_common.cuh); the
//   scales and x (L1 / L2 resident) are loaded where a group starts.
// - Edges: rows past N read a row inside the matrix and are not stored; K a
//   multiple of 16, not necessarily of 128: the whole groups run unpredicated
//   and the partial last group, after them, reads zeros past K for W and x.
//
// Numerics. Every product of a bf16 x and an e4m3 * 2^-120 is exact; the
// tensor core adds each k16 step's 16 products and the accumulator in a
// fused sum aligned to the largest addend's exponent (truncated below it,
// the result rounded toward zero to fp32: tests/cuda_ops/test_fp8_linear.cpp
// derives the bound), not in the SIMT kernel's order. The 2^-120 offset puts
// the biased products of |x * e4m3| < 2^-6 below fp32's normal range; the
// tensor core keeps them on an absolute grid of 2^-151 (2^-31 unbiased, in
// units of x times the e4m3 value) with gradual underflow, not flushed: an
// error floor below 2^-23 per 128-column group (times its scale), far below
// fp32 rounding for any group whose sum |x * e4m3| is not tiny. NaN weight
// bytes (S.1111.111) would become the finite +-480 here, where the dequantize
// and W8A8 paths propagate NaN: the upload refuses a checkpoint holding them
// (cuda_weights.cpp, ModelWeights::first_nan_fp8; docs/design.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/linear/e4m3_bf16.h"
#include "backend/cuda/linear/gemv_common.cuh"
#include "backend/cuda/ops/act.cuh"
#include "backend/cuda/ops/launch.cuh"
#include "backend/cuda/ops/ops.h"

namespace fp8kv::cuda {

namespace {

using namespace gemv;  // kWarps, wait_for_inputs, mma_bf16_16816, for_rows, for_split (gemv_common.cuh)
constexpr int kChunk = 16;          // e4m3 weights per 16-byte load
constexpr int kTile = 16;           // output rows per warp tile (the mma's M)
constexpr int kGroupK = 128;        // columns per scale group: two 64-k warp steps
// gemv_fp8_split: S grows (1, 2, 4, 8) while tiles x S < this many warps
// (1.3 fills of 24 warps on 132 SMs; a starting point, not measured) and
// each warp keeps at least 2 groups (one in flight while one is used).
constexpr int64_t kSplitTargetWarps = 4096;
// Blocks per SM the kernels are compiled for (__launch_bounds__): 3, i.e.
// <= 80 registers (no spills at any T) and 24 warps per SM, each with one
// 128-column group (2 KB) of weight loads in flight.
constexpr int kMinBlocks = 3;

// Four e4m3 bytes (little-endian in w) -> four floats (exact: every e4m3
// value is an f16 value, and every f16 value an f32 value).
__device__ __forceinline__ void e4m3x4_to_f32(uint32_t w, float* f) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

struct ScaleIndex {
  const float* __restrict__ s;
  int shift;
  int64_t ld;
  int k_step;
  // Row n's scales: its 128-column group G at row(n)[G * k_step].
  __device__ __forceinline__ const float* row(int64_t n) const { return s + (n >> shift) * ld; }
  // The scale of chunk c (16 columns, inside one 128-column group) of row n.
  __device__ __forceinline__ float at(int64_t n, int64_t c) const {
    return __ldg(s + (n >> shift) * ld + (c >> 3) * k_step);
  }
};

// One 128-column group as a lane holds it: 16 e4m3 bytes of rows g and
// g + 8 per 64-k step.
struct GroupRegs {
  uint4 w[2][2];  // [step][row g, row g + 8]
};

// part += the 8 mma of one group: b the weights, xv the lane's x pieces
// ([step][first, second 16 bytes]).
__device__ __forceinline__ void group_mma(const GroupRegs& b, const uint4 (&xv)[2][2], float (&part)[4]) {
#pragma unroll
  for (int st = 0; st < 2; ++st) {
    const uint32_t xw[8] = {xv[st][0].x, xv[st][0].y, xv[st][0].z, xv[st][0].w,
                            xv[st][1].x, xv[st][1].y, xv[st][1].z, xv[st][1].w};
    const uint4 ra = b.w[st][0], rb = b.w[st][1];
    const uint32_t wa[4] = {ra.x, ra.y, ra.z, ra.w}, wb[4] = {rb.x, rb.y, rb.z, rb.w};
#pragma unroll
    for (int s = 0; s < 4; ++s)
      mma_bf16_16816(part, e4m3::to_bf16x2_biased<0>(wa[s]), e4m3::to_bf16x2_biased<0>(wb[s]),
                     e4m3::to_bf16x2_biased<1>(wa[s]), e4m3::to_bf16x2_biased<1>(wb[s]), xw[2 * s], xw[2 * s + 1]);
  }
}

// acc += one group's sums times its scales (rows g: s0, g + 8: s1).
template <int T>
__device__ __forceinline__ void add_group(const float (&part)[4], float s0, float s1, float (&acc)[4]) {
  // part * 2^120: exact (file comment); one rounding per row and group.
  constexpr float kUnbias = 0x1p120f;
  static_assert(e4m3::kBiasExp == 120, "kUnbias must undo the conversion's 2^-120");
  acc[0] = fmaf(part[0] * kUnbias, s0, acc[0]);
  acc[2] = fmaf(part[2] * kUnbias, s1, acc[2]);
  if constexpr (T > 1) {  // columns 2q + 1: x rows 1, 3, 5, 7
    acc[1] = fmaf(part[1] * kUnbias, s0, acc[1]);
    acc[3] = fmaf(part[3] * kUnbias, s1, acc[3]);
  }
}

// One warp's part of a 16-row tile: W rows r0 = n0 + g and r1 = n0 + g + 8
// (rows to read: a caller points a row past the matrix at a row inside it
// and does not store its sums), this warp taking the 128-column groups sub,
// sub + S, ... (none when !live). acc: the lane's C fragment, (row r0, x row
// 2q), (r0, 2q + 1), (r1, 2q), (r1, 2q + 1), summed over its groups (the
// caller adds the S warps). B column g reads x row min(g, T - 1): columns
// past T are never stored, and a C element depends on its own column only.
// Waits for the inputs (PDL) after the first weight loads.
template <int T, int S>
__device__ __forceinline__ void fp8_tile_dot(const uint16_t* __restrict__ x, const uint8_t* __restrict__ W,
                                             const ScaleIndex& sc, int64_t r0, int64_t r1, int64_t K, bool live,
                                             int sub, int lane, float (&acc)[4]) {
  const int g = lane >> 2, q = lane & 3;
  const int pieces = static_cast<int>(K / kChunk);  // 16-byte pieces per row (gemv_fp8_fits: < 2^30)
  constexpr int kPer = kGroupK / kChunk;             // pieces per group
  const int full = live ? pieces / kPer : 0;          // whole groups; a partial last one: the tail below
  // Pointers at group G (from G = sub), the lane's piece q folded in: W
  // pieces G * 8 + {0, 4} + q of rows r0 / r1, x pieces the same (two
  // 16-byte halves each), the rows' scales of group G.
  const uint4* pw0 = reinterpret_cast<const uint4*>(W + r0 * K) + q + kPer * sub;
  const uint4* pw1 = reinterpret_cast<const uint4*>(W + r1 * K) + q + kPer * sub;
  const uint4* px =
      reinterpret_cast<const uint4*>(x + static_cast<int64_t>(g < T ? g : T - 1) * K) + 2 * q + 2 * kPer * sub;
  const float* ps0 = sc.row(r0) + sub * sc.k_step;
  const float* ps1 = sc.row(r1) + sub * sc.k_step;
  const int sstep = S * sc.k_step;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = 0.0f;

  // Group G + ahead S's weights (streamed once: __ldcs).
  auto load = [&](GroupRegs& b, int ahead) {
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      b.w[st][0] = __ldcs(pw0 + ahead * kPer * S + 4 * st);
      b.w[st][1] = __ldcs(pw1 + ahead * kPer * S + 4 * st);
    }
  };
  // Group G's sums into acc, then the pointers to group G + S.
  auto compute = [&](const GroupRegs& b) {
    const float s0 = __ldg(ps0), s1 = __ldg(ps1);
    const uint4 xv[2][2] = {{__ldg(px), __ldg(px + 1)}, {__ldg(px + 2 * 4), __ldg(px + 2 * 4 + 1)}};
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    group_mma(b, xv, part);
    add_group<T>(part, s0, s1, acc);
    pw0 += kPer * S;
    pw1 += kPer * S;
    px += 2 * kPer * S;
    ps0 += sstep;
    ps1 += sstep;
  };

  // Double-buffered: the next group's loads are issued before the current
  // group is used, the two buffers alternating (no register copies).
  GroupRegs bufa, bufb;
  int G = sub;
  if (G < full) load(bufa, 0);
  wait_for_inputs();
  while (G < full) {
    const bool more = G + S < full;
    if (more) load(bufb, 1);
    compute(bufa);
    G += S;
    if (!more) break;
    const bool more2 = G + S < full;
    if (more2) load(bufa, 1);
    compute(bufb);
    G += S;
    if (!more2) break;
  }
  // The partial last group (K % 128 != 0), if it is this warp's: pieces
  // past K read as zeros, for W and x alike.
  if (live && G == full && pieces % kPer != 0) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    GroupRegs b;
    uint4 xv[2][2];
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      const bool in = full * kPer + 4 * st + q < pieces;
      b.w[st][0] = in ? __ldcs(pw0 + 4 * st) : zero;
      b.w[st][1] = in ? __ldcs(pw1 + 4 * st) : zero;
      xv[st][0] = in ? __ldg(px + 2 * 4 * st) : zero;
      xv[st][1] = in ? __ldg(px + 2 * 4 * st + 1) : zero;
    }
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    group_mma(b, xv, part);
    add_group<T>(part, __ldg(ps0), __ldg(ps1), acc);
  }
}

// The block's per-lane partial sums: [warp][C fragment element][lane].
using Partials = float[kWarps][4][32];

__device__ __forceinline__ void publish(Partials& red, const float (&acc)[4], int warp, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
}

// Element i of this lane's C fragment summed over the S warps base, base +
// 1, ... of a tile, in that order.
template <int S>
__device__ __forceinline__ float tile_sum(const Partials& red, int base, int lane, int i) {
  float v = red[base][i][lane];
#pragma unroll
  for (int s = 1; s < S; ++s) v += red[base + s][i][lane];
  return v;
}

// S warps per 16-row tile, kWarps / S tiles per block.
template <int T, int S>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    gemv_fp8_kernel(const uint16_t* __restrict__ x, const uint8_t* __restrict__ W, ScaleIndex sc,
                    const float* __restrict__ bias, float* __restrict__ y, int64_t N, int64_t K, bool accumulate) {
  static_assert(kWarps % S == 0, "S must divide the warps of a block");
  constexpr int kTiles = kWarps / S;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp % S, q = lane & 3;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kTiles + warp / S) * kTile;
  const int64_t r0 = n0 + (lane >> 2), r1 = r0 + 8;
  const bool live = n0 < N;
  float acc[4];
  fp8_tile_dot<T, S>(x, W, sc, r0 < N ? r0 : N - 1, r1 < N ? r1 : N - 1, K, live, sub, lane, acc);
  if constexpr (S > 1) {
    __shared__ Partials red;
    publish(red, acc, warp, lane);
    __syncthreads();
    if (sub != 0) return;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = tile_sum<S>(red, warp, lane, i);
  }
  if (!live) return;
  // y[t][n] = sum (+ bias[n]) (+ y[t][n]): t = 2q + (i & 1), n = r0 / r1.
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = 2 * q + (i & 1);
    const int64_t n = i < 2 ? r0 : r1;
    if (t < T && n < N) {
      float v = acc[i] + (bias ? bias[n] : 0.0f);
      if (accumulate) v += y[t * N + n];
      y[t * N + n] = v;
    }
  }
}

// The gate|up GEMV with the gated activation fused: W = [gate; up] ([2I][K]).
// A block's warps form kWarps / (2S) pairs of tiles: gate rows j0..j0 + 15
// (S warps) and up rows I + j0.. (the next S warps), each tile summed as
// gemv_fp8_kernel<T, S> sums it (the same fp8_tile_dot, tile_sum and bias
// add), and the pair's first warp writes out[t][j] = bf16(act(gate + b) *
// (up + b)) with the activation kernel's element math: bitwise gemv_fp8 +
// gated_act when gemv_fp8 takes the same S (gemv_fp8_gated_act_fits). An up
// row sits at another position of its 16-row tile than in gemv_fp8 when I %
// 16 != 0; the mma computes each C element from its own A row and B column
// only, so the position does not change its value.
template <int T, int S, Activation A>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    gemv_fp8_gated_act_kernel(const uint16_t* __restrict__ x, const uint8_t* __restrict__ W, ScaleIndex sc,
                              const float* __restrict__ bias, __nv_bfloat16* __restrict__ out, int64_t I, int64_t K) {
  static_assert(kWarps % (2 * S) == 0, "a block holds whole gate / up tile pairs");
  constexpr int kPairs = kWarps / (2 * S);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp % S, up = (warp / S) % 2, q = lane & 3;
  const int64_t j0 = (static_cast<int64_t>(blockIdx.x) * kPairs + warp / (2 * S)) * kTile;
  const int64_t j = j0 + (lane >> 2);  // this lane's rows j and j + 8 of gate (and of up)
  const bool live = j0 < I;
  const int64_t base = up ? I : 0;
  float acc[4];
  fp8_tile_dot<T, S>(x, W, sc, base + (j < I ? j : I - 1), base + (j + 8 < I ? j + 8 : I - 1), K, live, sub, lane,
                     acc);
  __shared__ Partials red;
  publish(red, acc, warp, lane);
  __syncthreads();
  if (up || sub != 0 || !live) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = 2 * q + (i & 1);
    const int64_t jj = i < 2 ? j : j + 8;
    if (t < T && jj < I) {
      const float gs = tile_sum<S>(red, warp, lane, i) + (bias ? bias[jj] : 0.0f);
      const float us = tile_sum<S>(red, warp + S, lane, i) + (bias ? bias[I + jj] : 0.0f);
      out[t * I + jj] = __float2bfloat16_rn(gated_act_value<A>(gs, us));
    }
  }
}

ScaleIndex scale_index(const DeviceMatrix& W) {
  return ScaleIndex{W.scale, W.scale_row_shift, W.scale_ld, W.scale_k_step};
}

template <int T, int S>
void launch(const uint16_t* x, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
            cudaStream_t stream) {
  constexpr int kTiles = kWarps / S;
  const int64_t tiles = (W.rows + kTile - 1) / kTile;
  const int64_t blocks = (tiles + kTiles - 1) / kTiles;
  launch_pdl(true, gemv_fp8_kernel<T, S>, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), stream, x, W.fp8,
             scale_index(W), bias, y, W.rows, W.cols, accumulate);
}

// Thread i converts 16 consecutive elements of the slice (K % 16 == 0).
__global__ void dequant_kernel(const uint8_t* __restrict__ W, ScaleIndex sc, int64_t K, int64_t r0, int64_t n,
                               __nv_bfloat16* __restrict__ out) {
  const int64_t per_row = K / kChunk;
  const int64_t total = n * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = i % per_row;
    const uint4 q = __ldcs(reinterpret_cast<const uint4*>(W + (r0 + r) * K) + c);
    const float s = sc.at(r0 + r, c);
    float f[kChunk];
    e4m3x4_to_f32(q.x, f);
    e4m3x4_to_f32(q.y, f + 4);
    e4m3x4_to_f32(q.z, f + 8);
    e4m3x4_to_f32(q.w, f + 12);
    uint32_t o[kChunk / 2];
#pragma unroll
    for (int j = 0; j < kChunk / 2; ++j) {
      const __nv_bfloat162 b = __floats2bfloat162_rn(__fmul_rn(f[2 * j], s), __fmul_rn(f[2 * j + 1], s));
      o[j] = *reinterpret_cast<const uint32_t*>(&b);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + r * K) + 2 * c;
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

}  // namespace

int gemv_fp8_split(int64_t N, int64_t K) {
  const int64_t tiles = (N + kTile - 1) / kTile, groups = (K + kGroupK - 1) / kGroupK;
  int s = 1;
  while (s < kWarps && tiles * s < kSplitTargetWarps && groups / (2 * s) >= 2) s *= 2;
  return s;
}

bool gemv_fp8_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W) {
  return W.is_fp8() && W.scale && !W.fp8_padded() && T >= 1 && T <= kGemvMaxRows && W.cols % kChunk == 0 &&
         W.cols < (int64_t{1} << 34) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W.fp8) % 16 == 0 && (W.rows + kTile - 1) / kTile < (int64_t{1} << 31);
}

void gemv_fp8(const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias, float* y, bool accumulate,
              cudaStream_t stream) {
  if (!gemv_fp8_fits(x, T, W))
    throw std::invalid_argument("cuda::gemv_fp8: needs an fp8 W with scales, 1 <= T <= " +
                                std::to_string(kGemvMaxRows) + ", K % 16 == 0 and 16-byte aligned x and W (T=" +
                                std::to_string(T) + " K=" + std::to_string(W.cols) + ")");
  const int split = gemv_fp8_split(W.rows, W.cols);
  gemv::for_rows(T, [&](auto t) {
    gemv::for_split(split, "gemv_fp8",
                    [&](auto sp) { launch<decltype(t)::value, decltype(sp)::value>(x, W, bias, y, accumulate, stream); });
  });
}

bool gemv_fp8_gated_act_fits(const uint16_t* x, int64_t T, const DeviceMatrix& W) {
  return T >= 1 && T <= kGemvGatedActMaxRows && gemv_fp8_fits(x, T, W) && W.rows % 2 == 0 &&
         gemv_fp8_split(W.rows, W.cols) <= kWarps / 2;
}

void gemv_fp8_gated_act(Activation act, const uint16_t* x, int64_t T, const DeviceMatrix& W, const float* bias,
                        uint16_t* out, cudaStream_t stream) {
  if (!gemv_fp8_gated_act_fits(x, T, W) || !out)
    throw std::invalid_argument("cuda::gemv_fp8_gated_act: needs gemv_fp8_gated_act_fits (1 <= T <= " +
                                std::to_string(kGemvGatedActMaxRows) + ", an even row count, split <= " +
                                std::to_string(kWarps / 2) + ") and out (T=" + std::to_string(T) +
                                " N=" + std::to_string(W.rows) + ")");
  const int64_t I = W.rows / 2;
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  const int split = gemv_fp8_split(W.rows, W.cols);
  gemv::for_rows(T, [&](auto t) {
    constexpr int kT = decltype(t)::value;
    if constexpr (kT <= kGemvGatedActMaxRows) {
      gemv::for_split(split, "gemv_fp8_gated_act", [&](auto sp) {
        constexpr int kS = decltype(sp)::value;
        if constexpr (2 * kS <= kWarps) {
          constexpr int kPairs = kWarps / (2 * kS);
          const int64_t pairs = (I + kTile - 1) / kTile;
          const dim3 grid(static_cast<unsigned>((pairs + kPairs - 1) / kPairs)), block(kWarps * 32);
          switch (act) {
            case Activation::silu:
              launch_pdl(true, gemv_fp8_gated_act_kernel<kT, kS, Activation::silu>, grid, block, stream, x, W.fp8,
                         scale_index(W), bias, o, I, W.cols);
              break;
            case Activation::gelu_tanh:
              launch_pdl(true, gemv_fp8_gated_act_kernel<kT, kS, Activation::gelu_tanh>, grid, block, stream, x,
                         W.fp8, scale_index(W), bias, o, I, W.cols);
              break;
            case Activation::gelu:
              launch_pdl(true, gemv_fp8_gated_act_kernel<kT, kS, Activation::gelu>, grid, block, stream, x, W.fp8,
                         scale_index(W), bias, o, I, W.cols);
              break;
          }
        }
      });
    }
  });
}

void dequantize_fp8_rows_bf16(const DeviceMatrix& W, int64_t r0, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n == 0) return;
  if (!W.is_fp8() || !W.scale || W.fp8_padded() || !out || r0 < 0 || n < 0 || r0 + n > W.rows || W.cols % kChunk != 0 ||
      reinterpret_cast<uintptr_t>(W.fp8) % 16 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    throw std::invalid_argument("cuda::dequantize_fp8_rows_bf16: needs an fp8 W with scales, rows [" +
                                std::to_string(r0) + ", " + std::to_string(r0 + n) + ") of " +
                                std::to_string(W.rows) + ", K % 16 == 0 (K=" + std::to_string(W.cols) +
                                ") and 16-byte aligned buffers");
  const int64_t work = n * (W.cols / kChunk);
  const int64_t blocks = std::min<int64_t>((work + 255) / 256, 132 * 16);
  dequant_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(W.fp8, scale_index(W), W.cols, r0, n,
                                                                    reinterpret_cast<__nv_bfloat16*>(out));
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
