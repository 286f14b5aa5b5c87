// Model weights in memory. Large matrices stay in their checkpoint dtype
// (bf16 or fp32, zero-copy views into the mmapped safetensors when aligned)
// and are converted to fp32 per use; fp16 matrices are converted to fp32 at
// load. FP8-weight checkpoints (model/quant_config.h) keep their e4m3 bytes
// and f32 scales (numerics/fp8_weights.h). Small vectors (norms, biases)
// are fp32. Shapes (H = hidden_size,
// Hq = num_heads, Hkv = num_kv_heads, D = head_dim, I = intermediate, V = vocab):
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "numerics/fp8_weights.h"

namespace fp8kv {

class Checkpoint;

// A 2-D row-major matrix, fp32, bf16 or fp8 e4m3 with scales.
struct WeightMatrix {
  bool bf16 = false;
  // e4m3 bytes; the real value of element (r, c) is e4m3(byte) * the scale
  // of its tensor / channel / 128x128 block (numerics/fp8_weights.h).
  bool fp8 = false;
  ScaleGranularity scale_granularity = ScaleGranularity::tensor;
  std::shared_ptr<const std::vector<float>> scales;  // fp8_scale_shape(scale_granularity, rows, cols), f32, > 0
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;           // into `owned` or into a mapped checkpoint
  std::shared_ptr<const void> owner;    // keeps `data` alive
  // `--load-format dummy` made on the device (engine/dummy_weights.h,
  // lazy): data is null and a device backend generates the bf16 matrix from
  // dummy_key / dummy_std at upload. Host code never sees such a matrix.
  bool dummy = false;
  uint64_t dummy_key = 0;
  float dummy_std = 0.0f;
  size_t bytes() const { return static_cast<size_t>(rows * cols) * (fp8 ? 1 : bf16 ? 2 : 4); }
  size_t scale_bytes() const { return scales ? scales->size() * sizeof(float) : 0; }
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
  // How linear layers use fp8 matrices (--fp8-weight-mode); set by the engine before upload.
  Fp8Compute fp8_compute = Fp8Compute::w8a16;

  const WeightMatrix& output() const { return lm_head ? *lm_head : embed; }
  // Bytes of every matrix as held (fp8: 1 per element) plus their scales.
  size_t matrix_bytes() const;
  bool has_fp8() const;  // any matrix is fp8

  // Binds every tensor the family needs, checking dtype and shape (errors
  // name the tensor, expected and actual). Keeps the checkpoint mapped.
  // check_memory false: no refusal when the weights exceed 90% of this
  // machine's memory (`inspect` validates without computing).
  static std::shared_ptr<ModelWeights> load(std::shared_ptr<const Checkpoint> ckpt, const ModelConfig& cfg,
                                            bool check_memory = true);
  // A copy whose bf16 matrices are widened to fp32 (exact; norms, biases and
  // fp32 matrices shared). Trades 2x memory for no per-use conversion.
  std::shared_ptr<ModelWeights> widened_to_f32() const;

  // The first tensor, in forward order (embedding, layer 0, 1, ..., final
  // norm, lm_head), holding a NaN or inf, as "model.layers.1.mlp.down_proj.weight
  // (layer 1) holds NaN at element 5"; nullopt when every value is finite.
  // Used only after non-finite logits (a full scan, not on the hot path).
  std::optional<std::string> first_non_finite() const;
  // The first fp8 (e4m3) matrix, in the same order, holding a NaN byte
  // (S.1111.111), named as first_non_finite does; nullopt when there is none
  // or every fp8 matrix is a dummy. A scan of every fp8 byte: the CUDA
  // backend runs it at upload, since its fp8 GEMV reads NaN bytes as finite
  // values (docs/design.md "FP8-weight checkpoints").
  std::optional<std::string> first_nan_fp8() const;
  // The tensor of one forward stage holding the largest |value|, as
  // "model.layers.1.input_layernorm.weight holds 3.39e+38 at element 0" (an
  // fp8 matrix: its largest scale). stage -1: the embedding; 0..L-1: layer
  // l's tensors; L: the final norm; L + 1: the output projection (lm_head,
  // or the tied embedding). For the non-finite diagnosis, after the stage
  // whose output overflowed is known (a scan, not on the hot path).
  std::string largest_value(int stage) const;

  // Random weights (normal(0, std), norms around 1) for tests; bf16 or fp32 matrices.
  static std::shared_ptr<ModelWeights> random(const ModelConfig& cfg, uint64_t seed, float std, bool bf16);

 private:
  // first_non_finite (fp8_only false) or first_nan_fp8 (true).
  std::optional<std::string> first_bad_tensor(bool fp8_only) const;
};

}  // namespace fp8kv
