// `--load-format dummy` (vLLM's name): random weights from config.json alone,
// so that a model shape (e.g. Llama-3.1-8B) can be run and benchmarked
// without its checkpoint. Matrices bf16 ~ N(0, 0.02); norm weights 1 (Gemma:
// 1 + w with w = 0, i.e. also 1); biases 0. With a quantization_config (FP8
// weights), the projections it quantizes are those bf16 values quantized to
// e4m3 with amax / 448 scales of its granularity. Deterministic for a seed and
// fast (counter-based generator, filled in parallel). Qwen3.5's Gated
// DeltaNet layers: projections and conv1d N(0, std), A = exp(A_log) uniform
// in [1, 16), dt_bias 1, the gated norm 1 (after transformers' init).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace fp8kv {

// A lazy fp8 dummy matrix (a quantization_config under a device backend) is
// generated as e4m3 on the device with every scale kDummyFp8Sigmas * std /
// 448: the checkpoint's bytes and layout, not the host path's values.
inline constexpr float kDummyFp8Sigmas = 4.5f;

// lazy: matrices are descriptors only (WeightMatrix::dummy, data null) that
// a device backend fills on the device (backend/cuda/ops/dummy_fill.h); vectors
// as usual. Only for a device backend at tensor-parallel size 1 (the engine
// always uses it there).
std::shared_ptr<ModelWeights> dummy_weights(const ModelConfig& cfg, uint64_t seed = 0, float std = 0.02f,
                                            bool lazy = false);

// The generator key of dummy matrix `id` (element e = f(key + e / 2)).
uint64_t dummy_matrix_key(uint64_t seed, uint64_t id);

// Matrix ids (docs/engine.md "Dummy weights"): embed 0, lm_head 1 when
// untied, then q, k, v, o, gate, up, down per layer (kDummyIdsPerLayer; a
// Gated DeltaNet layer reserves its q, k, v, o ids unused), then, after the
// last layer's, kDummyGdnIdsPerLayer per layer index for the Gated DeltaNet
// tensors: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj, conv1d,
// A_log (the last two draw their values from that id's stream). Ids only
// ever get appended, so a model's existing dummy values never change.
inline constexpr int kDummyIdsPerLayer = 7;
inline constexpr int kDummyGdnIdsPerLayer = 7;
// The id of matrix k (0 q .. 6 down) of `layer`.
uint64_t dummy_layer_matrix_id(const ModelConfig& cfg, int layer, int k);
// The first Gated DeltaNet id (in_proj_qkv) of `layer`.
uint64_t dummy_gdn_matrix_id(const ModelConfig& cfg, int layer);

// Rows [r0, r0 + nr) x columns [c0, c0 + nc) of dummy matrix `id`
// (rows x cols): bitwise the same elements as that block of the full
// matrix, generating only the block (per-rank dummy weights,
// engine/tp_shard.h dummy_weights_shard).
WeightMatrix dummy_matrix_block(uint64_t seed, uint64_t id, int64_t rows, int64_t cols, int64_t r0, int64_t nr,
                                int64_t c0, int64_t nc, float std = 0.02f);

// Row ranges `rows` ([start, count), concatenated in order) x columns
// [c0, c0 + nc) of dummy matrix `id` (R x C): with fp8 unset, the bf16
// elements (dummy_matrix_block's); with fp8 set, what dummy_weights' e4m3
// matrix of that granularity holds there: the bytes quantized with the
// scales of the full matrix's cells (a tensor scale from the whole matrix,
// a channel scale from the whole row, a block's from the whole block), and
// the cut's scales as engine/tp_shard.cpp cuts them (block cuts must start
// and end on 128 boundaries or the matrix's end: std::logic_error
// otherwise, callers check first). Per-rank dummy weights.
WeightMatrix dummy_matrix_cut(uint64_t seed, uint64_t id, int64_t R, int64_t C,
                              const std::vector<std::pair<int64_t, int64_t>>& rows, int64_t c0, int64_t nc, float std,
                              std::optional<ScaleGranularity> fp8);

// A_log of a Gated DeltaNet layer's dummy values, heads [h0, h0 + n):
// log(1 + 15 u), u uniform in [0, 1) from stream `id` (dummy_gdn_matrix_id + 6).
std::vector<float> dummy_a_log(uint64_t seed, uint64_t id, int64_t h0, int64_t n);

}  // namespace fp8kv
