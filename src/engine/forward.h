// The forward pass: one implementation for every family, built from shared
// builders (norm, attention, MLP) with a small per-family layer recipe
// (family_llama.cpp: pre-norm llama/mistral/qwen2/qwen3; family_gemma3.cpp:
// sandwich norms). The model code calls backend ops only.
//
// A step runs several sequences at once: their new tokens are concatenated
// ([T] ids, T = sum of num_tokens) for the GEMMs; attention runs per
// sequence on the paged cache. K/V (and Q) are written at one place:
// store_and_observe().
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/kv_ops.h"
#include "backend/cpu/ops.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_scales.h"
#include "model/config.h"
#include "model/rope.h"
#include "model/weights.h"

namespace fp8kv {

struct ForwardSeq {
  int kv_seq = -1;     // KvCacheManager handle, already extended to start_pos + num_tokens
  int start_pos = 0;   // position of the sequence's first new token
  int num_tokens = 0;  // new tokens this step
};

class ForwardPass {
 public:
  ForwardPass(const ModelConfig& cfg, std::shared_ptr<const ModelWeights> weights);

  // Runs every layer over the new tokens, storing their K/V in the cache, and
  // leaves the final-normed hidden states [T][H] in hidden().
  void run(std::span<const int> tokens, std::span<const ForwardSeq> seqs, KvCacheManager& kv,
           const KvScales& scales, StoreObserver* observer);
  const float* hidden_row(int t) const { return h_.data() + static_cast<size_t>(t) * cfg_.hidden_size; }

  // logits [n][V] of n hidden rows (after final softcapping, if any).
  void logits(const float* hidden_rows, int n, float* out) const;

  const ModelConfig& config() const { return cfg_; }

  // ---- builders (used by the family recipes) ----
  struct Step;  // per-run context
  void norm(const std::vector<float>& w, const float* x, float* y, int T) const;
  // x [T][H] (already normed) -> attention output [T][H] (after o_proj).
  void attention(int layer, const float* x, float* out, Step& st);
  // x [T][H] (already normed) -> MLP output [T][H].
  void mlp(int layer, const float* x, float* out, int T);

 private:
  void llama_layer(int layer, Step& st);
  void gemma3_layer(int layer, Step& st);
  void store_and_observe(int layer, Step& st);

  ModelConfig cfg_;
  std::shared_ptr<const ModelWeights> w_;
  Activation act_;
  RopeTable rope_full_, rope_sliding_;
  // Scratch ([T][...] each), reused across steps.
  std::vector<float> h_, x_, tmp_, q_, k_, v_, attn_, gate_, up_;
  std::vector<float> cos_full_, sin_full_, cos_sliding_, sin_sliding_;
  std::vector<int32_t> pos_;
  std::vector<int64_t> slots_;
};

struct ForwardPass::Step {
  int T = 0;
  std::span<const ForwardSeq> seqs;
  KvCacheManager* kv = nullptr;
  const KvScales* scales = nullptr;
  StoreObserver* observer = nullptr;
};

MatrixRef matrix_ref(const WeightMatrix& m);

}  // namespace fp8kv
