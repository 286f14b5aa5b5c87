// Per-layer KV (and Q) scales with provenance.
#pragma once
#include <string>
#include <vector>

#include "kv/layout.h"

namespace fp8kv {

// One stream's scale for one layer: one value (per tensor) or one per head.
struct StreamScale {
  std::vector<float> values{1.0f};
  bool from_checkpoint = false;  // decided by presence, never by value
  std::string source_tensor;     // checkpoint tensor name it came from, if any
  std::string source_file;       // the .safetensors file holding source_tensor, if any
  ScaleRef ref() const { return ScaleRef{values.data(), static_cast<int>(values.size())}; }
  float at(int head) const { return values.size() == 1 ? values[0] : values[head]; }
};

struct LayerKvScales {
  StreamScale k, v, q;
};

struct KvScales {
  std::vector<LayerKvScales> layers;  // one per model layer
  static KvScales unity(int num_layers) { KvScales s; s.layers.resize(num_layers); return s; }
};

}  // namespace fp8kv
