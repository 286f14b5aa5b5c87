// CUDA kernels for the paged fp8/bf16 KV cache (sm_90a): store, decode
// attention (split-K, GQA-aware), prefill / chunked-prefill attention.
//
// Plain C++ API: device pointers, a cudaStream_t, no templates. Every function
// checks its arguments and throws std::invalid_argument (bad shape/config) or
// std::runtime_error (CUDA error, with the call and file:line).
//
// Numerics match the CPU reference (backend/cpu/kv_ops.h):
//  - store: fp8 = saturate(rne(x / scale)) with an IEEE fp32 division (no
//    reciprocal) -> the bytes are identical to store_kv_cpu's; bf16 = rne(x).
//  - attention reads K/V back from the cache; scores use
//    softmax_scale * k_scale, the output is multiplied by v_scale once.
//    Tensor-core operands: fp8 caches run f16 MMAs (fp8 -> f16 is exact, Q and
//    P rounded to f16), bf16 caches run bf16 MMAs (Q and P rounded to bf16);
//    accumulation is fp32. docs/cuda.md derives the resulting tolerances.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kv/layout.h"

namespace fp8kv::cuda {

// Element type of activations (Q, K/V inputs, outputs).
enum class ActDtype : uint8_t { f32 = 0, bf16 = 1 };

// Scales on the device: per tensor (count 1) or one per head. Ignored for
// bf16 caches. Finite and > 0 (the caller validated them on the host).
struct DeviceScales {
  const float* values = nullptr;
  int count = 1;
};

// ---- store ---------------------------------------------------------------

struct StoreKvArgs {
  KvCacheLayout layout;
  void* k_cache = nullptr;  // [num_blocks][block_size][num_kv_heads][head_dim], layout.dtype
  void* v_cache = nullptr;
  const void* k = nullptr;  // [num_tokens][num_kv_heads][head_dim], input_dtype
  const void* v = nullptr;
  ActDtype input_dtype = ActDtype::f32;
  const int64_t* slot_mapping = nullptr;  // [num_tokens]; < 0: skip the token
  int num_tokens = 0;
  DeviceScales k_scale, v_scale;  // per tensor or [num_kv_heads] (per-tensor-scaled fp8 only)
  // Per-token-head dtypes: [num_blocks][block_size][num_kv_heads] f32, written
  // (layout.scale_offset(slot, head)); null for the other dtypes.
  float* k_scale_pth = nullptr;
  float* v_scale_pth = nullptr;
  // Optional observation at the store point (calibration): running absmax per
  // head, max-ed into these device arrays (NaN inputs ignored). Null: off.
  float* k_absmax = nullptr;  // [num_kv_heads]
  float* v_absmax = nullptr;  // [num_kv_heads]
  const void* q = nullptr;    // [num_tokens][num_q_heads][head_dim], input_dtype
  int num_q_heads = 0;
  float* q_absmax = nullptr;  // [num_q_heads]
  // Per-tensor-scaled fp8 only: the elements whose quotient x / scale is
  // beyond the format's max finite (stored as +-max; docs/robustness.md
  // "KV clipping") are added here, [0] K and [1] V, one atomic per warp that
  // saw any. Null: not counted.
  unsigned long long* clips = nullptr;
};
void store_kv(const StoreKvArgs& args, cudaStream_t stream);

// ---- paged attention (shared by decode and prefill) ----------------------

struct PagedKv {
  KvCacheLayout layout;  // block_size must be a multiple of 16; head_dim 64, 128 or 256
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_tables = nullptr;  // [batch][max_blocks_per_seq], physical block ids
  int max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr;  // [batch]: keys at positions [0, context_len)
  DeviceScales k_scale, v_scale;          // per tensor or [num_kv_heads] (per-tensor-scaled fp8 only)
  // Per-token-head dtypes: [num_blocks][block_size][num_kv_heads] f32 (layout.scale_offset).
  const float* k_scale_pth = nullptr;
  const float* v_scale_pth = nullptr;
};

// ---- decode: one query per sequence, at position context_len - 1 ----------

struct DecodePlan {
  int split_tokens = 0;  // keys per split (multiple of 64)
  int max_splits = 1;    // grid size along the split axis
  size_t workspace_bytes = 0;
};

// Chooses the split size to fill the GPU (split_tokens = 0) or uses the given
// one (rounded up to a multiple of 64). The partition of one sequence depends
// only on its own length, window and split_tokens, so a batched launch gives
// bitwise the same result as launching each sequence alone with that plan.
// ctas_per_sm: resident CTAs per SM the plan assumes; 0 = the occupancy of the
// decode kernel for `dtype` on this device (the default; other values are for
// tuning sweeps in bench_attention). dtype: the cache's (bf16 d256 holds half
// the CTAs per SM of fp8 d256); callers that omit it get the fp8 e4m3 plan.
DecodePlan plan_decode(int batch, int num_heads, int num_kv_heads, int head_dim, int max_context_len,
                       int window, int num_sms, int split_tokens = 0, int ctas_per_sm = 0,
                       KvDtype dtype = KvDtype::fp8_e4m3);

struct DecodeArgs {
  PagedKv kv;
  int batch = 0;
  int num_heads = 0;
  int max_context_len = 0;  // host-side upper bound of context_lens (the plan's)
  int window = 0;           // 0: full; else key j visible iff (context_len-1) - j < window
  float softmax_scale = 1.0f;
  float logit_softcap = 0.0f;
  const void* q = nullptr;  // [batch][num_heads][head_dim]
  ActDtype q_dtype = ActDtype::f32;
  void* out = nullptr;      // [batch][num_heads][head_dim]
  ActDtype out_dtype = ActDtype::f32;
  DecodePlan plan;
  void* workspace = nullptr;  // plan.workspace_bytes, device
};
// Runs the kernel of the decode plan table (attention/decode_plan.h) for the
// layout's (head_dim, dtype), then, when the plan has several splits, the
// split combine.
void paged_decode(const DecodeArgs& args, cudaStream_t stream);

// ---- prefill / chunked prefill --------------------------------------------
// The kernel per (head_dim, cache dtype) is the plan's (prefill_plan.h):
// wgmma (warp-specialized, persistent) at head_dim 128 and 256, mma.sync at 64.

// Sequence b's queries are rows [q_start[b], q_start[b+1]) of q, at positions
// [context_len - n, context_len), n = q_start[b+1] - q_start[b]; their K/V
// are already stored in the cache. Causal, optional sliding window.
struct PrefillArgs {
  PagedKv kv;
  int batch = 0;
  int num_heads = 0;
  int max_query_len = 0;  // host-side upper bound of the per-sequence query counts
  int window = 0;
  float softmax_scale = 1.0f;
  float logit_softcap = 0.0f;
  const int32_t* q_start = nullptr;  // [batch + 1], device
  const void* q = nullptr;           // [total_q][num_heads][head_dim]
  ActDtype q_dtype = ActDtype::f32;
  void* out = nullptr;               // [total_q][num_heads][head_dim]
  ActDtype out_dtype = ActDtype::f32;
};
void paged_prefill(const PrefillArgs& args, cudaStream_t stream);
// Tests only: caps the head_dim-128 (persistent) kernel's grid at max_ctas
// CTAs for later paged_prefill calls of this process, so that each CTA walks
// many work items; 0: back to one CTA per SM. The result does not depend on
// the grid (each item is computed by one CTA alone).
void set_prefill_max_ctas_for_tests(int max_ctas);

// Number of SMs of the current device (cached), for plan_decode.
int device_sm_count();

}  // namespace fp8kv::cuda
