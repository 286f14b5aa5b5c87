// Paged decode: the split plan (plan_decode) and the launch (paged_decode),
// both reading the plan table (decode_plan.h).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/attention/decode_common.cuh"

namespace fp8kv::cuda {
namespace {
using decode::kDecodePlan;
using decode::kMaxGroup;
using decode::kTile;
using decode::kWarps;

int span_tokens(int max_context_len, int window) {
  return window > 0 ? std::min(max_context_len, window + kTile - 1) : max_context_len;
}

// The plan table's row of a layout; throws when it has none.
int plan_row(int head_dim, KvDtype dtype) {
  const int row = decode::decode_plan_row(head_dim, dtype);
  if (row < 0)
    throw std::invalid_argument("decode: no kernel for head_dim " + std::to_string(head_dim) + " and dtype " +
                                std::string(kv_dtype_name(dtype)));
  return row;
}

// Number of splits by a wave model (docs/cuda.md). With `slots` CTAs
// resident at once on the GPU, a grid of base * n CTAs runs in
// ceil(base * n / slots) waves, each as long as one CTA: its split's tiles
// per warp (split / 64) plus a fixed cost kCtaOverheadTiles (prologue: Q load
// and the first tile's latency; epilogue: the 4-warp combine and partial
// write), plus kReduceTiles once when there is a reduce kernel. Fitted to a
// split sweep at B=1/16K (time ~ 12 us + 1.0 us per tile, overhead ~6
// tiles). Ties go to fewer splits (less reduce work).
constexpr int kCtaOverheadTiles = 6;
constexpr int kReduceTiles = 3;

int choose_split_tokens(int64_t base, int span, int64_t slots) {
  constexpr int kpu = kWarps * kTile;  // keys per tile unit of one CTA (4 warps take 16-key tiles in turn)
  const int64_t max_n = std::min<int64_t>((span + 63) / 64, std::max<int64_t>(1, (8 * slots + base - 1) / base));
  int best_split = (span + 63) / 64 * 64;
  int64_t best_cost = -1;
  for (int64_t n = 1; n <= max_n; ++n) {
    const int64_t split = ((span + n - 1) / n + 63) / 64 * 64;
    const int64_t n_eff = (span + split - 1) / split;
    if (n > 1 && split == best_split) continue;
    const int64_t waves = (base * n_eff + slots - 1) / slots;
    const int64_t cost = waves * (split / kpu + kCtaOverheadTiles) + (n_eff > 1 ? kReduceTiles : 0);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_split = static_cast<int>(split);
    }
  }
  return best_split;
}

// Workspace: partial outputs [batch][heads][splits][D] and log-sum-exps
// [batch][heads][splits] (floats).
size_t workspace_for(int batch, int num_heads, int max_splits, int head_dim) {
  return static_cast<size_t>(batch) * num_heads * max_splits * (head_dim + 1) * sizeof(float);
}

}  // namespace

DecodePlan plan_decode(int batch, int num_heads, int num_kv_heads, int head_dim, int max_context_len, int window,
                       int num_sms, int split_tokens, int ctas_per_sm, KvDtype dtype) {
  if (batch <= 0 || num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || max_context_len < 0)
    throw std::invalid_argument("plan_decode: bad shape (batch " + std::to_string(batch) + ", heads " +
                                std::to_string(num_heads) + "/" + std::to_string(num_kv_heads) + ")");
  const int span = std::max(1, span_tokens(max_context_len, window));
  const int gchunks = (num_heads / num_kv_heads + kMaxGroup - 1) / kMaxGroup;
  if (split_tokens <= 0) {
    // Fill every SM with its resident CTAs (occupancy API of the row's
    // kernel; 3 per SM when no device answers: fp8 d128 at 167 registers),
    // in as few and as full waves as the wave model above finds.
    const bool occupancy = ctas_per_sm <= 0;
    const int row = occupancy ? decode::decode_plan_row(head_dim, dtype) : -1;
    if (row >= 0) ctas_per_sm = decode::decode_resident_ctas(row, false);
    if (ctas_per_sm <= 0) ctas_per_sm = 3;
    const int64_t base = static_cast<int64_t>(batch) * num_kv_heads * gchunks;
    const int64_t slots = static_cast<int64_t>(std::max(1, num_sms)) * ctas_per_sm;
    split_tokens = choose_split_tokens(base, span, slots);
    // A row with a wide kernel (F4): a plan of more than one wave of the row's
    // kernel is made again for the wide kernel's occupancy, and runs it
    // (paged_decode: its grid exceeds one wave of the row's kernel).
    if (row >= 0 && kDecodePlan[row].wide != kDecodePlan[row].kernel) {
      const int wide_ctas = decode::decode_resident_ctas(row, true);
      if (wide_ctas > ctas_per_sm && base * ((span + split_tokens - 1) / split_tokens) > slots)
        split_tokens = choose_split_tokens(base, span, static_cast<int64_t>(std::max(1, num_sms)) * wide_ctas);
    }
  }
  DecodePlan plan;
  plan.split_tokens = (split_tokens + 63) / 64 * 64;
  plan.max_splits = (span + plan.split_tokens - 1) / plan.split_tokens;
  if (plan.max_splits > 1) plan.workspace_bytes = workspace_for(batch, num_heads, plan.max_splits, head_dim);
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
  if (kv_dtype_per_tensor_scaled(L.dtype) && (!a.kv.k_scale.values || !a.kv.v_scale.values))
    throw std::invalid_argument("paged_decode: fp8 cache needs k/v scales");
  if (kv_dtype_per_token_head(L.dtype) && (!a.kv.k_scale_pth || !a.kv.v_scale_pth))
    throw std::invalid_argument("paged_decode: a per-token-head cache needs k_scale_pth / v_scale_pth");
  const int row = plan_row(L.head_dim, L.dtype);
  decode::DecodePthParams p{};
  p.k_scale_pth = a.kv.k_scale_pth;
  p.v_scale_pth = a.kv.v_scale_pth;
  fill_paged_params(p, a);
  p.gchunks = (p.group + kMaxGroup - 1) / kMaxGroup;
  p.split_tokens = a.plan.split_tokens;
  p.max_splits = a.plan.max_splits;
  if (p.max_splits > 1) {
    p.part_o = static_cast<float*>(a.workspace);
    p.part_lse = p.part_o + static_cast<size_t>(a.batch) * a.num_heads * p.max_splits * L.head_dim;
  }
  const dim3 grid(L.num_kv_heads * p.gchunks, a.batch, p.max_splits);
  // The row's wide kernel (F4) for a grid of more than one wave of its kernel.
  bool wide = false;
  if (kDecodePlan[row].wide != kDecodePlan[row].kernel) {
    const int64_t ctas = static_cast<int64_t>(grid.x) * grid.y * grid.z;
    wide = ctas > static_cast<int64_t>(device_sm_count()) * decode::decode_resident_ctas(row, false);
  }
  decode::launch_decode_kernel(row, wide, p, grid, stream);
  if (p.max_splits > 1) decode::launch_decode_reduce(p, L.head_dim, a.batch, stream);
}

}  // namespace fp8kv::cuda
