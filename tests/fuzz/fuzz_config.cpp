// libFuzzer target: config.json parsing (parse_model_config) must turn any
// input into a ModelConfig that keeps its invariants, or refuse it with
// InputError naming the field. Any other exception (a JSON type error, an
// out_of_range, a bad_alloc), a crash, a hang or a sanitizer report is a bug:
// the CLI would print "internal error" and exit 1. Build and run:
// docs/fuzzing.md.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "io/errors.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // The CLI reads config.json with nlohmann's parser; invalid JSON is refused
  // there (its parse_error maps to InputError). Only valid JSON goes on.
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const fp8kv::ModelConfig c = fp8kv::parse_model_config(j, "fuzz/config.json");
    // What the planner and the forward pass rely on.
    if (c.num_layers <= 0 || static_cast<int>(c.layer_types.size()) != c.num_layers) __builtin_trap();
    if (c.hidden_size <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0) __builtin_trap();
    if (c.num_heads % c.num_kv_heads != 0) __builtin_trap();
    if (c.vocab_size <= 0 || c.max_position_embeddings <= 0) __builtin_trap();
    const bool slides = c.num_sliding_layers() > 0;
    if (slides != c.sliding_window.has_value()) __builtin_trap();
    if (c.sliding_window && *c.sliding_window <= 0) __builtin_trap();
    if (!(c.rope_full.theta > 0) || !(c.rope_sliding.theta > 0)) __builtin_trap();
    if (!(c.attention_scale() > 0)) __builtin_trap();
    for (int id : c.eos_token_ids)
      if (id < 0) __builtin_trap();
  } catch (const fp8kv::InputError&) {
  }
  return 0;
}
