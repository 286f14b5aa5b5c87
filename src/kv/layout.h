// Paged KV cache layout (docs/design.md "Paged KV cache and capacity"). Per attention layer, K and V caches are
// [num_blocks][block_size][num_kv_heads][head_dim] in the cache dtype.
// A token's slot is block * block_size + offset; the slot mapping gives, for
// each token being stored, its slot (or -1 to skip the token).
// Per-token-head dtypes (kv_dtype_per_token_head) add, per layer, one f32 scale
// array for K and one for V beside the caches: [num_blocks][block_size][num_kv_heads].
#pragma once
#include <cstddef>
#include <cstdint>

#include "numerics/fp8.h"

namespace fp8kv {

struct KvCacheLayout {
  int num_blocks = 0;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::bf16;

  // Strides in elements.
  int64_t head_stride() const { return head_dim; }
  int64_t token_stride() const { return static_cast<int64_t>(num_kv_heads) * head_dim; }
  int64_t block_stride() const { return token_stride() * block_size; }
  size_t elem_bytes() const { return static_cast<size_t>(kv_dtype_bytes(dtype)); }
  // Bytes of one block of K (or V) for one layer.
  size_t block_bytes() const { return static_cast<size_t>(block_stride()) * elem_bytes(); }
  size_t cache_bytes() const { return block_bytes() * static_cast<size_t>(num_blocks); }
  // Element offset of (slot, kv_head, 0).
  int64_t slot_offset(int64_t slot, int kv_head) const {
    const int64_t block = slot / block_size, off = slot % block_size;
    return block * block_stride() + off * token_stride() + static_cast<int64_t>(kv_head) * head_dim;
  }
  // Per-token-head dtypes: index of (slot, kv_head)'s f32 scale in k_scale / v_scale.
  int64_t scale_offset(int64_t slot, int kv_head) const { return slot * num_kv_heads + kv_head; }
  // Bytes of one block's K (or V) scales for one layer: block_size * num_kv_heads * 4
  // for the per-token-head dtypes (4 / head_dim of block_bytes), 0 for the others.
  size_t scale_block_bytes() const {
    return kv_dtype_per_token_head(dtype) ? static_cast<size_t>(block_size) * num_kv_heads * sizeof(float) : 0;
  }
  size_t scale_bytes() const { return scale_block_bytes() * static_cast<size_t>(num_blocks); }
};

// Scales as the kernels take them: per tensor (count 1) or per head (count =
// number of heads). Always finite and > 0.
struct ScaleRef {
  const float* values = nullptr;
  int count = 1;
  float at(int head) const { return count == 1 ? values[0] : values[head]; }
};

}  // namespace fp8kv
