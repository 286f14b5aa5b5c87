// Device helpers shared by the CUDA kernels: error checks, MMA wrappers,
// fp8 / bf16 / f16 packing. Small on purpose (compile time).
#pragma once
#include <cuda.h>  // CUtensorMap (encode_row_tensor_map fetches the encoder at run time: no libcuda link)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/attention/attention.h"

#define FP8KV_CUDA_CHECK(call)                                                                       \
  do {                                                                                               \
    const cudaError_t err_ = (call);                                                                 \
    if (err_ != cudaSuccess)                                                                         \
      throw std::runtime_error(std::string(#call) + " failed at " + __FILE__ + ":" +                \
                               std::to_string(__LINE__) + ": " + cudaGetErrorString(err_) +          \
                               " (hint: run the failing test under compute-sanitizer)");             \
  } while (0)

namespace fp8kv::cuda::detail {

// Sets a kernel attribute (cudaFuncSetAttribute) once per (kernel, attribute,
// value, device), the device being the calling thread's current one
// (cudaGetDevice). Kernel attributes are per device: the engine runs TP ranks
// as threads of one process, one GPU each, so a per-process "once" (a
// function-local static) leaves every GPU but the first without them (a
// launch asking for > 48 KB of dynamic shared memory then fails there).
// Thread-safe: a process-wide set under a mutex; each thread also remembers
// what it has seen, so the steady state (every launch) takes no lock.
inline void set_func_attribute_once(const void* func, cudaFuncAttribute attr, int value) {
  int dev = 0;
  FP8KV_CUDA_CHECK(cudaGetDevice(&dev));
  using Key = std::tuple<const void*, int, int, int>;
  const Key key{func, static_cast<int>(attr), value, dev};
  thread_local std::vector<Key> seen;  // this thread's fast path
  if (std::find(seen.begin(), seen.end(), key) != seen.end()) return;
  static std::mutex mu;
  static std::vector<Key> done;
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (std::find(done.begin(), done.end(), key) == done.end()) {
      FP8KV_CUDA_CHECK(cudaFuncSetAttribute(func, attr, value));  // throws: not recorded, retried next call
      done.push_back(key);
    }
  }
  seen.push_back(key);
}
template <class Kernel>
inline void set_func_attribute_once(Kernel* func, cudaFuncAttribute attr, int value) {
  set_func_attribute_once(reinterpret_cast<const void*>(func), attr, value);
}

// Cache element codes used as template parameters (= KvDtype values).
// kE4m3Pth / kI8Pth: the per-token-head dtypes (e4m3 / int8 elements, one f32
// scale per (token, KV head) beside the cache); as operands they are e4m3 /
// int8 codes converted exactly to f16.
constexpr int kBf16 = 0, kE4m3 = 1, kE5m2 = 2, kE4m3Pth = 3, kI8Pth = 4;
__host__ __device__ constexpr bool dt_pth(int DT) { return DT == kE4m3Pth || DT == kI8Pth; }
static_assert(kBf16 == static_cast<int>(KvDtype::bf16) && kE4m3 == static_cast<int>(KvDtype::fp8_e4m3) &&
                  kE5m2 == static_cast<int>(KvDtype::fp8_e5m2) &&
                  kE4m3Pth == static_cast<int>(KvDtype::fp8_e4m3_pth) && kI8Pth == static_cast<int>(KvDtype::int8_pth),
              "cache element codes = KvDtype values");

__device__ __forceinline__ float load_act(const void* p, int64_t i, bool bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_act(void* p, int64_t i, float x, bool bf16) {
  if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  else static_cast<float*>(p)[i] = x;
}

// Packs two floats into the MMA operand type: f16 for fp8 caches, bf16 for bf16.
template <int DT>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (DT == kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// Two fp8 (or int8) codes (low 16 bits of w: element 0 in the low byte) ->
// f16x2 (element 0 in the low half). Both fp8 formats and int8 are exact in f16.
template <int DT>
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t w) {
  if constexpr (DT == kE5m2) {
    // e5m2 is the high byte of an f16.
    return __byte_perm(w, 0u, 0x1404);
  } else if constexpr (DT == kI8Pth) {
    // int8 c -> the f16 1024 + (c + 128) (byte c ^ 0x80 under the exponent
    // byte 0x64: spacing 1 in [1024, 2048)), minus 1152: exact.
    const uint32_t h = __byte_perm(w ^ 0x8080u, 0x64646464u, 0x4140);
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x64806480u));
    return r;
  } else {
    uint32_t r;
    const uint16_t h = static_cast<uint16_t>(w);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(h));
    return r;
  }
}

