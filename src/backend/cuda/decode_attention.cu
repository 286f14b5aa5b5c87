// Paged decode attention (flash-decoding). One CTA = (KV head, chunk of up to
// 8 of its query heads, sequence, split of the keys); 4 warps take 16-key
// tiles in turn. Tensor cores: S = Q K^T with M = query heads (8 of 16 rows
// used), then O += P V reusing S's accumulator layout as P's A fragment.
//
// K is read straight from global memory into B fragments: the dot product is
// order-free, so the head_dim axis is permuted (dim_of below) such that each
// thread loads whole 16-byte chunks of a key row; Q is loaded in the same
// permuted order. For V the n axis (head_dim) is permuted likewise: thread
// (r, t) owns dims [r * D/8, (r+1) * D/8) of keys 2t, 2t+1, 2t+8, 2t+9.
// fp8 -> f16 happens in registers (exact); k_scale is folded into the score
// scale, v_scale applied once at the end. Splits are combined by a second
// kernel in a fixed order (deterministic).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace fp8kv::cuda {
namespace {
using namespace detail;

constexpr int kWarps = 4;
constexpr int kTile = 16;       // keys per warp tile
constexpr int kMaxGroup = 8;    // query heads per CTA

struct DecodeParams {
  const void* q;
  void* out;
  bool q_bf16, out_bf16;
  const uint8_t* k_cache;
  const uint8_t* v_cache;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* context_lens;
  const float* k_scale;
  const float* v_scale;
  int k_scale_count, v_scale_count;
  int num_heads, num_kv_heads, group, gchunks, block_size, window;
  float softmax_scale, softcap;
  int split_tokens, max_splits;
  float* part_o;    // [batch][num_heads][max_splits][D]
  float* part_lse;  // [batch][num_heads][max_splits] (log2 domain)
};

__device__ __forceinline__ void seq_range(const DecodeParams& p, int ctx, int& first, int& tstart, int& nsplits) {
  const int qpos = ctx - 1;
  first = p.window > 0 ? max(0, qpos - p.window + 1) : 0;
  tstart = first & ~(kTile - 1);
  nsplits = ctx > 0 ? (ctx - tstart + p.split_tokens - 1) / p.split_tokens : 1;
}

template <int D, int DT>
__global__ void __launch_bounds__(kWarps * 32) decode_kernel(const DecodeParams p) {
  constexpr int EB = DT == kBf16 ? 2 : 1;  // bytes per cache element
  constexpr int E = 16 / EB;               // elements per 16-byte chunk
  constexpr int J = E / 4;                 // k-steps per chunk
  constexpr int KS = D / 16;               // k-steps of Q K^T
  constexpr int KW = D * EB / 16;          // words per thread per key row (K)
  constexpr int VBYTES = D / 8 * EB;       // bytes per thread per key row (V)
  constexpr int VW = VBYTES / 4;
  constexpr int MT = D / 16;               // m-tiles of O^T = V^T P^T

  __shared__ float sm_o[kWarps][kMaxGroup][D];
  __shared__ float sm_m[kWarps][kMaxGroup], sm_l[kWarps][kMaxGroup];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 2, t = lane & 3;
  const int kvh = blockIdx.x / p.gchunks, gc = blockIdx.x % p.gchunks;
  const int b = blockIdx.y, split = blockIdx.z;
  const int ctx = p.context_lens[b];
  int first, tstart, nsplits;
  seq_range(p, ctx, first, tstart, nsplits);
  if (split >= nsplits) return;
  const int s_begin = tstart + split * p.split_tokens;
  const int s_end = min(ctx, s_begin + p.split_tokens);
  const int h0 = kvh * p.group + gc * kMaxGroup;
  const int nh = min(kMaxGroup, p.group - gc * kMaxGroup);

  // Q fragments (A operand, rows = heads, 8..15 zero) in the permuted dim order:
  // k-step s, slot pair {2t, 2t+1} -> dims base, base+1; {2t+8, 2t+9} -> base+2, base+3.
  uint32_t qa[KS][2];
  {
    const bool valid = r < nh;
    const int64_t qoff = (static_cast<int64_t>(b) * p.num_heads + h0 + r) * D;
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

  const int32_t* bt = p.block_tables + static_cast<int64_t>(b) * p.max_blocks_per_seq;
  const int64_t row_bytes = static_cast<int64_t>(p.num_kv_heads) * D * EB;
  const int64_t head_off = static_cast<int64_t>(kvh) * D * EB;
  const int ntiles = (s_end - s_begin + kTile - 1) / kTile;

  // Register-staged pipeline: the next tile's K/V loads are in flight while
  // this tile's math runs (when the registers allow: fp8 up to D=128, bf16 up
  // to D=64; else one tile at a time).
  constexpr bool kPrefetch = D * EB <= 128;
  const int vtok[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
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
  uint32_t kw[2][KW], vw[4][VW];
  if (warp < ntiles) load_tile(warp, kw, vw);
  for (int it = warp; it < ntiles; it += kWarps) {
    const int j0 = s_begin + it * kTile;
    const bool has_next = it + kWarps < ntiles;
    uint32_t kn[2][KW], vn[4][VW];
    if (kPrefetch && has_next) load_tile(it + kWarps, kn, vn);

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
      } else {
        load_tile(it + kWarps, kw, vw);
      }
    }
  }

  // Combine the 4 warps (fixed order).
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (t == 0) { sm_m[warp][r] = m; sm_l[warp][r] = l; }
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int d = r * (D / 8) + 2 * i;
    sm_o[warp][2 * t][d] = o[i][0];
    sm_o[warp][2 * t + 1][d] = o[i][1];
    sm_o[warp][2 * t][d + 1] = o[i][2];
    sm_o[warp][2 * t + 1][d + 1] = o[i][3];
  }
  __syncthreads();
  const float vs = DT == kBf16 ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
  for (int idx = threadIdx.x; idx < nh * D; idx += blockDim.x) {
    const int row = idx / D, d = idx % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][row]);
    const float Mref = M == -INFINITY ? 0.0f : M;
    float L = 0.0f, O = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = exp2f(sm_m[w][row] - Mref);
      L += sm_l[w][row] * f;
      O += sm_o[w][row][d] * f;
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

