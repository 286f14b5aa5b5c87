// Paged prefill / chunked-prefill attention on Hopper wgmma, head_dim 128
// and 256 (the plan's path for those caches: prefill_plan.h; the tile shape
// per head dim is WsShape, prefill_ws.cuh).
//
// Warp-specialized, 384 threads. Warpgroup 0 is the producer (setmaxnreg 56):
// it gathers K/V tiles of KT keys through the block table with cp.async
// into an NS-stage ring of 16-bit 128B-swizzled tiles (fp8: into a 2-stage
// staging ring of raw bytes, then converts its own chunks exactly to f16 in
// the ring stage) and signals full[stage] (mbarrier, 128 arrivals, after
// cp.async wait + fence.proxy.async). Warpgroups 1 and 2 are consumers
// (setmaxnreg 224), 64 query rows each: per tile, S(i) = Q K(i)^T and
// O += P(i-1) V(i-1) are issued together, the softmax of tile i runs while
// P V is on the tensor cores, then the stage of tile i-1 is released
// (empty[stage], 256 arrivals). bf16 and per-token-head caches: named
// barriers order the two consumers' MMA issue (ping-pong), so one
// warpgroup's softmax overlaps the other's MMAs. Both consumers process
// every tile of the CTA's key range (a tile that a row cannot see is masked
// to p = 0 exactly), so their barrier counts match. Softmax: exp2 by ex2.approx.ftz with the score scale folded
// into one FFMA; softcap and masking branch per tile.
//
// Persistent grid: one CTA per SM (225 KB of shared memory) walks work items
// (head, 128-query tile, sequence) ordered heads fastest (the CTAs of one
// query tile share K/V in L2), then sequences, then query tiles from the
// last (longest) one; CTA c takes item r G + c in even rounds r and
// r G + G - 1 - c in odd ones (G CTAs), so the per-CTA sums of the linearly
// shrinking causal items balance over each pair of rounds. The mbarrier ring
// runs on across items (tile counters continue), so the producer gathers the
// next item's first tiles while the consumers finish the current one.
//
// fp8 and int8 caches: f16 MMAs (Q, P rounded to f16); bf16 caches: bf16 MMAs.
// k_scale folds into the score scale, v_scale multiplies the output once;
// per-token-head scales multiply score columns and P's columns (see the kernel).
#include <algorithm>
#include <atomic>
#include <climits>
#include <stdexcept>
#include <string>

#include "backend/cuda/attention/prefill_plan.h"
#include "backend/cuda/attention/prefill_ws.cuh"

