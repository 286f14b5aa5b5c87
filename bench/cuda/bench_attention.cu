// Kernel benchmarks for the paged KV cache (one GPU run, JSON lines on stdout):
//   copy    : cudaMemcpy D2D bandwidth (bytes read + written), the ceiling
//   read    : a read-only streaming kernel's bandwidth (subcommand `read`;
//             decode only reads, the copy also writes: a second reference,
//             and a kernel Nsight Compute can profile beside decode's)
//   decode  : paged decode, Llama-3-8B attention shape (32 q heads, 8 KV heads,
//             head_dim 128), batch x context, bf16 and fp8 e4m3 caches; and
//             Gemma-3-12B's (16 q heads, 8 KV heads, head_dim 256)
//   plans   : the auto plan at assumed CTAs per SM (FP8KV_BENCH_CTAS, plan tuning)
//   splits  : fp8 d128 decode at forced split sizes (plan tuning)
//   (argument: all | store | read | prefill | prefill256 | decode | decode128 (d128 rows only) |
//    decode256 (d256 rows only) | probe (bf16 B=64/4K, 32/4K, 64/1K, then B=32/64K, then the three again) |
//    plans | splits)
//   prefill : 8K causal prefill from the paged cache, head_dim 128 (the plan's wgmma kernel)
//   prefill256 : the same at head_dim 256, 24 / 4 heads (Qwen3.5-27B's full_attention layers)
//   store   : store of 64K tokens, bf16 input, bf16, fp8 and the per-token-head caches
//   (decode, prefill and store also run the per-token-head dtypes beside per-tensor fp8)
// Working sets are rotated among several caches so that each launch reads
// well past the 60 MB L2. CUDA events, warm-up, medians; decode rows and the
// copy also by the stream method (stream_median_ms).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"  // ld_stream16 (the decode kernels' K/V load), mbarriers, tensor maps
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/attention/prefill_plan.h"

using namespace fp8kv;
using namespace fp8kv::cuda;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace {

constexpr int kH = 32, kHkv = 8, kD = 128, kBlock = 16;

// Finite random bytes: fp8 codes with the top exponent bit cleared (no NaN),
// bf16 values of magnitude < 2.
__global__ void fill_kernel(uint8_t* p, size_t n, uint32_t seed, int bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n / 4; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13; x *= 3266489917u; x ^= x >> 16;
    reinterpret_cast<uint32_t*>(p)[i] = bf16 ? (x & 0xbfffbfffu) & 0x3fff3fffu | (x & 0x80008000u) : x & 0xf7f7f7f7u;
  }
}
void fill(void* p, size_t n, uint32_t seed, bool bf16) {
  fill_kernel<<<1024, 256>>>(static_cast<uint8_t*>(p), n, seed, bf16 ? 1 : 0);
  CK(cudaGetLastError());
}
// Per-token-head scales: n floats in [2^-7, 2^-6).
__global__ void fill_scales_kernel(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13;
    p[i] = 0.0078125f * (1.0f + static_cast<float>(x & 0xffu) / 256.0f);
  }
}
float* alloc_scales(size_t n, uint32_t seed) {
  float* p;
  CK(cudaMalloc(&p, std::max<size_t>(n, 1) * 4));
  fill_scales_kernel<<<256, 256>>>(p, n, seed);
  CK(cudaGetLastError());
  return p;
}

template <class F>
double median_ms(F&& launch, int warmup, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) launch(i);
  CK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    launch(warmup + i);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Keeps the GPU busy for `ns` nanoseconds (a one-thread spin on the global
// timer), so that the launches enqueued behind it are all queued before the
// GPU reaches them.
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (unsigned long long t = t0; t - t0 < ns;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
}

// Stream method (docs/cuda.md, "Decode v11"): the per-call GPU time of calls
// issued back to back behind a spin kernel, as a CUDA graph or a busy engine
// stream runs them: events e_0 .. e_reps around the calls, no host sync
// between them, so no call waits for its own host-side launch. Returns the
// median of e_{i+1} - e_i; *host_us: the mean host time of one launch() call
// and its event record.
template <class F>
double stream_median_ms(F&& launch, int first, int reps, double* host_us = nullptr) {
  std::vector<cudaEvent_t> e(reps + 1);
  for (auto& x : e) CK(cudaEventCreate(&x));
  CK(cudaDeviceSynchronize());
  spin_kernel<<<1, 1>>>(static_cast<unsigned long long>(2000000 + 100000ull * reps));  // 2 ms + 100 us per call
  CK(cudaGetLastError());
  const auto h0 = std::chrono::steady_clock::now();
  CK(cudaEventRecord(e[0]));
  for (int i = 0; i < reps; ++i) {
    launch(first + i);
    CK(cudaEventRecord(e[i + 1]));
  }
  const auto h1 = std::chrono::steady_clock::now();
  CK(cudaEventSynchronize(e[reps]));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e[i], e[i + 1]));
    t.push_back(ms);
  }
  for (auto& x : e) CK(cudaEventDestroy(x));
  if (host_us) *host_us = std::chrono::duration<double, std::micro>(h1 - h0).count() / reps;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double g_copy_stream_gbs = 0;  // bench_copy's stream-method bandwidth

