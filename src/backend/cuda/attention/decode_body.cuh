// The paged decode kernel's body (decode_kernels.cu instantiates it).
#pragma once
#include "backend/cuda/attention/decode_common.cuh"
namespace fp8kv::cuda::decode {
template <int D, int DT, bool DEEP, bool LEAN, bool REG, bool FAST>
__device__ __forceinline__ void decode_body(const DecodeParamsOf<DT>& p) {
  static_assert(!FAST || !DecodeCfg<D, DT, REG>::USE_RING, "FAST: register path only");
  static_assert(!FAST || !LEAN || (D == 128 && (DT == kE4m3 || dt_pth(DT))), "F4: FAST 1-byte codes d128 only");
  constexpr bool PTH = dt_pth(DT);  // per-token-head scales
  static_assert(!PTH || !DecodeCfg<D, DT, REG>::USE_RING, "per-token-head: register loops only");
  using C = DecodeCfg<D, DT, REG>;
  constexpr int EB = C::EB;
  constexpr int E = 16 / EB;               // elements per 16-byte chunk
  constexpr int J = E / 4;                 // k-steps per chunk
  constexpr int KS = D / 16;               // k-steps of Q K^T
  constexpr int MT = D / 16;               // m-tiles of O^T = V^T P^T
  constexpr int S = C::S;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* const smem = smem_raw;
  float* sm_m = reinterpret_cast<float*>(smem + kWarps * C::RING);
  float* sm_l = sm_m + kWarps * kMaxGroup;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = lane >> 2, t = lane & 3;
  const int kvh = blockIdx.x / p.gchunks;
  const int gc = blockIdx.x % p.gchunks;
  constexpr int TS = kWarps;  // register path: tile stride of a warp
  const int T0 = warp;        // and its first tile
  const int b = blockIdx.y, split = blockIdx.z;
  const int ctx = p.context_lens[b];
  const int32_t* bt = p.block_tables + static_cast<int64_t>(b) * p.max_blocks_per_seq;
  // FAST: without a window the block ids of this warp's first 64 tiles do not
  // depend on the context length: loaded with it, clamped to the table's row
  // (f_fetch's offsets past the context are 0).
  int spec_blk[2] = {0, 0};
  const bool spec = FAST && p.window <= 0 && p.max_blocks_per_seq > 0;
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
    // Waits even so: a grid where no CTA waited (all contexts 0) could
    // finish before the previous kernel, and the next would not follow it.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    return;
  }
  // Programmatic dependent launch: before this wait only the context lengths
  // and block tables (step inputs) are read; Q, K/V, scales and every write
  // come after it. FAST waits after fetching its first block ids.
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
  // Per-token-head: lane i loads the K (lanes 0-15) or V scale of key row i % 16
  // of a tile (index: the tile's byte offset / (D * EB), the row of its first
  // key and this head, + (i % 16) rows); the math shuffles them to the lanes
  // that own the keys.
  const float* sc_lane = nullptr;
  if constexpr (PTH) sc_lane = (lane < 16 ? p.k_scale_pth : p.v_scale_pth) + (lane & 15) * p.num_kv_heads;
  auto sc_load = [&](long long off) -> float {
    if constexpr (PTH) return __ldg(sc_lane + (off >> (D == 64 ? 6 : D == 128 ? 7 : 8)));
    else return 0.0f;
  };
  static_assert(!PTH || C::EB == 1, "per-token-head: 1-byte codes");
  // Block ids of this warp's tiles, 32 at a time (lane i holds tile 32k + i).
  int bt_lane = 0;
  // Copies this warp's k-th tile into stage `st` (one commit group per call).
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
  // Register-staged pipeline: the next tile's K/V loads in flight during this
  // tile's math when the registers allow (fp8 up to D=128, bf16 up to D=64).
  constexpr bool kPrefetch = !LEAN && D * EB <= (DEEP ? 256 : 128);
  constexpr bool kPrefetch2 = DEEP && D * EB <= 128;  // two tiles ahead
  auto load_tile = [&](int it, uint32_t (&kw)[2][KW], uint32_t (&vw)[4][VW], float& sc_) {
    const int j0 = s_begin + it * kTile;
    const int64_t blk = bt[j0 / p.block_size];
    const int64_t row0 = blk * p.block_size + j0 % p.block_size;  // the tile stays inside one block
    sc_ = sc_load(row0 * row_bytes + head_off);
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
  // Register path: the first tile's loads are issued before Q's (overlapped).
  uint32_t kw[2][KW], vw[4][VW];
  float sc = 0.0f, scn = 0.0f;  // per-token-head: this lane's scale of the tile in kw / vw, kn / vn
  if (!C::USE_RING && !FAST && T0 < ntiles) load_tile(T0, kw, vw, sc);
  uint32_t kn[2][KW], vn[4][VW];  // tile it + kWarps (in flight), two-ahead variant only
  if (kPrefetch2 && T0 + TS < ntiles) load_tile(T0 + TS, kn, vn, scn);
  // FAST: per-thread byte offsets inside a tile (32-bit), hoisted; the 64-bit
  // offset of each tile, 32 tiles at a time (one per lane), fetched 32 ahead.
  static_assert(!FAST || !kPrefetch2, "FAST: at most one tile ahead in registers");
  uint32_t fk_off[2] = {0u, 0u}, fv_off[4] = {0u, 0u, 0u, 0u};
  long long f_cur = 0, f_nxt = 0;
  // f_fetch in two halves (block id of tile kk, 0 past this warp's tiles;
  // then its offset), so the prologue's two batches of table loads overlap.
  auto f_blk = [&](int kk) -> int {
    return kk < nmine ? bt[(s_begin + (T0 + kk * TS) * kTile) / p.block_size] : 0;
  };
  auto f_off = [&](int64_t blk, int kk) -> long long {
    if (kk >= nmine) return 0;
    const int j = s_begin + (T0 + kk * TS) * kTile;
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
  auto f_load = [&](int k, uint32_t (&kw_)[2][KW], uint32_t (&vw_)[4][VW], float& sc_) {
    const long long off = f_load_k(k, kw_);
    sc_ = sc_load(off);
    f_load_v(off, vw_);
  };
  if constexpr (FAST) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) fk_off[nt] = static_cast<uint32_t>((nt * 8 + r) * row_bytes + t * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i) fv_off[i] = static_cast<uint32_t>(vtok[i] * row_bytes + r * VBYTES);
    if (!spec) {
      spec_blk[0] = f_blk(lane);
      spec_blk[1] = f_blk(32 + lane);
    }
    f_cur = f_off(spec_blk[0], lane);
    f_nxt = f_off(spec_blk[1], 32 + lane);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (T0 < ntiles) f_load(0, kw, vw, sc);
  }
  // Q fragments (A operand, rows = heads, 8..15 zero) in the permuted dim order:
  // k-step s, slot pair {2t, 2t+1} -> dims base, base+1; {2t+8, 2t+9} -> base+2, base+3.
  uint32_t qa[KS][2];
  {
    const bool valid = r < nh;
    const int64_t qoff = (static_cast<int64_t>(b) * p.num_heads + h0 + r) * D;
    // FAST: one 8- or 16-byte load per k-step, all before the first conversion.
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
  const float ks = DT == kBf16 || PTH ? 1.0f : p.k_scale[p.k_scale_count == 1 ? 0 : kvh];
  const float score_scale = p.softmax_scale * ks;
  const bool softcap = p.softcap > 0.0f;
  const float score_mul = softcap ? score_scale / p.softcap : score_scale * kLog2e;
  // O^T accumulators: m-tile i, rows g / g+8 -> dims r*(D/8) + 2i / + 2i+1, columns 2t / 2t+1 -> heads.
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
            k_operand<DT, J>(w, j, b0, b1);  // (j < J: this chunk's k-step j)
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
      uint32_t pa0, pa2;
      const SoftmaxRow sr = online_softmax_step<DT, MT, false>(x, mx, t, m, l, o, pa0, pa2);
      m = sr.m;
      l = sr.l;
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
          v_operand<DT, UW>(vw, im, a0, a1, a2, a3);  // this unit's m-tile im
          mma16816<DT>(o[i], a0, a1, a2, a3, pa0, pa2);
        }
      }
      // Refill the stage just read (its words are in registers: same thread).
      issue(k + S, st);
      st = st + 1 == S ? 0 : st + 1;
    }
    cp_async_wait<0>();
  } else if constexpr (FAST) {
    // One tile's math (the reg loop's, bitwise). kn >= 0 (F4): once the scores
    // are done, tile kn's K loads into kw_, its offset into k_next_off.
    long long k_next_off = 0;
    auto math = [&](int j0, uint32_t (&kw_)[2][KW], uint32_t (&vw_)[4][VW], int kn, float sc_) {
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks_ = 0; ks_ < KS; ++ks_) {
          uint32_t b0, b1;
          k_operand<DT, J>(kw_[nt], ks_, b0, b1);
          // A rows 8-15 (a1, a3) only feed S rows 8-15, never read: opaque values
          // instead of zeros (which cost 16 moves per tile).
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
      float x[2][2], vsc[2][2];
      pth_scales<PTH>(sc_, t, x, vsc);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) x[nt][e] = PTH ? (s[nt][e] * x[nt][e]) * score_mul : s[nt][e] * score_mul;
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
            if constexpr (PTH) vsc[nt][e] = (j >= first && j < s_end) ? vsc[nt][e] : 0.0f;  // p = 0, scale may be NaN
          }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) mx = fmaxf(mx, x[nt][e]);
      uint32_t pa0, pa2;
      const SoftmaxRow sr = online_softmax_step<DT, MT, true, PTH>(x, mx, t, m, l, o, pa0, pa2, vsc);
      m = sr.m;
      l = sr.l;
      if (edge) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int j = j0 + vtok[i];
          if (j < first || j >= s_end)
