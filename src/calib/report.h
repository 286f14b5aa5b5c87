// The calibration report (REPORT.json): written by `fp8kv calibrate`, read by
// `fp8kv inject`. Layout (docs/kv_scales.md):
//   {"fp8kv_version", "status": "complete"|"failed", ["reason"], "model",
//    "rule": "safety:1.3", "target": "fp8_e4m3", "per_head": false,
//    "tokens_observed": N, "corpus": [...], "context": N,
//    "layers": [{"layer", "q_amax", "k_amax", "v_amax", "q_p9999", "k_p9999",
//                "v_p9999", "q_scale", "k_scale", "v_scale", "observations"}]}
// One layer entry per layer with a KV cache (ascending); a linear_attention
// layer (qwen3_5 Gated DeltaNet) has no KV cache and no entry (docs/design.md
// "KV scales of hybrid models"). "observations" counts tokens observed.
// With per_head, amax and scale values are arrays (k/v per KV head, q per
// query head). Floats are written as the double of the exact float32 value,
// so they parse back to the same float32 bits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calib/observer.h"
#include "calib/scale_rule.h"
#include "kv/scale_loader.h"
#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv {

struct LayerCalibration {
  int layer = 0;
  std::vector<float> q_amax, k_amax, v_amax;     // 1 value, or one per head (per_head)
  float q_p9999 = 0, k_p9999 = 0, v_p9999 = 0;   // per tensor
  std::vector<float> q_scale, k_scale, v_scale;  // as the amax vectors
  uint64_t observations = 0;                     // tokens observed
};

struct CalibrationReport {
  bool complete = false;
  bool too_few_tokens = false;  // failed for fewer than CalibrateOptions::min_tokens
  std::string reason;  // why it failed (empty when complete)
  std::string model;
  ScaleRule rule;
  KvDtype target = KvDtype::fp8_e4m3;
  bool per_head = false;
  uint64_t tokens_observed = 0;
  std::vector<std::string> corpus;
  int context = 0;
  std::vector<LayerCalibration> layers;
  nlohmann::json model_identity;  // model_identity(config) of the calibrated model; null: not recorded

  nlohmann::json to_json() const;
};

// Builds the report from what the observer saw: an entry for each layer with
// a KV cache (CalibrationObserver::has_kv_cache). status is failed (with the
// reason) when no token was observed, a KV-cache layer was never observed, or
// a non-finite value reached the store point.
CalibrationReport build_report(const CalibrationObserver& obs, const ScaleRule& rule, KvDtype target, bool per_head);

// What inject needs from a report, validated against the model: status
// complete, one entry per layer with a KV cache (shape.kv_cache; every layer
// 0..n-1 for a dense model) and none for a layer without one, every scale a
// finite float32 > 0 with 1 or per-head values. Throws InputError naming
// `source`, the layer and the field on anything else.
struct ReportScales {
  KvDtype target = KvDtype::fp8_e4m3;
  std::string rule;
  KvScales scales;  // from_checkpoint = false; source_tensor empty
  // Scales outside [2^-20, 2^20] (scale_value_warning), one line each,
  // "SOURCE: layers[1] (layer 1).v_scale 1e+30 ...": accepted, to be printed.
  std::vector<std::string> warnings;
};
ReportScales parse_report_for_inject(const nlohmann::json& report, const std::string& source, const KvScaleShape& shape);

// What identifies the model a report was made for: the architecture and the
// shapes ({"architecture", "model_type", "num_hidden_layers", "hidden_size",
// "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"}).
// calibrate records it; inject refuses a report whose identity differs from
// the target model's, naming the first field that differs.
nlohmann::json model_identity(const ModelConfig& c);
// Throws InputError "SOURCE: made for another model: model_identity.F is X in
// the report, Y in MODEL" when `report` has a model_identity that differs;
// returns false (nothing to compare) when it has none.
bool check_model_identity(const nlohmann::json& report, const std::string& source, const ModelConfig& c,
                          const std::string& model);

// JSON number holding exactly the float32 value (no NaN/inf: callers check).
inline nlohmann::json json_f32(float f) { return nlohmann::json(static_cast<double>(f)); }

}  // namespace fp8kv