// Combines the splits of one (sequence, head): out = sum_s w_s O_s / sum_s w_s.
template <int D>
__global__ void decode_reduce_kernel(const DecodeParams p) {
  const int head = blockIdx.x, b = blockIdx.y;
  const int ctx = p.context_lens[b];
  int first, tstart, nsplits;
  seq_range(p, ctx, first, tstart, nsplits);
  if (nsplits <= 1) return;
  const int64_t base = (static_cast<int64_t>(b) * p.num_heads + head) * p.max_splits;
  float M = -INFINITY;
  for (int s = 0; s < nsplits; ++s) M = fmaxf(M, p.part_lse[base + s]);
  const float Mref = M == -INFINITY ? 0.0f : M;
  const int kvh = head / p.group;
  const float vs = p.v_scale == nullptr ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : kvh];
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float W = 0.0f, O = 0.0f;
    for (int s = 0; s < nsplits; ++s) {
      const float w = exp2f(p.part_lse[base + s] - Mref);
      W += w;
      O += w * p.part_o[(base + s) * D + d];
    }
    store_act(p.out, (static_cast<int64_t>(b) * p.num_heads + head) * D + d, W > 0.0f ? O / W * vs : 0.0f,
              p.out_bf16);
  }
}

template <int D>
void launch_decode(const DecodeParams& p, KvDtype dt, dim3 grid, int batch, cudaStream_t stream) {
  switch (dt) {
    case KvDtype::bf16: decode_kernel<D, kBf16><<<grid, kWarps * 32, 0, stream>>>(p); break;
    case KvDtype::fp8_e4m3: decode_kernel<D, kE4m3><<<grid, kWarps * 32, 0, stream>>>(p); break;
    case KvDtype::fp8_e5m2: decode_kernel<D, kE5m2><<<grid, kWarps * 32, 0, stream>>>(p); break;
  }
  FP8KV_CUDA_CHECK(cudaGetLastError());
  if (p.max_splits > 1) {
    decode_reduce_kernel<D><<<dim3(p.num_heads, batch), 128, 0, stream>>>(p);
    FP8KV_CUDA_CHECK(cudaGetLastError());
  }
}