double bench_copy() {
  const size_t n = size_t(2) << 30;
  void *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  fill(a, n, 1, false);
  auto copy = [&](int) { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); };
  const double ms = median_ms(copy, 3, 15);
  const double ms_stream = stream_median_ms(copy, 0, 15);
  CK(cudaFree(a));
  CK(cudaFree(b));
  const double gbs = 2.0 * n / (ms * 1e-3) / 1e9;
  g_copy_stream_gbs = 2.0 * n / (ms_stream * 1e-3) / 1e9;
  std::printf("{\"kind\":\"copy\",\"bytes\":%zu,\"ms\":%.4f,\"GBps\":%.1f,\"ms_stream\":%.4f,\"GBps_stream\":%.1f}\n",
              2 * n, ms, gbs, ms_stream, g_copy_stream_gbs);
  return gbs;
}

// Read-only streaming: every thread keeps U independent 16-byte loads in
// flight (ld.global.nc, no L1 allocation, as the decode kernels' K/V loads),
// grid-stride over the buffer; the XOR of what it read decides a store that
// never happens, so the loads stay.
template <int U>
__global__ void read_kernel(const uint4* __restrict__ p, size_t n16, unsigned* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n16; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = detail::ld_stream16(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// The decode kernels' own load shape (decode v13's sweep, not yet run): the
// buffer as rows of 1 KB (8 KV heads x 128 bytes, fp8 d128's paged rows); a
// tile is 32 rows of one head's 128-byte column (4 KB, the K and V of one
// fp8 d128 tile), lane (r, t) loading rows r, r + 8, r + 16, r + 24 at
// bytes 64c + 16t (c = 0, 1), as the FAST kernel does; U tiles in flight per
// warp; warp w's tiles w, w + warps, ... (adjacent tiles: adjacent heads).
template <int U>
__global__ void paged_read_kernel(const uint8_t* __restrict__ p, size_t ntiles, unsigned* sink) {
  const int lane = threadIdx.x & 31, r = lane >> 2, t = lane & 3;
  const size_t nwarps = size_t(gridDim.x) * (blockDim.x >> 5);
  size_t tile = size_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  uint32_t acc = 0;
  for (; tile + (U - 1) * nwarps < ntiles; tile += U * nwarps) {
    uint4 v[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t tu = tile + u * nwarps;
      const uint8_t* base = p + (tu / 8) * 32 * 1024 + (tu % 8) * 128 + t * 16;
#pragma unroll
      for (int i = 0; i < 8; ++i) v[u][i] = detail::ld_stream16(base + (r + 8 * (i / 2)) * 1024 + 64 * (i % 2));
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc ^= v[u][i].x ^ v[u][i].y ^ v[u][i].z ^ v[u][i].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// Streams through a shared-memory ring filled by the TMA unit (decode v13's
// sweep): each warp keeps S tiles of 4 KB in flight, one mbarrier per stage.
// ROW = 128: 32 bulk copies of 128 bytes per tile (one per lane, as decode
// v13's BULK variant copied its K/V rows; since removed); ROW = 4096: one
// bulk copy per tile; ROW = 0: one `cp.async.bulk.tensor` per tile through
// `tm`, a box of 32 rows x 128 bytes of the 1 KB-row view (paged_read_kernel's
// tiles; not yet run: does one instruction per box lift the 128-byte copies'
// cap, 4.11 TB/s in run R_3?).
template <int S, int ROW>
__global__ void ring_read_kernel(const __grid_constant__ CUtensorMap tm, const uint8_t* __restrict__ p, size_t ntiles,
                                 unsigned* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  constexpr int kTileB = 4096;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + warp * S * kTileB;
  const uint32_t bars = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + nw * S * kTileB + warp * S * 8;
  if (lane == 0) {
    for (int st = 0; st < S; ++st) detail::mbar_init(bars + 8 * st, 1);
    detail::mbar_init_fence();
  }
  __syncwarp();
  const size_t gw = size_t(blockIdx.x) * nw + warp, nwarps = size_t(gridDim.x) * nw;
  auto issue = [&](size_t k, int st) {
    const size_t tile = gw + k * nwarps;
    if (tile >= ntiles) return;
    const uint32_t dst = ring + st * kTileB, bar = bars + 8 * st;
    if (lane == 0) detail::mbar_arrive_expect_tx(bar, kTileB);
    __syncwarp();
    if constexpr (ROW == 0) {
      if (lane == 0) {
        const int x = static_cast<int>(tile % 8) * 128, y = static_cast<int>(tile / 8) * 32;
        detail::tma_load_2d(dst, &tm, x, y, bar);
      }
    } else if constexpr (ROW == kTileB) {
      if (lane == 0) detail::bulk_g2s(dst, p + tile * kTileB, kTileB, bar);
    } else {
      detail::bulk_g2s(dst + lane * ROW, p + tile * kTileB + lane * ROW, ROW, bar);
    }
  };
  for (int st = 0; st < S; ++st) issue(st, st);
  uint32_t acc = 0;
  const size_t mine = gw < ntiles ? (ntiles - gw + nwarps - 1) / nwarps : 0;
  for (size_t k = 0; k < mine; ++k) {
    const int st = static_cast<int>(k % S);
    detail::mbar_wait(bars + 8 * st, static_cast<uint32_t>((k / S) & 1));
    uint32_t w;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(w) : "r"(ring + st * kTileB + lane * 4));
    acc ^= w;
    __syncwarp();
    issue(k + S, st);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// The tensor map of the 1 KB-row view of `a` (n bytes), boxes of 32 rows x
// 128 bytes, through the driver's encoder fetched at run time.
CUtensorMap row_view_tensor_map(void* a, size_t n) {
  CUtensorMap tm;
  std::string why;
  if (!detail::encode_row_tensor_map(&tm, a, 1024, n / 1024, 128, 32, false, &why)) {
    std::fprintf(stderr, "%s\n", why.c_str());
    std::exit(1);
  }
  return tm;
}

// The read-only ceiling: 4 GiB read per call (the copy's bytes: 2 GiB read
// + 2 GiB written), 8 CTAs of 256 threads per SM, 8 loads in flight per
// thread (256 KB per SM); both timing methods. `sweep` (decode v13): the
// same kernel at fewer bytes in flight per SM (U loads per thread, CTAs per
// SM, threads per CTA), down to the fp8 d128 decode kernel's 384 threads per
// SM, one JSON line (kind "read") per configuration.
void bench_read(bool sweep) {
  const size_t n = size_t(4) << 30;
  void* a;
  unsigned* sink;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&sink, sizeof(unsigned)));
  fill(a, n, 7, false);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // bulk: 0 = ld.global (U loads per thread), 1-2 bulk copies with U stages
  // of 4 KB per warp, 128-byte rows (1) or one 4 KB copy per tile (2); 3 the
  // TMA tensor map (U stages), 4 the decode kernels' paged-row loads (U tiles
  // in flight per warp). 3 and 4: run R_3's sweep did not have them yet.
  struct Cfg { int u, ctas, threads, bulk = 0; };
  std::vector<Cfg> cfgs{{8, 8, 256}};
  if (sweep)
    cfgs = {{8, 8, 256}, {2, 8, 256}, {1, 8, 256}, {16, 3, 128}, {8, 3, 128}, {4, 3, 128},
            {8, 4, 128}, {4, 4, 128}, {8, 5, 128}, {8, 6, 128}, {8, 4, 256}, {8, 2, 128},
            {2, 3, 128, 1}, {3, 3, 128, 1}, {4, 3, 128, 1}, {2, 4, 128, 1}, {3, 4, 128, 1},
            {3, 3, 128, 2}, {2, 2, 128, 1}, {4, 2, 128, 1}, {1, 3, 128, 4}, {2, 3, 128, 4},
            {1, 4, 128, 4}, {2, 4, 128, 4}, {2, 8, 256, 4}, {2, 3, 128, 3}, {3, 3, 128, 3}, {2, 4, 128, 3},
            {3, 4, 128, 3}};
  const CUtensorMap tm = sweep ? row_view_tensor_map(a, n) : CUtensorMap{};
  for (const Cfg& c : cfgs) {
    const int bulk_smem = c.bulk && c.bulk != 4 ? c.threads / 32 * c.u * (4096 + 8) : 0;
    const int inflight_kb = c.bulk ? c.u * c.ctas * c.threads / 32 * 4 : c.u * c.ctas * c.threads * 16 / 1024;
    auto rd = [&](int) {
      const dim3 g(sms * c.ctas), b(c.threads);
      const auto* src = static_cast<const uint4*>(a);
      if (c.bulk == 4) {
        const auto* s8 = static_cast<const uint8_t*>(a);
        if (c.u == 1) paged_read_kernel<1><<<g, b>>>(s8, n / 4096, sink);
        else paged_read_kernel<2><<<g, b>>>(s8, n / 4096, sink);
        CK(cudaGetLastError());
        return;
      }
      if (c.bulk) {
        const auto* s8 = static_cast<const uint8_t*>(a);
        auto run = [&](auto kernel) {
          CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bulk_smem));
          kernel<<<g, b, bulk_smem>>>(tm, s8, n / 4096, sink);
        };
        if (c.bulk == 3) {
          if (c.u == 2) run(ring_read_kernel<2, 0>);
          else run(ring_read_kernel<3, 0>);
        } else if (c.bulk == 2) {
          run(ring_read_kernel<3, 4096>);
        } else if (c.u == 2) {
          run(ring_read_kernel<2, 128>);
        } else if (c.u == 3) {
          run(ring_read_kernel<3, 128>);
        } else {
          run(ring_read_kernel<4, 128>);
        }
        CK(cudaGetLastError());
        return;
      }
      switch (c.u) {
        case 1: read_kernel<1><<<g, b>>>(src, n / 16, sink); break;
        case 2: read_kernel<2><<<g, b>>>(src, n / 16, sink); break;
        case 4: read_kernel<4><<<g, b>>>(src, n / 16, sink); break;
        case 8: read_kernel<8><<<g, b>>>(src, n / 16, sink); break;
        case 16: read_kernel<16><<<g, b>>>(src, n / 16, sink); break;
        default: read_kernel<32><<<g, b>>>(src, n / 16, sink); break;
      }
      CK(cudaGetLastError());
    };
    const double ms = median_ms(rd, 3, 15);
    const double ms_stream = stream_median_ms(rd, 0, 15);
    std::printf(
        "{\"kind\":\"read\",\"bulk\":%d,\"u\":%d,\"ctas_per_sm\":%d,\"threads\":%d,"
        "\"inflight_kb_per_sm\":%d,\"bytes\":%zu,"
        "\"ms\":%.4f,\"GBps\":%.1f,\"ms_stream\":%.4f,\"GBps_stream\":%.1f}\n",
        c.bulk, c.u, c.ctas, c.threads, inflight_kb, n, ms, n / (ms * 1e-3) / 1e9, ms_stream,
        n / (ms_stream * 1e-3) / 1e9);
    std::fflush(stdout);
  }
  CK(cudaFree(a));
  CK(cudaFree(sink));
}

// A set of paged caches (rotated) for `batch` sequences of `ctx` tokens.
struct CacheSet {
  KvCacheLayout L;
  std::vector<void*> k, v;
  std::vector<float*> ks, vs;  // per-token-head dtypes: each copy's scales
  int32_t* block_tables = nullptr;
  int32_t* ctx_lens = nullptr;
  int max_blocks = 0;
  CacheSet(KvDtype dt, int batch, int ctx, size_t min_total_bytes, int hkv = kHkv, int d = kD) {
    max_blocks = (ctx + kBlock - 1) / kBlock;
    L = KvCacheLayout{.num_blocks = batch * max_blocks, .block_size = kBlock, .num_kv_heads = hkv, .head_dim = d, .dtype = dt};
    const size_t bytes = L.cache_bytes();
    const int copies = static_cast<int>(std::clamp<size_t>((min_total_bytes + 2 * bytes - 1) / (2 * bytes), 1, 64));
    for (int c = 0; c < copies; ++c) {
      void *pk, *pv;
      CK(cudaMalloc(&pk, bytes));
      CK(cudaMalloc(&pv, bytes));
      fill(pk, bytes, 17 + c, dt == KvDtype::bf16);
      fill(pv, bytes, 91 + c, dt == KvDtype::bf16);
      k.push_back(pk);
      v.push_back(pv);
      if (kv_dtype_per_token_head(dt)) {
        ks.push_back(alloc_scales(L.scale_bytes() / 4, 23 + c));
        vs.push_back(alloc_scales(L.scale_bytes() / 4, 57 + c));
      }
    }
    std::vector<int32_t> bt(static_cast<size_t>(batch) * max_blocks);
    std::iota(bt.begin(), bt.end(), 0);
    std::mt19937 rng(5);
    std::shuffle(bt.begin(), bt.end(), rng);  // pages scattered as in a live pool
    CK(cudaMalloc(&block_tables, bt.size() * 4));
    CK(cudaMemcpy(block_tables, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> cl(batch, ctx);
    CK(cudaMalloc(&ctx_lens, cl.size() * 4));
    CK(cudaMemcpy(ctx_lens, cl.data(), cl.size() * 4, cudaMemcpyHostToDevice));
  }
  ~CacheSet() {
    for (void* p : k) cudaFree(p);
    for (void* p : v) cudaFree(p);
    for (float* p : ks) cudaFree(p);
    for (float* p : vs) cudaFree(p);
    cudaFree(block_tables);
    cudaFree(ctx_lens);
  }
  PagedKv paged(int i, const float* scales) const {
    PagedKv p;
    p.layout = L;
    p.k_cache = k[i % k.size()];
    p.v_cache = v[i % v.size()];
    p.block_tables = block_tables;
    p.max_blocks_per_seq = max_blocks;
    p.context_lens = ctx_lens;
    p.k_scale = {scales, 1};
    p.v_scale = {scales + 1, 1};
    if (!ks.empty()) {
      p.k_scale_pth = ks[i % ks.size()];
      p.v_scale_pth = vs[i % vs.size()];
    }
    return p;
  }
};

// One decode configuration; split_tokens 0: plan_decode's choice.
void bench_decode_one(double copy_gbs, const float* scales, KvDtype dt, int H, int Hkv, int D, int B, int C,
                      int split_tokens, const char* kind, int ctas_per_sm = 0) {
  CacheSet cs(dt, B, C, size_t(1) << 30, Hkv, D);
  void *q, *out, *ws;
  CK(cudaMalloc(&q, size_t(B) * H * D * 2));
  CK(cudaMalloc(&out, size_t(B) * H * D * 2));
  fill(q, size_t(B) * H * D * 2, 3, true);
  DecodeArgs a;
  a.batch = B;
  a.num_heads = H;
  a.max_context_len = C;
  a.softmax_scale = 1.0f / std::sqrt(float(D));
  a.q = q;
  a.q_dtype = ActDtype::bf16;
  a.out = out;
  a.out_dtype = ActDtype::bf16;
  a.plan = plan_decode(B, H, Hkv, D, C, 0, device_sm_count(), split_tokens, ctas_per_sm, dt);
  CK(cudaMalloc(&ws, std::max<size_t>(a.plan.workspace_bytes, 16)));
  a.workspace = ws;
  // (Per-token-head: the scales' bytes too.)
  const double kv_bytes = 2.0 * B * C * Hkv * (D * kv_dtype_bytes(dt) + (kv_dtype_per_token_head(dt) ? 4 : 0));
  const int reps = kv_bytes > 4e9 ? 10 : 30;
  auto launch = [&](int i) { a.kv = cs.paged(i, scales); paged_decode(a, nullptr); };
  // Warm-up of >= FP8KV_BENCH_WARMUP_MS (default 150) ms of this very launch
  // before timing (decode v8: after 3 warm-ups, the first row of a fresh
  // process ran up to 10% slower than the same row later in a process; run
  // K1). tools/bench_sdpa.py gives SDPA's rows the same warm-up.
  {
    const char* e = std::getenv("FP8KV_BENCH_WARMUP_MS");
    const float warm_ms = e && *e ? static_cast<float>(std::atof(e)) : 150.0f;
    cudaEvent_t w0, w1;
    CK(cudaEventCreate(&w0));
    CK(cudaEventCreate(&w1));
    CK(cudaEventRecord(w0));
    for (int i = 0;;) {
      for (int k = 0; k < 8; ++k) launch(i++);
      CK(cudaEventRecord(w1));
      CK(cudaEventSynchronize(w1));
      float el = 0;
      CK(cudaEventElapsedTime(&el, w0, w1));
      if (el >= warm_ms) break;
    }
    CK(cudaEventDestroy(w0));
    CK(cudaEventDestroy(w1));
  }
  const double ms = median_ms(launch, 3, reps);
  double host_us = 0;
  const double ms_stream = stream_median_ms(launch, 3 + reps, reps, &host_us);
  const double gbs = kv_bytes / (ms * 1e-3) / 1e9, gbs_stream = kv_bytes / (ms_stream * 1e-3) / 1e9;
  std::printf("{\"kind\":\"%s\",\"dtype\":\"%s\",\"d\":%d,\"heads\":%d,\"batch\":%d,\"ctx\":%d,\"ms\":%.4f,"
              "\"kv_bytes\":%.0f,\"GBps\":%.1f,\"frac_copy\":%.3f,\"split_tokens\":%d,\"splits\":%d,\"copies\":%zu,"
              "\"ctas_per_sm\":%d,\"ms_stream\":%.4f,\"GBps_stream\":%.1f,\"frac_copy_stream\":%.3f,\"host_us\":%.1f}\n",
              kind, std::string(kv_dtype_name(dt)).c_str(), D, H, B, C, ms, kv_bytes, gbs, gbs / copy_gbs,
              a.plan.split_tokens, a.plan.max_splits, cs.k.size(), ctas_per_sm, ms_stream, gbs_stream,
              g_copy_stream_gbs > 0 ? gbs_stream / g_copy_stream_gbs : 0.0, host_us);
  std::fflush(stdout);
  CK(cudaFree(q));
  CK(cudaFree(out));
  CK(cudaFree(ws));
}

void bench_decode(double copy_gbs, const float* scales, bool d256, bool d128 = true) {
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    if (d128)
      for (int B : {1, 8, 32, 64})
        for (int C : {1024, 4096, 16384, 65536}) bench_decode_one(copy_gbs, scales, dt, kH, kHkv, kD, B, C, 0, "decode");
    if (!d256) continue;
    for (int B : {1, 8, 32})
      for (int C : {16384, 65536}) bench_decode_one(copy_gbs, scales, dt, 16, 8, 256, B, C, 0, "decode");
  }
}

void bench_splits(double copy_gbs, const float* scales) {
  const int shapes[][2] = {{1, 65536}, {1, 16384}, {8, 16384}, {32, 16384}};
  for (const auto& bc : shapes)
    for (int st : {512, 1024, 2048, 4096, 8192})
      bench_decode_one(copy_gbs, scales, KvDtype::fp8_e4m3, kH, kHkv, kD, bc[0], bc[1], st, "split");
  // bf16 at B=64, short context (the bf16 >= 0.95x SDPA gap after version 5).
  for (int C : {1024, 4096})
    for (int st : {256, 512, 1024, 2048, 4096})
      if (st <= C) bench_decode_one(copy_gbs, scales, KvDtype::bf16, kH, kHkv, kD, 64, C, st, "split");
  // bf16 B=32/4K and B=8/16K (version 7: the plan's bandwidth term moves them).
  for (int st : {1024, 2048, 4096}) bench_decode_one(copy_gbs, scales, KvDtype::bf16, kH, kHkv, kD, 32, 4096, st, "split");
  for (int st : {2048, 4096, 8192}) bench_decode_one(copy_gbs, scales, KvDtype::bf16, kH, kHkv, kD, 8, 16384, st, "split");
}

// The auto plan at several assumed resident CTAs per SM (plan_decode's
// ctas_per_sm; 0 in the decode rows = the occupancy API). Values from
// FP8KV_BENCH_CTAS (comma list, default "2,4").
void bench_plans(double copy_gbs, const float* scales) {
  std::vector<int> cps;
  const char* env = std::getenv("FP8KV_BENCH_CTAS");
  std::string list = env && *env ? env : "2,4";
  for (size_t pos = 0; pos < list.size();) {
    const size_t end = std::min(list.find(',', pos), list.size());
    const int v = std::atoi(list.substr(pos, end - pos).c_str());
    if (v > 0) cps.push_back(v);
    pos = end + 1;
  }
  struct Shape { KvDtype dt; int H, Hkv, D, B, C; };
  const Shape shapes[] = {
      {KvDtype::fp8_e4m3, kH, kHkv, kD, 1, 65536},  {KvDtype::fp8_e4m3, kH, kHkv, kD, 8, 16384},
      {KvDtype::fp8_e4m3, kH, kHkv, kD, 8, 65536},  {KvDtype::fp8_e4m3, kH, kHkv, kD, 32, 16384},
      {KvDtype::fp8_e4m3, kH, kHkv, kD, 64, 16384}, {KvDtype::bf16, kH, kHkv, kD, 32, 4096},
      {KvDtype::bf16, kH, kHkv, kD, 64, 1024},      {KvDtype::bf16, kH, kHkv, kD, 64, 4096},
      {KvDtype::fp8_e4m3, 16, 8, 256, 1, 65536},    {KvDtype::fp8_e4m3, 16, 8, 256, 8, 16384},
      {KvDtype::fp8_e4m3, 16, 8, 256, 32, 16384},
  };
  for (const Shape& s : shapes)
    for (int c : cps) bench_decode_one(copy_gbs, scales, s.dt, s.H, s.Hkv, s.D, s.B, s.C, 0, "plan", c);
}

// 8K causal prefill, each cache dtype (the kernel is the plan's:
// prefill_plan.h): head_dim 128 with 32 / 8 heads (Llama-3-8B), or head_dim
// 256 with 24 / 4 (Qwen3.5-27B's full_attention layers).
void bench_prefill(const float* scales, int D = kD, int H = kH, int Hkv = kHkv) {
  const int S = 8192;
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2, KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    CacheSet cs(dt, 1, S, size_t(256) << 20, Hkv, D);
    void *q, *out;
    int32_t* qs;
    CK(cudaMalloc(&q, size_t(S) * H * D * 2));
    CK(cudaMalloc(&out, size_t(S) * H * D * 2));
    fill(q, size_t(S) * H * D * 2, 7, true);
    const int32_t qs_h[2] = {0, S};
    CK(cudaMalloc(&qs, 8));
    CK(cudaMemcpy(qs, qs_h, 8, cudaMemcpyHostToDevice));
    PrefillArgs a;
    a.batch = 1;
    a.num_heads = H;
    a.max_query_len = S;
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.q_start = qs;
    a.q = q;
    a.q_dtype = ActDtype::bf16;
    a.out = out;
    a.out_dtype = ActDtype::bf16;
    const double ms = median_ms([&](int i) { a.kv = cs.paged(i, scales); paged_prefill(a, nullptr); }, 3, 20);
    const double flops = 4.0 * H * D * (double(S) * (S + 1) / 2);
    const char* kernel = prefill_plan(D, dt).path == PrefillPath::wgmma_ws ? "wgmma_ws" : "mma";
    std::printf("{\"kind\":\"prefill\",\"dtype\":\"%s\",\"kernel\":\"%s\",\"head_dim\":%d,\"seq\":%d,\"ms\":%.4f,"
                "\"TFLOPs\":%.1f}\n",
                std::string(kv_dtype_name(dt)).c_str(), kernel, D, S, ms, flops / (ms * 1e-3) / 1e12);
    std::fflush(stdout);
    CK(cudaFree(q));
    CK(cudaFree(out));
    CK(cudaFree(qs));
  }
}

void bench_store(const float* scales) {
  const int T = 65536;
  const size_t in_bytes = size_t(T) * kHkv * kD * 2;
  void *k, *v;
  int64_t* slots;
  CK(cudaMalloc(&k, in_bytes));
  CK(cudaMalloc(&v, in_bytes));
  fill(k, in_bytes, 11, true);
  fill(v, in_bytes, 12, true);
  std::vector<int64_t> sl(T);
  std::iota(sl.begin(), sl.end(), 0);
  std::mt19937 rng(9);
  // Whole blocks in shuffled order (a prefill writes runs of 16 slots).
  std::vector<int64_t> blocks(T / kBlock);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (int t = 0; t < T; ++t) sl[t] = blocks[t / kBlock] * kBlock + t % kBlock;
  CK(cudaMalloc(&slots, T * 8));
  CK(cudaMemcpy(slots, sl.data(), T * 8, cudaMemcpyHostToDevice));
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::fp8_e4m3_pth, KvDtype::int8_pth}) {
    KvCacheLayout L{.num_blocks = T / kBlock, .block_size = kBlock, .num_kv_heads = kHkv, .head_dim = kD, .dtype = dt};
    void *kc, *vc;
    CK(cudaMalloc(&kc, L.cache_bytes()));
    CK(cudaMalloc(&vc, L.cache_bytes()));
    float* ksp = kv_dtype_per_token_head(dt) ? alloc_scales(L.scale_bytes() / 4, 1) : nullptr;
    float* vsp = kv_dtype_per_token_head(dt) ? alloc_scales(L.scale_bytes() / 4, 2) : nullptr;
    StoreKvArgs a;
    a.layout = L;
    a.k_cache = kc;
    a.v_cache = vc;
    a.k = k;
    a.v = v;
    a.input_dtype = ActDtype::bf16;
    a.slot_mapping = slots;
    a.num_tokens = T;
    a.k_scale = {scales, 1};
    a.v_scale = {scales + 1, 1};
    a.k_scale_pth = ksp;
    a.v_scale_pth = vsp;
    const double ms = median_ms([&](int) { store_kv(a, nullptr); }, 3, 30);
    const double bytes = 2.0 * in_bytes + 2.0 * L.cache_bytes() + 2.0 * L.scale_bytes() + T * 8.0;
    std::printf("{\"kind\":\"store\",\"dtype\":\"%s\",\"tokens\":%d,\"ms\":%.4f,\"GBps\":%.1f}\n",
                std::string(kv_dtype_name(dt)).c_str(), T, ms, bytes / (ms * 1e-3) / 1e9);
    std::fflush(stdout);
    CK(cudaFree(kc));
    CK(cudaFree(vc));
    if (ksp) CK(cudaFree(ksp));
    if (vsp) CK(cudaFree(vsp));
  }
  CK(cudaFree(k));
  CK(cudaFree(v));
  CK(cudaFree(slots));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "all";
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  float* scales;
  const float hs[2] = {0.05f, 0.03f};
  CK(cudaMalloc(&scales, 8));
  CK(cudaMemcpy(scales, hs, 8, cudaMemcpyHostToDevice));
  const double copy_gbs = bench_copy();
  if (only == "all" || only == "store") bench_store(scales);
  if (only == "read" || only == "read-sweep") bench_read(only == "read-sweep");

  if (only == "prefill") bench_prefill(scales);
  if (only == "prefill256") bench_prefill(scales, 256, 24, 4);

  if (only == "all" || only == "decode" || only == "decode128") bench_decode(copy_gbs, scales, only != "decode128");
  if (only == "decode256") bench_decode(copy_gbs, scales, true, false);
  // probe: the bf16 rows whose time moved 12% between the decode and plan
  // phases of run G (same plan), first thing in a fresh process, twice.
  // Between the two passes the largest bf16 row (B=32/64K, 8.6 GB of caches
  // allocated, read 13 times, freed), as in the decode phase before B=64.
  if (only == "probe") {
    const int shapes[][2] = {{64, 4096}, {32, 4096}, {64, 1024}};
    for (int rep = 0; rep < 2; ++rep) {
      for (const auto& bc : shapes)
        bench_decode_one(copy_gbs, scales, KvDtype::bf16, kH, kHkv, kD, bc[0], bc[1], 0, "probe");
      if (rep == 0) bench_decode_one(copy_gbs, scales, KvDtype::bf16, kH, kHkv, kD, 32, 65536, 0, "probe");
    }
  }
  if (only == "all" || only == "plans") bench_plans(copy_gbs, scales);
  if (only == "all" || only == "splits") bench_splits(copy_gbs, scales);
  // shape DTYPE D B CTX [SPLIT]: one decode row at the auto plan, or with
  // SPLIT-key splits (a multiple of 64; decode v9's plan rows), for a
  // profiler too (ncu in scripts/gpu_decode.sh).
  if (only == "shape") {
    if (argc != 6 && argc != 7) {
      std::fprintf(stderr,
                   "usage: bench_attention shape bf16|fp8_e4m3|fp8_e5m2|fp8_per_token_head|int8_per_token_head D B CTX "
                   "[SPLIT]\n");
      return 2;
    }
    const int split = argc == 7 ? std::atoi(argv[6]) : 0;
    if (argc == 7 && (split <= 0 || split % 64 != 0)) {
      std::fprintf(stderr, "bench_attention shape: SPLIT must be a positive multiple of 64, got '%s'\n", argv[6]);
      return 2;
    }
    const std::string dts = argv[2];
    KvDtype dt = KvDtype::fp8_e4m3;
    bool dt_ok = true;
    try {
      dt = parse_kv_dtype(dts);
    } catch (const std::invalid_argument&) {
      dt_ok = false;
    }
    const int D = std::atoi(argv[3]), B = std::atoi(argv[4]), C = std::atoi(argv[5]);
    if (!dt_ok || (D != 64 && D != 128 && D != 256) || B <= 0 || C <= 0) {
      std::fprintf(stderr, "bench_attention shape: bad dtype/D/B/CTX\n");
      return 2;
    }
    bench_decode_one(copy_gbs, scales, dt, D == 256 ? 16 : kH, kHkv, D, B, C, split, split > 0 ? "split" : "decode");
  }
  // Last in "all": a fault in a new prefill kernel must not cost the decode rows.
  if (only == "all") bench_prefill(scales);
  CK(cudaFree(scales));
  return 0;
}
