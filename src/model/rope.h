// Rotary position embedding tables, computed as Hugging Face transformers
// does (inv_freq in fp32, freqs = inv_freq * pos in fp32, cos/sin scaled by
// the attention factor): default, linear, llama3, yarn and dynamic (dynamic
// equals default up to the original context, the only regime we run).
#pragma once
#include <vector>

#include "model/config.h"

namespace fp8kv {

class RopeTable {
 public:
  // head_dim: the full head size; rot_dim = head_dim * partial_rotary_factor (even).
  RopeTable(const RopeParams& p, int head_dim, int max_position_embeddings);
  int rot_dim() const { return rot_dim_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float attention_factor() const { return attention_factor_; }
  // cos/sin for positions pos[0..n): [n][rot_dim/2] each.
  void fill(const int* pos, int n, float* cos, float* sin) const;

 private:
  int rot_dim_ = 0;
  std::vector<float> inv_freq_;  // [rot_dim/2]
  float attention_factor_ = 1.0f;
};

}  // namespace fp8kv
