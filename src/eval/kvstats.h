// `fp8kv eval kvstats`: range statistics of Q, K and V at the store point
// (StoreObserver), keyed by true layer: amax, p99.99, the fraction clipped at
// the scale (|x / s| beyond the format's max finite), the fraction flushed to
// zero, and the round-trip relative error ||x - deq(q(x))||2 / ||x||2; pooled
// by layer type (HF vocabulary: sliding_attention / full_attention).
#pragma once
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/store_observer.h"
#include "calib/observer.h"
#include "kv/kv_scales.h"
#include "model/config.h"
#include "numerics/quant_stats.h"

namespace fp8kv::eval {

struct KvStreamStats {
  StreamStats range;  // amax, histogram for p99.99 (calib/observer.h: bf16 bins, <= 0.79% above)
  QuantStats quant;   // clip / flush / rt error at the scale
  // Per-token-head targets (K and V): the range of the per-token-head scales
  // and how many were at the floor FLT_MIN (zero or denormal vectors).
  float scale_min = INFINITY, scale_max = 0.0f;
  uint64_t scales = 0, scales_at_floor = 0;
  void merge(const KvStreamStats& o);
};

class KvStatsObserver : public StoreObserver {
 public:
  // scales: one entry per layer (per tensor or per head); target: fp8 format.
  // A per-token-head target (fp8_per_token_head, int8_per_token_head) ignores
  // the scales: K and V get each (token, KV head)'s scale by the store's rule
  // (per_token_head_scale); Q is not quantized (range only).
  KvStatsObserver(KvScales scales, KvDtype target);
  void observe(int layer, const float* q, int num_q_heads, const float* k, const float* v, int num_kv_heads,
               int head_dim, int num_tokens) override;

  int num_layers() const { return static_cast<int>(layers_.size()); }
  // stream: 0 = q, 1 = k, 2 = v.
  const KvStreamStats& stats(int layer, int stream) const { return layers_.at(layer)[stream]; }
  uint64_t tokens(int layer) const { return tokens_.at(layer); }

  // {"layers": [...], "pooled": [...]} (see docs/eval.md); throws on non-finite.
  nlohmann::json to_json(const ModelConfig& cfg) const;
  // A fixed-width table for stderr.
  std::string table(const ModelConfig& cfg) const;

 private:
  KvScales scales_;
  KvDtype target_;
  std::vector<std::array<KvStreamStats, 3>> layers_;
  std::vector<uint64_t> tokens_;
};

// "unity" | "checkpoint" | a positive finite number (applied to every
// stream). checkpoint needs the checkpoint (given as loaded scales).
KvScales kvstats_scales(const std::string& spec, int num_layers, const KvScales* checkpoint_scales);

}  // namespace fp8kv::eval
