// CPU reference for the paged KV cache: the store (quantize on write) and
// paged attention (reads K/V back from the cache). Every CUDA kernel is
// checked against these. Math in fp32, fixed reduction order (results do not
// depend on the thread count).
#pragma once
#include <cstdint>

#include "backend/kv_clips.h"
#include "backend/store_observer.h"  // StoreObserver (moved there; kept visible here)
#include "kv/layout.h"

namespace fp8kv {

// Writes num_tokens tokens of K and V ([T][num_kv_heads][head_dim], fp32)
// into the caches at slot_mapping[t] (skipped when < 0). fp8 caches store
// saturate(rne(x / scale)); bf16 caches store bf16(x) and ignore the scales.
// Per-token-head dtypes ignore k_scale / v_scale: each (token, KV head) gets
// s = per_token_head_scale(x) written to k_scale_pth / v_scale_pth at
// layout.scale_offset(slot, head) (null for the other dtypes), and stores the
// same saturating conversion of x / s.
//
// clips (optional) gets the call's saturation count added (docs/robustness.md
// "KV clipping"): per stream, the elements whose y = x / scale has |y| beyond
// the format's max finite M (448 e4m3, 57344 e5m2), so that the stored code
// is +-M instead of y, inf inputs included, NaN not; `stored` gets the
// elements stored per stream. Only the per-tensor-scaled fp8 dtypes
// (fp8_e4m3, fp8_e5m2) can clip: bf16 has no scale, and a per-token-head
// scale maps each vector's peak to M, so their count is 0. Counting does not
// change a stored byte.
void store_kv_cpu(const KvCacheLayout& layout, void* k_cache, void* v_cache, const float* k, const float* v,
                  const int64_t* slot_mapping, int num_tokens, ScaleRef k_scale, ScaleRef v_scale,
                  float* k_scale_pth = nullptr, float* v_scale_pth = nullptr, KvClipCounts* clips = nullptr);

struct PagedAttentionArgs {
  KvCacheLayout layout;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* block_table = nullptr;  // logical block -> physical block (-1: freed, never read)
  int context_len = 0;                   // keys at positions [0, context_len)
  int window = 0;                        // 0: full attention; else key j visible from i iff i - j < window
  float softmax_scale = 1.0f;
  float logit_softcap = 0.0f;            // 0: none; else s = cap * tanh(s / cap)
  ScaleRef k_scale;                      // per tensor or per KV head (ignored for bf16 and per-token-head)
  ScaleRef v_scale;
  // Per-token-head dtypes: [num_blocks][block_size][num_kv_heads] f32 (layout.scale_offset).
  const float* k_scale_pth = nullptr;
  const float* v_scale_pth = nullptr;
  // Optional fp8 Q (the fp8-MMA kernel path): q is quantized to the cache's
  // fp8 format with q_scale, scores use softmax_scale * k_scale * q_scale.
  bool quantize_q = false;
  ScaleRef q_scale;                      // per tensor or per query head
};

// Causal paged attention for one sequence. q: [num_q][num_heads][head_dim],
// q_pos[i]: absolute position of query i (keys at positions <= q_pos[i] are
// visible, within the window). out: [num_q][num_heads][head_dim].
// Scales are folded: scores use softmax_scale * k_scale, the output is
// multiplied by v_scale once at the end. Per-token-head: score_j = dot(q, kq_j)
// * ks_j * softmax_scale (then the softcap), acc += (p_j * vs_j) * vq_j, l += p_j.
void paged_attention_cpu(const PagedAttentionArgs& args, const float* q, const int32_t* q_pos, int num_q,
                         int num_heads, float* out);

// Reads one stored element back as float (dequantized without the scale).
float load_cache_elem(const KvCacheLayout& layout, const void* cache, int64_t elem_offset);

}  // namespace fp8kv
