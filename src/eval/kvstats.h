// `fp8kv eval kvstats`: range statistics of Q, K and V at the store point
// (StoreObserver), keyed by true layer: amax, p99.99, the fraction clipped at
// the scale (|x / s| beyond the format's max finite), the fraction flushed to
// zero, and the round-trip relative error ||x - deq(q(x))||2 / ||x||2; pooled
// by layer type (HF vocabulary: sliding_attention / full_attention).
#pragma once
#include <array>
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
  void merge(const KvStreamStats& o);
};

class KvStatsObserver : public StoreObserver {
 public:
  // scales: one entry per layer (per tensor or per head); target: fp8 format.
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
