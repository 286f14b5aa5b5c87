// Writing calibrated KV scales into a Hugging Face checkpoint, safely.
//
// The scales go into their own shard, kv_cache_scales.safetensors (float32,
// `<prefix>layers.N.self_attn.{k,v,q}_scale`, or `...self_attn.attn.*` with
// the vllm-runtime naming, for each layer N with a KV cache: none for a
// linear_attention layer; <prefix> is the one the checkpoint's attention
// weights use), registered in model.safetensors.index.json (the
// index is created for a single-file checkpoint). Weight shards are never
// opened for writing; every file inject writes is a new inode (temp file,
// fsync, rename, fsync dir), so a hard link is never written through.
//
// In place, the index is the commit point and a live index never points at a
// file being replaced:
//   1. write the shard under a fresh name kv_cache_scales.<rand8>.safetensors
//   2. replace the index (-> fresh shard)                 [commit: new scales]
//   3. write kv_cache_scales.safetensors (no live index points at it now)
//   4. replace the index (-> kv_cache_scales.safetensors) [same scales, final name]
//   5. remove the fresh shard and any unreferenced kv_cache_scales.*.safetensors
//   6. hf_quant_config.json (--declare-kv-scheme), then SHA256SUMS
// A kill at any moment leaves a loadable checkpoint with the old or the new
// scales; leftovers of a killed run are removed by the next inject.
// With --output, the new directory is built beside the target under a
// temporary name (hard links for unchanged files where possible, copies
// otherwise), verified, then renamed into place: it appears whole or not at all.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kv/scale_loader.h"

namespace fp8kv {

struct InjectOptions {
  std::filesystem::path model_dir;
  std::optional<std::filesystem::path> output_dir;  // nullopt: in place
  std::string report_source = "REPORT.json";        // for messages
  KvScaleNaming naming = KvScaleNaming::hf;
  bool declare_kv_scheme = false;  // hf_quant_config.json kv_cache_quant_algo FP8
  bool write_q_scale = true;
  int slow_ms = 0;  // tests: sleep between steps (fp8kv inject --test-step-delay-ms; the kill -9 test)
};

struct InjectResult {
  std::filesystem::path dir;        // the checkpoint written
  std::string scales_file;          // "kv_cache_scales.safetensors"
  std::vector<std::string> tensors; // names written
  bool created_index = false;
  bool hardlinked = false;          // --output: at least one file was hard-linked
};

// Validates everything (report complete and matching the model, scales finite
// float32 > 0, no conflicting KV scale tensor in a weight shard, output
// directory absent or empty) before writing anything; throws InputError
// naming the file / layer / tensor.
InjectResult inject_kv_scales(const InjectOptions& opts, const nlohmann::json& report);

// Names of the shard files inject owns: kv_cache_scales.safetensors and
// kv_cache_scales.<hex>.safetensors.
bool is_scale_shard_name(const std::string& filename);

// "<sha256>  <relative path>\n" for every regular file under dir (sorted,
// SHA256SUMS itself excluded), the format `sha256sum -c` reads.
std::string sha256sums_manifest(const std::filesystem::path& dir);

}  // namespace fp8kv