int span_tokens(int max_context_len, int window) {
  return window > 0 ? std::min(max_context_len, window + kTile - 1) : max_context_len;
}

}  // namespace

DecodePlan plan_decode(int batch, int num_heads, int num_kv_heads, int head_dim, int max_context_len, int window,
                       int num_sms, int split_tokens) {
  if (batch <= 0 || num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || max_context_len < 0)
    throw std::invalid_argument("plan_decode: bad shape (batch " + std::to_string(batch) + ", heads " +
                                std::to_string(num_heads) + "/" + std::to_string(num_kv_heads) + ")");
  const int span = std::max(1, span_tokens(max_context_len, window));
  const int gchunks = (num_heads / num_kv_heads + kMaxGroup - 1) / kMaxGroup;
  if (split_tokens <= 0) {
    // Aim at ~8 CTAs of 4 warps per SM (several waves of 2-3 resident CTAs,
    // so the tail wave is small); splits of at least 256 keys so the partial
    // results (G x (D+1) floats per split) stay ~3% of the KV bytes read.
    const int64_t base = static_cast<int64_t>(batch) * num_kv_heads * gchunks;
    const int64_t want = std::max<int64_t>(1, (static_cast<int64_t>(num_sms) * 8 + base - 1) / base);
    split_tokens = static_cast<int>(std::max<int64_t>(256, (span + want - 1) / want));
  }
  DecodePlan plan;
  plan.split_tokens = (split_tokens + 63) / 64 * 64;
  plan.max_splits = (span + plan.split_tokens - 1) / plan.split_tokens;
  if (plan.max_splits > 1)
    plan.workspace_bytes = static_cast<size_t>(batch) * num_heads * plan.max_splits * (head_dim + 1) * sizeof(float);
  return plan;
}

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
  p.q = a.q;
  p.out = a.out;
  p.q_bf16 = a.q_dtype == ActDtype::bf16;
  p.out_bf16 = a.out_dtype == ActDtype::bf16;
  p.k_cache = static_cast<const uint8_t*>(a.kv.k_cache);
  p.v_cache = static_cast<const uint8_t*>(a.kv.v_cache);
  p.block_tables = a.kv.block_tables;
  p.max_blocks_per_seq = a.kv.max_blocks_per_seq;
  p.context_lens = a.kv.context_lens;
  p.k_scale = fp8 ? a.kv.k_scale.values : nullptr;
  p.v_scale = fp8 ? a.kv.v_scale.values : nullptr;
  p.k_scale_count = a.kv.k_scale.count;
  p.v_scale_count = a.kv.v_scale.count;
  p.num_heads = a.num_heads;
  p.num_kv_heads = L.num_kv_heads;
  p.group = a.num_heads / L.num_kv_heads;
  p.gchunks = (p.group + kMaxGroup - 1) / kMaxGroup;
  p.block_size = L.block_size;
  p.window = a.window;
  p.softmax_scale = a.softmax_scale;
  p.softcap = a.logit_softcap;
  p.split_tokens = a.plan.split_tokens;
  p.max_splits = a.plan.max_splits;
  if (p.max_splits > 1) {
    p.part_o = static_cast<float*>(a.workspace);
    p.part_lse = p.part_o + static_cast<size_t>(a.batch) * a.num_heads * p.max_splits * L.head_dim;
  }
  const dim3 grid(L.num_kv_heads * p.gchunks, a.batch, p.max_splits);
  switch (L.head_dim) {
    case 64: launch_decode<64>(p, L.dtype, grid, a.batch, stream); break;
    case 128: launch_decode<128>(p, L.dtype, grid, a.batch, stream); break;
    case 256: launch_decode<256>(p, L.dtype, grid, a.batch, stream); break;
  }
}

}  // namespace fp8kv::cuda