// D(16x8, f32) += A(16x16) * B(16x8); A row-major, B column-major; operand
// type f16 (fp8 caches) or bf16 (bf16 caches).
template <int DT>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (DT == kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Read-only streaming 16-byte load (KV is read once per launch).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Loads N bytes (8, 16, 32 or 64) into N/4 words.
template <int N>
__device__ __forceinline__ void ld_words(const uint8_t* p, uint32_t* w) {
  if constexpr (N == 8) {
    const uint2 v = ld_stream8(p);
    w[0] = v.x; w[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < N / 16; ++i) {
      const uint4 v = ld_stream16(p + 16 * i);
      w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
    }
  }
}

// Shared-memory mbarriers (phase parity): the prefill wgmma kernels' rings
// and bench_attention's bulk-copy read kernel.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Waits until the phase with the given parity has completed (a fresh
// barrier counts its "previous" phase, parity 1, as completed).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!ok);
}
// Orders this thread's generic-proxy shared-memory accesses before later
// async-proxy ones: its writes (st.shared, cp.async) visible to wgmma, its
// reads done before a bulk copy overwrites the bytes.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// The transaction bytes this phase waits for, and this thread's arrival.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Orders this thread's mbarrier.init before the async proxy's use of it
// (the bulk copies' complete_tx).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Bulk copy (the TMA unit, no registers) of `bytes` (a multiple of 16, both
// addresses 16-byte aligned) from global to this CTA's shared memory; its
// completion counts `bytes` on the mbarrier `bar`.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src),
      "r"(bytes), "r"(bar)
      : "memory");
}

// Tensor copy (the TMA unit) of one box of the 2-D tensor map `tm` (a grid
// constant or global-memory map; its generic address) at element coordinates
// (x, y) to this CTA's shared memory; completion counts the box's bytes on
// the mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* tm, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(tm)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// The tensor map of `rows` rows of `row_bytes` bytes at `base` (a 2-D tensor
// of bytes), boxes of box_rows rows x box_bytes bytes, swizzled by 128 bytes
// when `swizzle128` (16-byte chunk c of box row y lands at chunk c ^ (y & 7);
// the destination must then be 1 KB-aligned). The driver's encoder is
// fetched once through the runtime (cudaGetDriverEntryPointByVersion), so
// nothing links libcuda. Returns false (with `why`) when the driver has no
// encoder or refuses the shape.
inline bool encode_row_tensor_map(CUtensorMap* out, const void* base, uint64_t row_bytes, uint64_t rows,
                                  uint32_t box_bytes, uint32_t box_rows, bool swizzle128, std::string* why) {
  static PFN_cuTensorMapEncodeTiled_v12000 enc = [] {
    PFN_cuTensorMapEncodeTiled_v12000 f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&f), 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return f;
  }();
  if (enc == nullptr) {
    if (why) *why = "cuTensorMapEncodeTiled not available";
    return false;
  }
  const cuuint64_t dims[2] = {row_bytes, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_bytes, box_rows}, elem[2] = {1, 1};
  const CUresult rc =
      enc(out, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, elem,
          CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
          CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    if (why) *why = "cuTensorMapEncodeTiled: error " + std::to_string(static_cast<int>(rc));
    return false;
  }
  return true;
}

constexpr float kLog2e = 1.4426950408889634f;

// Kernel parameters shared by decode and prefill (passed by value): the paged
// cache, the query/output tensors and the score options.
struct PagedKvParams {
  const void* q;
  void* out;
  bool q_bf16, out_bf16;
  const uint8_t* k_cache;
  const uint8_t* v_cache;
  const int32_t* block_tables;
  int max_blocks_per_seq;
  const int32_t* context_lens;
  const float* k_scale;  // null for bf16 caches
  const float* v_scale;
  int k_scale_count, v_scale_count;
  int num_heads, num_kv_heads, group, block_size, window;
  float softmax_scale, softcap;
};

// Fills the shared fields from the public arguments (validated by the caller).
template <class Args>
inline void fill_paged_params(PagedKvParams& p, const Args& a) {
  const KvCacheLayout& L = a.kv.layout;
  const bool fp8 = kv_dtype_per_tensor_scaled(L.dtype);  // per-token-head scales: the derived params' pth pointers
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
  p.block_size = L.block_size;
  p.window = a.window;
  p.softmax_scale = a.softmax_scale;
  p.softcap = a.logit_softcap;
}

// The prefill kernels' parameters (P: the per-token-head ones, which the
// others' kernels read as their base): the shared fields, the per-token-head
// scales, the query starts and the tiles of q_tile queries.
template <class P, class Args>
inline void fill_prefill_params(P& p, const Args& a, int q_tile) {
  fill_paged_params(p, a);
  p.k_scale_pth = a.kv.k_scale_pth;
  p.v_scale_pth = a.kv.v_scale_pth;
  p.q_start = a.q_start;
  p.num_q_tiles = (a.max_query_len + q_tile - 1) / q_tile;
}

}  // namespace fp8kv::cuda::detail
