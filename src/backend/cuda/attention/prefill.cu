// paged_prefill: checks the arguments and launches the kernel that the plan
// (prefill_plan.h) gives the case: prefill_ws.cu (wgmma, head_dim 128 and 256) or
// prefill_mma.cu (mma.sync, head_dim 64).
#include <stdexcept>
#include <string>

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/attention/prefill_plan.h"

namespace fp8kv::cuda {

void paged_prefill(const PrefillArgs& a, cudaStream_t stream) {
  const KvCacheLayout& L = a.kv.layout;
  if (L.head_dim != 64 && L.head_dim != 128 && L.head_dim != 256)
    throw std::invalid_argument("paged_prefill: head_dim must be 64, 128 or 256, got " + std::to_string(L.head_dim));
  if (L.block_size <= 0 || L.block_size % 16 != 0)
    throw std::invalid_argument("paged_prefill: block_size must be a multiple of 16, got " + std::to_string(L.block_size));
  if (a.num_heads <= 0 || L.num_kv_heads <= 0 || a.num_heads % L.num_kv_heads != 0)
    throw std::invalid_argument("paged_prefill: num_heads must be a multiple of num_kv_heads");
  if (a.batch <= 0 || a.max_query_len <= 0) return;
  if (!a.q || !a.out || !a.q_start || !a.kv.k_cache || !a.kv.v_cache || !a.kv.block_tables || !a.kv.context_lens)
    throw std::invalid_argument("paged_prefill: null pointer argument");
  if (kv_dtype_per_tensor_scaled(L.dtype) && (!a.kv.k_scale.values || !a.kv.v_scale.values))
    throw std::invalid_argument("paged_prefill: fp8 cache needs k/v scales");
  if (kv_dtype_per_token_head(L.dtype) && (!a.kv.k_scale_pth || !a.kv.v_scale_pth))
    throw std::invalid_argument("paged_prefill: a per-token-head cache needs k_scale_pth / v_scale_pth");
  switch (prefill_plan(L.head_dim, L.dtype).path) {
    case PrefillPath::wgmma_ws: launch_prefill_ws(a, stream); break;
    case PrefillPath::mma: launch_prefill_mma(a, stream); break;
  }
}

}  // namespace fp8kv::cuda
