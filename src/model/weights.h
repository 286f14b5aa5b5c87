// Model weights in memory. Large matrices stay in their checkpoint dtype
// (bf16 or fp32, zero-copy views into the mmapped safetensors when aligned)
// and are converted to fp32 per use; fp16 matrices are converted to fp32 at
// load. Small vectors (norms, biases) are fp32. Shapes (H = hidden_size,
// Hq = num_heads, Hkv = num_kv_heads, D = head_dim, I = intermediate, V = vocab):
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace fp8kv {

class Checkpoint;

// A 2-D row-major matrix, fp32 or bf16.
struct WeightMatrix {
  bool bf16 = false;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;           // into `owned` or into a mapped checkpoint
  std::shared_ptr<const void> owner;    // keeps `data` alive
  // `--load-format dummy` made on the device (engine/dummy_weights.h,
  // lazy): data is null and a device backend generates the bf16 matrix from
  // dummy_key / dummy_std at upload. Host code never sees such a matrix.
  bool dummy = false;
  uint64_t dummy_key = 0;
  float dummy_std = 0.0f;
  size_t bytes() const { return static_cast<size_t>(rows * cols) * (bf16 ? 2 : 4); }
};

struct LayerWeights {
  std::vector<float> input_norm;             // [H] (gemma: 1 + w)
  WeightMatrix q_proj;                       // [Hq*D][H]
  WeightMatrix k_proj;                       // [Hkv*D][H]
  WeightMatrix v_proj;                       // [Hkv*D][H]
  WeightMatrix o_proj;                       // [H][Hq*D]
  std::vector<float> q_bias, k_bias, v_bias; // [Hq*D], [Hkv*D], [Hkv*D] or empty
  std::vector<float> o_bias;                 // [H] or empty
  std::vector<float> q_norm, k_norm;         // [D] or empty (qwen3, gemma3: 1 + w)
  std::vector<float> post_attention_norm;    // [H]: llama/qwen pre-MLP norm; gemma3 post-attention norm
  std::vector<float> pre_ffn_norm;           // [H] gemma3 only
  std::vector<float> post_ffn_norm;          // [H] gemma3 only
  WeightMatrix gate_proj;                    // [I][H]
  WeightMatrix up_proj;                      // [I][H]
  WeightMatrix down_proj;                    // [H][I]
  std::vector<float> gate_bias, up_bias, down_bias;  // [I], [I], [H] or empty (llama mlp_bias)
  // qwen3_5: with attn_output_gate, q_proj is [2*Hq*D][H] (per head: query
  // rows, then gate rows). Its linear_attention (Gated DeltaNet) layers have
  // no attention tensors but these (GatedDeltaNetConfig: C = conv_dim,
  // Hv, Dv, K = conv_kernel):
  WeightMatrix in_proj_qkv;                  // [C][H]
  WeightMatrix in_proj_z;                    // [Hv*Dv][H] (the output gate)
  WeightMatrix in_proj_b, in_proj_a;         // [Hv][H] (beta, decay)
  WeightMatrix out_proj;                     // [H][Hv*Dv]
  std::vector<float> conv1d;                 // [C][K] (checkpoint [C][1][K])
  std::vector<float> A_log, dt_bias;         // [Hv]
  std::vector<float> gdn_norm;               // [Dv] (a plain weight, not 1 + w)
};

class ModelWeights {
 public:
  WeightMatrix embed;                   // [V][H]
  std::optional<WeightMatrix> lm_head;  // [V][H]; absent when tied to embed
  std::vector<float> final_norm;        // [H] (gemma: 1 + w)
  std::vector<LayerWeights> layers;
  float embed_scale = 1.0f;             // gemma3: sqrt(H) rounded to the embedding dtype

  const WeightMatrix& output() const { return lm_head ? *lm_head : embed; }
  size_t matrix_bytes() const;

  // Binds every tensor the family needs, checking dtype and shape (errors
  // name the tensor, expected and actual). Keeps the checkpoint mapped.
  static std::shared_ptr<ModelWeights> load(std::shared_ptr<const Checkpoint> ckpt, const ModelConfig& cfg);
  // A copy whose bf16 matrices are widened to fp32 (exact; norms, biases and
  // fp32 matrices shared). Trades 2x memory for no per-use conversion.
  std::shared_ptr<ModelWeights> widened_to_f32() const;

  // The first tensor, in forward order (embedding, layer 0, 1, ..., final
  // norm, lm_head), holding a NaN or inf, as "model.layers.1.mlp.down_proj.weight
  // (layer 1) holds NaN at element 5"; nullopt when every value is finite.
  // Used only after non-finite logits (a full scan, not on the hot path).
  std::optional<std::string> first_non_finite() const;

  // Random weights (normal(0, std), norms around 1) for tests; bf16 or fp32 matrices.
  static std::shared_ptr<ModelWeights> random(const ModelConfig& cfg, uint64_t seed, float std, bool bf16);
};

}  // namespace fp8kv