namespace fp8kv::cuda {
namespace {
using namespace detail;

// Paged prefill attention, one persistent CTA per SM (grid: min(items, SMs)
// x 1 x 1, 384 threads, WsShape<D, DT>::smem() bytes of dynamic shared memory).
//   D: head dim (128 or 256); DT: cache element code (kBf16, kE4m3, kE5m2, per-token-head).
//   p.q            [total_q][num_heads][D], f32 or bf16 (p.q_bf16); total_q = q_start[batch]
//   p.out          [total_q][num_heads][D], f32 or bf16 (p.out_bf16)
//   p.k_cache, p.v_cache  [num_blocks][block_size][num_kv_heads][D], DT
//   p.block_tables [batch][max_blocks_per_seq]
//   p.context_lens [batch]: sequence b's keys are positions [0, context_lens[b])
//   p.q_start      [batch + 1]: its queries are rows [q_start[b], q_start[b + 1]),
//                  at the last positions of its context
//   p.k_scale, p.v_scale  [1] or [num_kv_heads] (per-tensor-scaled fp8 only)
//   p.k_scale_pth, p.v_scale_pth  [num_blocks][block_size][num_kv_heads] f32 (per-token-head DT,
//                  WgPthParams): the producer loads a tile's KT K and V scales a tile
//                  ahead and stores them beside its stage (sc_empty: the consumers' release
//                  after the tile's softmax); the consumers multiply the score columns by
//                  the K scales and P's columns by the V scales (not the sum l)
//   p.window       0: causal; else query at position i sees keys j with i - j < window
//   p.softmax_scale, p.softcap (0: off); p.group = num_heads / num_kv_heads
//   p.num_q_tiles  ceil(max_query_len / 128); items = num_heads x batch x num_q_tiles
template <int D, int DT>
__global__ void __launch_bounds__(384, 1) prefill_ws_kernel(const WgParamsOf<DT> p) {
  using Shape = WsShape<D, DT>;
  constexpr bool PTH = dt_pth(DT);
  constexpr int EB = DT == kBf16 ? 2 : 1;
  constexpr int kD = D, KT = Shape::KT, kBM = kWsBM;
  constexpr int NS = Shape::NS;
  constexpr int kTileBytes = Shape::kTileBytes;
  constexpr int kRawBytes = Shape::kRawBytes;
  // 16-byte chunks of a key's row: CH of a 16-bit tile row, RCH of a raw fp8 row.
  constexpr int CH = kD / 8, RCH = kD / 16;
  static_assert(128 % CH == 0 && KT % 16 == 0 && KT <= 128, "prefill_ws_kernel: tile shape");
  // bf16 and per-token-head: the two consumers take turns issuing their
  // MMAs (ping-pong), so one's softmax overlaps the other's MMAs (the
  // per-token-head softmax has two multiplies more per score). Per-tensor
  // fp8: no ping-pong (measured even).
  constexpr bool PP = DT == kBf16 || PTH;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align1024(smem_raw);
  uint8_t* sQ = smem;
  uint8_t* sKV = smem + kBM * kD * 2;           // stage s: K at + s * 2 * kTileBytes, V at + kTileBytes
  uint8_t* sRaw = sKV + NS * 2 * kTileBytes;    // fp8 staging r: K at + r * 2 * kRawBytes, V at + kRawBytes
  uint32_t bar0 = smem_u32(sRaw + (DT == kBf16 ? 0 : 2 * 2 * kRawBytes));
  // Per-token-head: the barriers in the alignment pad when it has room
  // (WsShape::smem), the scales [stage][K|V][KT] after the staging ring.
  float* scl = nullptr;
  if constexpr (PTH) {
    const bool in_pad = smem - smem_raw >= 128;
    uint8_t* tail = sRaw + 2 * 2 * kRawBytes;
    bar0 = smem_u32(in_pad ? smem_raw : tail);
    scl = reinterpret_cast<float*>(in_pad ? tail : tail + 128);
  }
  auto sc_empty = [&](int slot) { return bar0 + 8 * (4 * NS + slot); };  // PTH: the scales' release
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
      if constexpr (PTH) mbar_init(sc_empty(s), 256);
    }
  }
  __syncthreads();