#pragma unroll
            for (int w = 0; w < VW; ++w) vw_[i][w] = 0u;
        }
      }
      pv_mma<DT>(o, vw_, pa0, pa2);
    };
    if constexpr (kPrefetch) {
      // Ping-pong: tile ow in (kc, vc) while tile ow + 1 loads into (kx, vx).
      auto step = [&](int it, int ow, uint32_t (&kc)[2][KW], uint32_t (&vc)[4][VW], float& scc,
                      uint32_t (&kx)[2][KW], uint32_t (&vx)[4][VW], float& scx) {
        if (it + TS < ntiles) f_load(ow + 1, kx, vx, scx);
        math(s_begin + it * kTile, kc, vc, -1, scc);
      };
      for (int it = T0, ow = 0; it < ntiles; it += 2 * TS, ow += 2) {
        step(it, ow, kw, vw, sc, kn, vn, scn);
        if (it + TS >= ntiles) break;
        step(it + TS, ow + 1, kn, vn, scn, kw, vw, sc);
      }
    } else {
      for (int it = T0, ow = 0; it < ntiles; it += TS, ++ow) {
        const bool next = it + TS < ntiles;
        if constexpr (LEAN) {
          // F4: one register stage refilled as it frees (K after the scores, V last).
          math(s_begin + it * kTile, kw, vw, next ? ow + 1 : -1, sc);
          if (next) {
            sc = sc_load(k_next_off);
            f_load_v(k_next_off, vw);
          }
        } else {
          math(s_begin + it * kTile, kw, vw, -1, sc);
          if (next) f_load(ow + 1, kw, vw, sc);
        }
      }
    }
  } else {
    for (int it = T0, ow = 0; it < ntiles; it += TS, ++ow) {
      const int j0 = s_begin + it * kTile;
      const bool has_next = it + TS < ntiles;
      uint32_t k2[2][KW], v2[4][VW];
      float sc2 = 0.0f;
      if constexpr (kPrefetch2) {
        if (it + 2 * TS < ntiles) load_tile(it + 2 * TS, k2, v2, sc2);
      } else if (kPrefetch && has_next) {
        load_tile(it + TS, kn, vn, scn);
      }
      // S = Q K^T for keys j0 + nt*8 + (0..7).
      float s[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks_ = 0; ks_ < KS; ++ks_) {
          uint32_t b0, b1;
          k_operand<DT, J>(kw[nt], ks_, b0, b1);
          mma16816<DT>(s[nt], qa[ks_][0], 0u, qa[ks_][1], 0u, b0, b1);
        }
      }
      // Scores in log2 units, masked outside [first, ctx).
      float x[2][2], vsc[2][2];
      pth_scales<PTH>(sc, t, x, vsc);
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + 2 * t + e;
          float v = PTH ? (s[nt][e] * x[nt][e]) * score_mul : s[nt][e] * score_mul;
          if (softcap) v = p.softcap * tanhf(v) * kLog2e;
          v = (j >= first && j < s_end) ? v : -INFINITY;
          if constexpr (PTH) vsc[nt][e] = (j >= first && j < s_end) ? vsc[nt][e] : 0.0f;
          x[nt][e] = v;
          mx = fmaxf(mx, v);
        }
      uint32_t pa0, pa2;
      const SoftmaxRow sr = online_softmax_step<DT, MT, false, PTH>(x, mx, t, m, l, o, pa0, pa2, vsc);
      m = sr.m;
      l = sr.l;
      // Zero V of keys outside [first, ctx): unwritten slots may hold NaN codes.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = j0 + vtok[i];
        if (j < first || j >= s_end)
#pragma unroll
          for (int w = 0; w < VW; ++w) vw[i][w] = 0u;
      }
      pv_mma<DT>(o, vw, pa0, pa2);
      if (has_next) {
        if constexpr (kPrefetch) {
          copy_words(kw, kn);
          copy_words(vw, vn);
          sc = scn;
          if constexpr (kPrefetch2) {
            scn = sc2;
            copy_words(kn, k2);
            copy_words(vn, v2);
          }
        } else {
          load_tile(it + TS, kw, vw, sc);
        }
      }
    }
  }
  combine_warps<D, DT, C::RING>(p, smem, sm_m, sm_l, o, m, l, warp, r, t, kvh, b, h0, nh, split, nsplits);
}
}  // namespace fp8kv::cuda::decode
