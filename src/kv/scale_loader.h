// KV (and Q) scales from a checkpoint: every naming convention in docs/design.md "Checkpoints"
// maps into one per-layer KvScales with provenance; values are validated at
// load (finite, > 0, scalar or per head), coverage is computed by presence
// (never by value), and `--kv-cache-dtype auto` is resolved from the
// checkpoint's declared KV scheme. docs/kv_scales.md has the name mapping.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_scales.h"
#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv {

class Checkpoint;

enum class ScaleStream : uint8_t { k, v, q, kv, prob };  // kv: deprecated single scale (both k and v)

// A recognised KV scale tensor name.
struct KvScaleName {
  std::string prefix;  // text before "layers.N." ("model.", "model.language_model.", ...)
  int layer = 0;
  ScaleStream stream = ScaleStream::k;
  std::string_view convention;  // the suffix after "layers.N.", e.g. "self_attn.attn.k_scale"
};
// Parses a checkpoint tensor name; nullopt when it is not a KV scale name.
std::optional<KvScaleName> parse_kv_scale_name(std::string_view name);

// Names written by `fp8kv inject`.
enum class KvScaleNaming { hf, vllm_runtime };  // self_attn.{k,v,q}_scale | self_attn.attn.{k,v,q}_scale
// Throws std::invalid_argument for anything but "hf" / "vllm-runtime".
KvScaleNaming parse_kv_scale_naming(std::string_view s);
std::string kv_scale_tensor_name(std::string_view prefix, int layer, ScaleStream stream, KvScaleNaming naming);

// Shapes the loader needs (a ModelConfig has them: kv_scale_shape; tests can
// fill them in). KvScales keep one entry per model layer, but only layers
// with a KV cache take scales (docs/design.md "KV scales of hybrid models"):
// a linear_attention layer (qwen3_5 Gated DeltaNet) has none, so no scale is
// read, written or counted as missing for it.
struct KvScaleShape {
  int num_layers = 0;
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;
  std::vector<bool> kv_cache;  // per layer: has a KV cache; empty: every layer has one
  bool has_kv_cache(int layer) const { return kv_cache.empty() || kv_cache[static_cast<size_t>(layer)]; }
  int num_kv_layers() const;
  std::vector<int> kv_layers() const;  // the layers with a KV cache, ascending
};
// The model's shape; kv_cache is set only when some layer has no KV cache.
KvScaleShape kv_scale_shape(const ModelConfig& cfg);

// Checks one scale tensor's values: count 1 or `heads`, every value accepted
// by scale_value_error (numerics/scale_check.h: finite, normal float32, > 0).
// Throws InputError naming `tensor`, e.g. "model.layers.1.self_attn.v_scale is
// NaN (...)". Values outside [2^-20, 2^20] append a line to `warnings` when
// given.
void validate_scale_values(const std::string& tensor, const std::vector<float>& values, int heads,
                           std::string_view heads_what, std::vector<std::string>* warnings = nullptr);

// The one check of a whole KvScales before the engine uses it (the engine's
// set_kv_scales and load_kv_scales agree because both end in
// validate_scale_values): one entry per layer, each stream 1 or per-head
// values accepted by scale_value_error. Errors name the file and tensor the
// value came from ("DIR/model.safetensors: model.layers.1.self_attn.v_scale is
// NaN ..."), or "layer N k_scale" for scales that came from no file.
void validate_kv_scales(const KvScales& scales, const KvScaleShape& shape);

// Reads every KV scale tensor of the checkpoint into per-layer KvScales.
// Streams without a tensor stay 1.0 with from_checkpoint = false. Throws
// InputError naming the file and the tensor on: non-float dtype, bad shape,
// a value validate_scale_values refuses, layer index out of range, a layer
// without a KV cache (shape.kv_cache), or two tensors giving different values
// for the same layer and stream. Range warnings go to `warnings` when given.
KvScales load_kv_scales(const Checkpoint& ckpt, const KvScaleShape& shape,
                        std::vector<std::string>* warnings = nullptr);

// Which layers have k/v/q scales from the checkpoint, among the layers whose
// KV cache runs quantized (the layers with a KV cache: every attention layer,
// no linear_attention layer).
struct KvScaleCoverage {
  int quantized_layers = 0;
  std::vector<int> k_missing, v_missing, q_missing;  // layers running at 1.0 (no tensor)
  int k_present() const { return quantized_layers - static_cast<int>(k_missing.size()); }
  int v_present() const { return quantized_layers - static_cast<int>(v_missing.size()); }
  int q_present() const { return quantized_layers - static_cast<int>(q_missing.size()); }
};
KvScaleCoverage kv_scale_coverage(const KvScales& scales, const KvScaleShape& shape);
// Every layer of `scales` has a KV cache (the dense families).
KvScaleCoverage kv_scale_coverage(const KvScales& scales);

// The load-time warning (one line) when an fp8 cache runs with v_scale
// coverage short of the quantized layers; nullopt when coverage is complete
// or the cache is bf16. Decided by presence, never by value.
std::optional<std::string> kv_scale_coverage_warning(const KvScaleCoverage& cov, KvDtype cache_dtype);

// Loads, validates and logs on stderr the range warnings and, when the cache
// is fp8 and v_scale coverage is short, the coverage warning (once). What the engine calls at load.
KvScales load_kv_scales_for_run(const Checkpoint& ckpt, const KvScaleShape& shape, KvDtype cache_dtype);

// True when the checkpoint declares an fp8 KV cache: config.json has
// quantization_config.kv_cache_scheme (compressed-tensors, non-null) or a
// kv_cache_quant_algo FP8 (ModelOpt, in config.json's quantization_config or
// in hf_quant_config.json). Malformed JSON -> InputError naming the file.
bool checkpoint_declares_fp8_kv(const std::filesystem::path& model_dir);
// (`--kv-cache-dtype auto` is resolved by resolve_kv_cache_dtype in
// engine/engine.h with the same rules.)

}  // namespace fp8kv