  // One work item: query tile qtile (128 rows) of head h of sequence b.
  struct Item {
    int h, qtile, b, q0, nq, pos0, kvh, kv_lo, kv_hi, tile_lo, ntiles;
  };
  const int num_items = p.num_heads * p.batch * p.num_q_tiles;
  // Item of round r (false past the end); w.ntiles == 0: an empty item.
  auto item = [&](int r, Item& w) {
    const int G = gridDim.x, c = blockIdx.x;
    const int k = r * G + ((r & 1) ? G - 1 - c : c);
    if (k >= num_items) return false;
    w.h = k % p.num_heads;
    const int rest = k / p.num_heads;
    w.b = rest % p.batch;
    w.qtile = p.num_q_tiles - 1 - rest / p.batch;  // longest (latest) tiles first
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
    setmaxnreg_dec<kWsProducerRegs>();
    int gbase = 0;  // ring position: tiles of the earlier items
    Item w;
    for (int r = 0; item(r, w); ++r) {
      if (w.ntiles == 0) continue;
      const PageMap pm(p, w.b, w.kvh, kD, EB);
      if constexpr (DT == kBf16) {
        auto issue = [&](int it) {
          const int j0 = w.tile_lo + it * KT;
          const uint32_t dk = smem_u32(sKV + ((gbase + it) % NS) * 2 * kTileBytes), dv = dk + kTileBytes;
          // Keys j and j + 8 per step: j % 16 < 8 (key = 16 group + kk, kk <
          // 8), so both sit in one page (pages are multiples of 16 tokens):
          // one block-table lookup for two keys. Unit c = tid + 128 i: chunk
          // c % CH (= tid % CH) of key kk = (c / CH) % 8 of 16-key group c /
          // (8 CH), i.e. key tid / CH + 16 (u / 8) + u % 8 with u = 128 i / CH.
          const int kb = tid / CH, ch = tid % CH;
#pragma unroll 4
          for (int i = 0; i < KT * CH / 256; ++i) {
            const int u = 128 / CH * i, key = kb + 16 * (u / 8) + u % 8, j = j0 + key;
            const bool ok0 = j >= w.kv_lo && j < w.kv_hi, ok1 = j + 8 >= w.kv_lo && j + 8 < w.kv_hi;
            int64_t off = 0;
            if (ok0 || ok1) off = pm.slot_off(j) + ch * 16;
            const int64_t off0 = ok0 ? off : 0, off1 = ok1 ? off + 8 * pm.row_bytes : 0;
            cp_async16(dk + swz_chunk(KT, key, ch), p.k_cache + off0, ok0);
            cp_async16(dv + swz_chunk(KT, key, ch), p.v_cache + off0, ok0);
            cp_async16(dk + swz_chunk(KT, key + 8, ch), p.k_cache + off1, ok1);
            cp_async16(dv + swz_chunk(KT, key + 8, ch), p.v_cache + off1, ok1);
          }
          cp_async_commit();
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
        // Block ids of this thread's 16-key groups of a tile, loaded one tile
        // ahead (right after the copies of the current one), so no
        // block-table load sits between the copies of consecutive tiles (0
        // for a group outside [kv_lo, kv_hi): never used).
        // Copy unit c = tid + 128 i (i < NG): chunk c % RCH (= tid % RCH) of
        // key (q >> 3) 16 + (q & 7), q = c / RCH, i.e. key rkey0 + (256 /
        // RCH) i, and of that key + 8.
        constexpr int NG = KT * RCH / 256;
        static_assert(128 % (8 * RCH) == 0 && NG * 256 == KT * RCH, "prefill_ws_kernel: fp8 copy units");
        const int rkey0 = ((tid / RCH) >> 3) * 16 + ((tid / RCH) & 7), rch = tid % RCH;
        auto group_of = [&](int gi) { return rkey0 / 16 + 16 / RCH * gi; };
        auto load_ids = [&](int it, int32_t(&ids)[NG]) {
          const int j0 = w.tile_lo + it * KT;
#pragma unroll
          for (int gi = 0; gi < NG; ++gi) {
            const int jg = j0 + 16 * group_of(gi);
            ids[gi] = jg < w.kv_hi && jg + 16 > w.kv_lo ? pm.bt[pm.block_of(jg)] : 0;
          }
        };
        int32_t ids[NG];
        load_ids(0, ids);
        // PTH: key tid's K / V scales of the tile whose copies were issued last
        // (0 outside [kv_lo, kv_hi)), and of the tile being converted.
        float nks = 0.0f, nvs = 0.0f, cks = 0.0f, cvs = 0.0f;
        auto issue_raw = [&](int it) {
          const int j0 = w.tile_lo + it * KT;
          const uint32_t dk = smem_u32(sRaw + ((gbase + it) & 1) * 2 * kRawBytes), dv = dk + kRawBytes;
          // As for bf16: keys key and key + 8 share one 16-key group, so one
          // page and one block-table lookup. The conversion below walks the
          // same (key, chunk) pairs, so a thread converts only its own copies.
#pragma unroll 4
          for (int i = 0; i < NG; ++i) {
            const int ch = rch, key = rkey0 + 256 / RCH * i, j = j0 + key;
            const bool ok0 = j >= w.kv_lo && j < w.kv_hi, ok1 = j + 8 >= w.kv_lo && j + 8 < w.kv_hi;
            int64_t off = 0;
            if (ok0 || ok1) off = pm.slot_off_in(ids[i], j) + ch * 16;
            const int64_t off0 = ok0 ? off : 0, off1 = ok1 ? off + 8 * pm.row_bytes : 0;
            cp_async16(dk + key * kD + ch * 16, p.k_cache + off0, ok0);
            cp_async16(dv + key * kD + ch * 16, p.v_cache + off0, ok0);
            cp_async16(dk + (key + 8) * kD + ch * 16, p.k_cache + off1, ok1);
            cp_async16(dv + (key + 8) * kD + ch * 16, p.v_cache + off1, ok1);
          }
          cp_async_commit();
          if constexpr (PTH) {
            const int j = j0 + tid;
            nks = nvs = 0.0f;
            if (tid < KT && j >= w.kv_lo && j < w.kv_hi) {
              const int64_t idx =
                  (static_cast<int64_t>(pm.bt[pm.block_of(j)]) * pm.block_size + pm.in_block(j)) * p.num_kv_heads +
                  w.kvh;
              nks = p.k_scale_pth[idx];
              nvs = p.v_scale_pth[idx];
            }
          }
          if (it + 1 < w.ntiles) load_ids(it + 1, ids);
        };
        issue_raw(0);
        for (int it = 0; it < w.ntiles; ++it) {
          cks = nks;
          cvs = nvs;
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
            // The chunks this thread copied, addressed as per-thread bases plus
            // compile-time offsets: chunk i is key key0 + dk (dk = (256 / RCH)
            // (i / 2) + 8 (i % 2), a multiple of 8, so the swizzle's key % 8 is
            // key0's), channel tid % RCH as in the copy. (Recomputing each
            // chunk's address costs ~25 integer instructions per chunk and
            // serializes the LDS.)
            const int key0 = rkey0, ch = rch;
            const uint8_t* rsrc = rk + kv * kRawBytes + key0 * kD + ch * 16;
            uint8_t* d = dst + kv * kTileBytes;
            uint8_t* d0 = d + swz_chunk(KT, key0, 2 * ch);
            uint8_t* d1 = d + swz_chunk(KT, key0, 2 * ch + 1);
#pragma unroll
            for (int i = 0; i < 2 * NG; ++i) {
              const int dk = (256 / RCH) * (i >> 1) + 8 * (i & 1);
              const uint4 w4 = *reinterpret_cast<const uint4*>(rsrc + dk * kD);
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
            if constexpr (PTH) {
              if (kv == 0) {  // the tile's scales, published with its K half
                mbar_wait(sc_empty(g & 1), ((g >> 1) & 1) ^ 1);
                if (tid < KT) {
                  scl[(g & 1) * 2 * KT + tid] = cks;
                  scl[(g & 1) * 2 * KT + KT + tid] = cvs;
                }
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
  setmaxnreg_inc<kWsConsumerRegs>();
  const int ct = tid - 128, cw = ct >> 7, lane = ct & 31, wwarp = (ct >> 5) & 3, g = lane >> 2, t = lane & 3;
  const bool softcap = p.softcap > 0.0f;
  auto turn_begin = [&]() { if constexpr (PP) named_bar_sync(3 + cw, 256); };
  auto turn_end = [&]() { if constexpr (PP) named_bar_arrive(3 + (cw ^ 1), 256); };
  if constexpr (PP) {
    if (cw == 1) named_bar_arrive(3, 256);  // consumer 0 issues first
  }
  const uint32_t qa = smem_u32(sQ) + cw * 64 * 128;
  auto ktile = [&](int gi) { return smem_u32(sKV + (gi % NS) * 2 * kTileBytes); };
  // PTH: the score columns of tile gi times its K scales (v = 0) or its V
  // scales (v = 1): this thread's columns 8 n + 2 t + {0, 1}. Shared-memory
  // loads as volatile asm next to their multiplies (loads hoisted ahead of
  // all 32 multiplies would hold 32 registers more).
  const uint32_t scl_s = PTH ? smem_u32(scl) + 8 * t : 0u;
  auto scale_cols = [&](float (&s)[KT / 2], int gi, int v) {
    const uint32_t a = scl_s + ((gi & 1) * 2 + v) * KT * 4;
#pragma unroll
    for (int n = 0; n < KT / 8; ++n) {
      float x, y;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(x), "=f"(y) : "r"(a + 32 * n));
      s[4 * n] *= x; s[4 * n + 1] *= y; s[4 * n + 2] *= x; s[4 * n + 3] *= y;
    }
  };
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
    // 16-byte aligned q: 16-byte loads, all 8 chunks of a thread in flight at
    // once (the same values as the scalar path: bf16 -> float -> MMA type);
    // at D = 256, two batches of 8 (16 f32 chunk pairs would hold 128
    // registers).
    constexpr int kQIt = 64 * (kD / 8) / 128, kQB = kQIt < 8 ? kQIt : 8;
    auto q_chunk = [&](int k, int& row, int& ch, int64_t& off) {
      const int c = (ct & 127) + k * 128;
      row = cw * 64 + c / (kD / 8);
      ch = c % (kD / 8);
      const int qi = w.qtile * kBM + row;
      off = qi < w.nq ? (static_cast<int64_t>(w.q0 + qi) * p.num_heads + w.h) * kD + ch * 8 : -1;
    };
    if ((reinterpret_cast<uintptr_t>(p.q) & 15) == 0 && p.q_bf16) {
#pragma unroll
      for (int k0 = 0; k0 < kQIt; k0 += kQB) {
        uint4 raw[kQB];
#pragma unroll
        for (int k = 0; k < kQB; ++k) {
          int row, ch;
          int64_t off;
          q_chunk(k0 + k, row, ch, off);
          raw[k] = off >= 0 ? __ldg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.q) + off))
                            : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < kQB; ++k) {
          int row, ch;
          int64_t off;
          q_chunk(k0 + k, row, ch, off);
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
      }
    } else if ((reinterpret_cast<uintptr_t>(p.q) & 15) == 0) {
#pragma unroll
      for (int k0 = 0; k0 < kQIt; k0 += kQB) {
        float4 raw[kQB][2];
#pragma unroll
        for (int k = 0; k < kQB; ++k) {
          int row, ch;
          int64_t off;
          q_chunk(k0 + k, row, ch, off);
          const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(p.q) + (off >= 0 ? off : 0));
          raw[k][0] = off >= 0 ? __ldg(src) : make_float4(0, 0, 0, 0);
          raw[k][1] = off >= 0 ? __ldg(src + 1) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < kQB; ++k) {
          int row, ch;
          int64_t off;
          q_chunk(k0 + k, row, ch, off);
          *reinterpret_cast<uint4*>(sQ + swz_chunk(kBM, row, ch)) =
              make_uint4(pack2<DT>(raw[k][0].x, raw[k][0].y), pack2<DT>(raw[k][0].z, raw[k][0].w),
                         pack2<DT>(raw[k][1].x, raw[k][1].y), pack2<DT>(raw[k][1].z, raw[k][1].w));
        }
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
    const float ks_ = DT == kBf16 || PTH ? 1.0f : p.k_scale[p.k_scale_count == 1 ? 0 : w.kvh];
    const float score_mul = softcap ? p.softmax_scale * ks_ / p.softcap : p.softmax_scale * ks_ * kLog2e;
    const int kv_lo = w.kv_lo;

    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    // Scale, mask, online softmax of tile j0 (probabilities left in s; o is
    // not touched: alpha returns the rescale factors).
    // PTH: the score columns times the K scales of tile gi first; at the end
    // P's columns times its V scales (after the sum l), while the previous
    // tile's P V still runs, so the multiplies stay off the path between
    // that MMA's wait and the next issue. Then the tile's scales are released.
    auto softmax = [&](float (&s)[KT / 2], int j0, float (&alpha)[2], int gi) {
      if constexpr (PTH) scale_cols(s, gi, 0);
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
      if constexpr (PTH) {
        scale_cols(s, gi, 1);
        mbar_arrive(sc_empty(gi & 1));
      }
    };

    const int ntiles = w.ntiles, g0 = gbase;
    float s[KT / 2];
    uint32_t pa[KT / 16][4];
    float alpha[2];
    mbar_wait(full(g0 % NS), (g0 / NS) & 1);
    turn_begin();
    qk_issue<kD, KT, DT>(s, qa, kBM * 128, ktile(g0));
    turn_end();
    wgmma_wait<0>();
    reg_fence(s);
    if constexpr (kSplit) mbar_arrive(empty(g0 % NS));
    softmax(s, w.tile_lo, alpha, g0);
    pack_p(s, pa);
    for (int it = 1; it < ntiles; ++it) {
      const int gi = g0 + it;
      mbar_wait(full(gi % NS), (gi / NS) & 1);
      if constexpr (kSplit) mbar_wait(full_v((gi - 1) % NS), ((gi - 1) / NS) & 1);
      turn_begin();
      qk_issue<kD, KT, DT, false>(s, qa, kBM * 128, ktile(gi));
      pv_issue<kD, KT, DT>(o, pa, ktile(gi - 1) + kTileBytes);
      turn_end();
      wgmma_wait<1>();  // S(it); O += P V(it - 1) may still run
      reg_fence(s);
      if constexpr (kSplit) mbar_arrive(empty(gi % NS));  // K of tile it
      softmax(s, w.tile_lo + it * KT, alpha, gi);
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
    pv_issue<kD, KT, DT>(o, pa, ktile(gl) + kTileBytes);
    turn_end();
    wgmma_wait<0>();
    reg_fence(o);
    mbar_arrive(kSplit ? empty_v(gl % NS) : empty(gl % NS));  // the ring runs on

    const float vs = DT == kBf16 || PTH ? 1.0f : p.v_scale[p.v_scale_count == 1 ? 0 : w.kvh];
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


template <int D, int DT>
void launch_ws_t(const WgPthParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = WsShape<D, DT>::smem();
  // Per device, not per process: TP ranks are threads on different GPUs.
  detail::set_func_attribute_once(prefill_ws_kernel<D, DT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  prefill_ws_kernel<D, DT><<<grid, 384, smem, stream>>>(static_cast<const WgParamsOf<DT>&>(p));
  FP8KV_CUDA_CHECK(cudaGetLastError());
}

std::atomic<int> g_max_ctas_for_tests{0};

}  // namespace

void set_prefill_max_ctas_for_tests(int max_ctas) { g_max_ctas_for_tests.store(std::max(0, max_ctas)); }

void launch_prefill_ws(const PrefillArgs& a, cudaStream_t stream) {
  WgPthParams p{};
  fill_prefill_params(p, a, kWsBM);
  p.batch = a.batch;
  const int64_t items = static_cast<int64_t>(a.num_heads) * p.num_q_tiles * a.batch;
  if (items > INT_MAX) throw std::invalid_argument("paged_prefill: too many (head, query tile, sequence) items");
  // One CTA per SM (225 KB of shared memory each), at most one per item.
  int dev = 0, sms = 0;
  FP8KV_CUDA_CHECK(cudaGetDevice(&dev));
  FP8KV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (const int cap = g_max_ctas_for_tests.load(); cap > 0) sms = std::min(sms, cap);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(items, sms)));
  const bool planned = launch_planned<PrefillPath::wgmma_ws>(a.kv.layout.head_dim, a.kv.layout.dtype, [&]<int D, int DT>() {
    launch_ws_t<D, DT>(p, grid, stream);
  });
  if (!planned) throw std::logic_error("launch_prefill_ws: the plan gives this case to another kernel");
}

}  // namespace fp8kv::cuda
