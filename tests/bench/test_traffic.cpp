// Bytes per decode step (bench/traffic.h) against independent counts: the
// parameters stored in real checkpoints, and K/V read counted by hand.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "bench/copy_bandwidth.h"
#include "bench/traffic.h"
#include "io/safetensors.h"

namespace fp8kv {
namespace {

namespace fs = std::filesystem;
const fs::path kSrc = FP8KV_SOURCE_DIR;

// Parameters stored in a checkpoint's weight shards (KV scales excluded).
uint64_t stored_params(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors" || f.path().filename() == "kv_cache_scales.safetensors") continue;
    if (f.path().filename() == "kv.safetensors") continue;  // golden K/V recordings
    auto st = SafetensorsFile::open(f.path());
    for (const auto& t : st->tensors())
      if (t.name.find("_scale") == std::string::npos) n += static_cast<uint64_t>(t.numel());
  }
  return n;
}

// Tied embeddings: the LM head reads the stored embedding table, so the
// streamed parameters equal everything stored. Untied: all but the table.
TEST(Traffic, StreamedParamsEqualStoredWeights) {
  for (const fs::path& dir : {kSrc / "models/fp8kv-mini", kSrc / "tests/golden/models_hd64/llama",
                             kSrc / "tests/golden/models_hd64/qwen2", kSrc / "tests/golden/models_hd64/qwen3",
                             kSrc / "tests/golden/models_hd64/gemma3", kSrc / "tests/golden/models_hd64/mistral"}) {
    const ModelConfig c = load_model_config(dir);
    const uint64_t table = static_cast<uint64_t>(c.vocab_size) * c.hidden_size;
    const uint64_t want = stored_params(dir) - (c.tie_word_embeddings ? 0 : table);
    EXPECT_EQ(bench::streamed_weight_params(c), want) << dir;
    // One embedding row per sequence, bf16.
    EXPECT_EQ(bench::decode_weight_bytes(c, 3), 2 * (want + 3ull * c.hidden_size)) << dir;
  }
}

// FP8-weight checkpoints: the bytes a decode step streams are the stored
// bytes (e4m3 projections at 1 byte, their f32 scales, the bf16 rest) less
// the untied input embedding, counted from the shards' own dtypes, the
// excluded modules included (llama_block leaves one down_proj bf16). Norm
// gains count 2 bytes each, as stored; static input_scale tensors are not
// streamed weights. The checkpoints whose LM head is stored bf16 (the
// traffic model counts the LM head at the activation width's 2 bytes; the
// ct_tensor goldens quantize it, which a config alone does not say).
TEST(Traffic, Fp8WeightCheckpointsStreamTheirStoredBytes) {
  for (const char* name : {"llama_block", "qwen3_block", "llama_ct_channel", "qwen3_ct_channel", "llama_modelopt",
                           "qwen3_modelopt"}) {
    const fs::path dir = kSrc / "tests/golden/fp8_weights" / name;
    const ModelConfig c = load_model_config(dir);
    ASSERT_TRUE(c.weight_quant.quantized()) << dir;
    uint64_t want = 0;
    for (const auto& f : fs::directory_iterator(dir)) {
      if (f.path().extension() != ".safetensors") continue;
      auto st = SafetensorsFile::open(f.path());
      for (const auto& t : st->tensors()) {
        if (t.name.find("input_scale") != std::string::npos) continue;
        if (!c.tie_word_embeddings && t.name.find("embed_tokens") != std::string::npos) continue;
        const uint64_t n = static_cast<uint64_t>(t.numel());
        want += t.dtype == DType::F8_E4M3 ? n : t.name.find("weight_scale") != std::string::npos ? 4 * n : 2 * n;
      }
    }
    EXPECT_EQ(bench::decode_weight_bytes(c, 0), want) << dir;
  }
}

// Qwen3.5 hybrids (tests/golden/models_qwen3_5): the streamed parameters are the
// stored ones less the untied embedding (gated q_proj and Gated DeltaNet
// tensors included); K/V are read by the full-attention layers only; the
// states are the plan's pool of `batch` slots, read and written.
TEST(Traffic, Qwen3_5CountsItsLayersAndStates) {
  for (const char* name : {"l3f1_hd64", "l2f1_hd64", "l1f1_hd256"}) {
    const fs::path dir = kSrc / "tests/golden/models_qwen3_5" / name;
    const ModelConfig c = load_model_config(dir);
    ASSERT_TRUE(c.gdn.has_value()) << dir;
    const uint64_t table = static_cast<uint64_t>(c.vocab_size) * c.hidden_size;
    EXPECT_EQ(bench::streamed_weight_params(c), stored_params(dir) - (c.tie_word_embeddings ? 0 : table)) << dir;
    const std::vector<int> ctx = {100, 7};
    const uint64_t per_token = 2ull * c.num_kv_heads * c.head_dim * 2;  // bf16 K and V
    EXPECT_EQ(bench::decode_kv_bytes(c, KvDtype::bf16, ctx),
              static_cast<uint64_t>(c.num_attention_layers()) * 107ull * per_token) << dir;
    const GatedDeltaNetConfig& g = *c.gdn;
    const uint64_t conv = static_cast<uint64_t>(g.conv_dim()) * (g.conv_kernel - 1) * 2;  // bf16
    const uint64_t ssm = static_cast<uint64_t>(g.num_v_heads) * g.k_head_dim * g.v_head_dim * 4;  // f32
    const uint64_t linear = static_cast<uint64_t>(c.num_layers - c.num_attention_layers());
    EXPECT_EQ(bench::decode_state_bytes(c, 2, StateDtype::bf16, StateDtype::f32), 2 * 2 * linear * (conv + ssm))
        << dir;
    // --mamba-ssm-cache-dtype bfloat16 halves the recurrent state's bytes;
    // --mamba-cache-dtype float32 doubles the conv state's.
    EXPECT_EQ(bench::decode_state_bytes(c, 2, StateDtype::bf16, StateDtype::bf16), 2 * 2 * linear * (conv + ssm / 2))
        << dir;
    EXPECT_EQ(bench::decode_state_bytes(c, 2, StateDtype::f32, StateDtype::f32), 2 * 2 * linear * (2 * conv + ssm))
        << dir;
  }
  EXPECT_EQ(bench::decode_state_bytes(load_model_config(kSrc / "tests/data/configs/llama-3.1-8b"), 4, StateDtype::bf16,
                                      StateDtype::f32),
            0u);
}

// Llama-3.1-8B: 8,030,261,248 parameters, of which the 128256 x 4096 input
// embedding is gathered, not streamed: 15.0 GB per step in bf16 (issue 12 §3).
TEST(Traffic, Llama31_8bStreams15GB) {
  const ModelConfig c = load_model_config(kSrc / "tests/data/configs/llama-3.1-8b");
  EXPECT_EQ(bench::streamed_weight_params(c), 8030261248ull - 128256ull * 4096ull);
  EXPECT_NEAR(bench::decode_weight_bytes(c, 1) / 1e9, 15.01, 0.01);
  // KV at 1K context, bf16: 32 layers x 2 x 8 heads x 128 x 2 bytes = 128 KiB per token.
  const std::vector<int> ctx = {1024};
  EXPECT_EQ(bench::decode_kv_bytes(c, KvDtype::bf16, ctx), 1024ull * 131072ull);
  EXPECT_EQ(bench::decode_kv_bytes(c, KvDtype::fp8_e4m3, ctx), 1024ull * 65536ull);
}

// Sliding layers read the window only (fp8kv-mini: 5 layers of window 512, 1 full).
TEST(Traffic, SlidingLayersReadTheWindow) {
  const ModelConfig c = load_model_config(kSrc / "models/fp8kv-mini");
  ASSERT_EQ(c.num_layers, 6);
  const uint64_t per_token = 2ull * c.num_kv_heads * c.head_dim;  // fp8: one byte per element
  const std::vector<int> ctx = {100, 2000};
  const uint64_t tokens = 5ull * (100 + 512) + 1ull * (100 + 2000);
  EXPECT_EQ(bench::decode_kv_bytes(c, KvDtype::fp8_e4m3, ctx), tokens * per_token);
  EXPECT_EQ(bench::decode_kv_bytes(c, KvDtype::bf16, ctx), 2 * tokens * per_token);
}

TEST(CopyBandwidth, HostCopyIsPositiveAndPlausible) {
  const double bw = bench::host_copy_bytes_per_s(64 << 20, 3);
  EXPECT_GT(bw, 1e8);   // > 0.1 GB/s on anything
  EXPECT_LT(bw, 1e13);  // < 10 TB/s on a host
}

}  // namespace
}  // namespace fp8kv
