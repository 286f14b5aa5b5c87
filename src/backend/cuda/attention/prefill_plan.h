// The prefill plan: which kernel runs each (head_dim, cache dtype) case. One
// table, read by paged_prefill (prefill.cu) to pick the launcher and by each
// launcher to instantiate and launch exactly the cases the table gives it.
// Activations (q and out in f32 or bf16) do not choose a kernel: both
// kernels take either, as a runtime flag of their parameters.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "backend/cuda/attention/attention.h"

namespace fp8kv::cuda {

enum class PrefillPath : uint8_t {
  // prefill_ws_kernel (prefill_ws.cu): Hopper wgmma, warp-specialized (one
  // producer warpgroup gathers K/V, two consumer warpgroups of 64 queries),
  // persistent grid of one 384-thread CTA per SM; head_dim 128 and 256
  // (WsShape: tiles of 128 keys at D = 128, 64 / 48 (bf16 / fp8) at 256).
  wgmma_ws,
  // prefill_mma_kernel (prefill_mma.cu): mma.sync m16n8k16, FlashAttention-2
  // style, one 128-thread CTA per 64 queries of one head.
  mma,
};

struct PrefillPlanRow {
  int head_dim;
  KvDtype dtype;
  PrefillPath path;
  const char* why;
};

inline constexpr PrefillPlanRow kPrefillPlan[] = {
    {64, KvDtype::bf16, PrefillPath::mma, "fallback: the wgmma kernel is written for head_dim 128 and 256"},
    {64, KvDtype::fp8_e4m3, PrefillPath::mma, "fallback: the wgmma kernel is written for head_dim 128 and 256"},
    {64, KvDtype::fp8_e5m2, PrefillPath::mma, "fallback: the wgmma kernel is written for head_dim 128 and 256"},
    {128, KvDtype::bf16, PrefillPath::wgmma_ws, "bf16 MMAs straight from the cache; consumers ping-pong"},
    {128, KvDtype::fp8_e4m3, PrefillPath::wgmma_ws, "producer converts fp8 -> f16 tiles; f16 MMAs"},
    {128, KvDtype::fp8_e5m2, PrefillPath::wgmma_ws, "producer converts fp8 -> f16 tiles; f16 MMAs"},
    {256, KvDtype::bf16, PrefillPath::wgmma_ws, "64-key tiles, 2 stages (Q alone is 64 KB); consumers ping-pong"},
    {256, KvDtype::fp8_e4m3, PrefillPath::wgmma_ws, "48-key tiles (2 stages and the fp8 staging ring in 209 KB)"},
    {256, KvDtype::fp8_e5m2, PrefillPath::wgmma_ws, "48-key tiles, as fp8 e4m3"},
    // Per-token-head: K scales on the score columns, V scales on P's columns.
    {64, KvDtype::fp8_e4m3_pth, PrefillPath::mma, "fallback: the wgmma kernel is written for head_dim 128 and 256"},
    {64, KvDtype::int8_pth, PrefillPath::mma, "fallback: the wgmma kernel is written for head_dim 128 and 256"},
    {128, KvDtype::fp8_e4m3_pth, PrefillPath::wgmma_ws, "as fp8 e4m3; the tile's 128 K and V scales staged beside it"},
    {128, KvDtype::int8_pth, PrefillPath::wgmma_ws, "as fp8 e4m3 (int8 -> f16 exact); scales as e4m3 per token head"},
    {256, KvDtype::fp8_e4m3_pth, PrefillPath::wgmma_ws, "48-key tiles, as fp8 e4m3, scales beside the stage"},
    {256, KvDtype::int8_pth, PrefillPath::wgmma_ws, "48-key tiles, as fp8 e4m3 (int8 -> f16 exact)"},
};

// The row of a case; throws std::invalid_argument for a case with no row.
inline const PrefillPlanRow& prefill_plan(int head_dim, KvDtype dtype) {
  for (const PrefillPlanRow& r : kPrefillPlan)
    if (r.head_dim == head_dim && r.dtype == dtype) return r;
  throw std::invalid_argument("paged_prefill: no kernel for head_dim " + std::to_string(head_dim) + " and cache " +
                              std::string(kv_dtype_name(dtype)));
}

// Calls f.template operator()<D, DT>() (DT: kBf16, kE4m3 or kE5m2) for the
// row of (head_dim, dtype) when that row's path is P; the rows of other paths
// are not instantiated. Returns whether a row matched.
template <PrefillPath P, class F, size_t... I>
bool launch_planned_impl(int head_dim, KvDtype dtype, F& f, std::index_sequence<I...>) {
  bool hit = false;
  auto one = [&]<size_t R>() {
    constexpr PrefillPlanRow row = kPrefillPlan[R];
    if constexpr (row.path == P) {
      if (!hit && row.head_dim == head_dim && row.dtype == dtype) {
        f.template operator()<row.head_dim, static_cast<int>(row.dtype)>();
        hit = true;
      }
    }
  };
  (one.template operator()<I>(), ...);
  return hit;
}
template <PrefillPath P, class F>
bool launch_planned(int head_dim, KvDtype dtype, F&& f) {
  return launch_planned_impl<P>(head_dim, dtype, f, std::make_index_sequence<std::size(kPrefillPlan)>());
}

// The launchers of the two paths (arguments validated by paged_prefill).
void launch_prefill_mma(const PrefillArgs& a, cudaStream_t stream);  // prefill_mma.cu
void launch_prefill_ws(const PrefillArgs& a, cudaStream_t stream);   // prefill_ws.cu

}  // namespace fp8kv::cuda
