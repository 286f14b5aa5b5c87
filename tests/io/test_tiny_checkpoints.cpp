// The tiny test checkpoints under tests/data/ are produced by this file with
// our writer. The test regenerates them in memory and requires the committed
// bytes to match, so the files cannot drift from their recipe. To rewrite
// them: FP8KV_REGEN_TINY=1 ./test_io --gtest_filter='TinyCheckpoints.*'
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/fs_util.h"
#include "io/safetensors.h"
#include "numerics/fp8.h"

using namespace fp8kv;
namespace fs = std::filesystem;

namespace {

// Deterministic values in [-scale, scale) from a 64-bit mix (no <random>
// distributions: their output is implementation-defined).
float det_value(uint64_t seed, uint64_t i, float scale) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return scale * (static_cast<float>(z >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f);
}

TensorToWrite bf16_tensor(const std::string& name, std::vector<int64_t> shape, uint64_t seed, float scale,
                          float offset = 0.0f) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  TensorToWrite t{name, DType::BF16, std::move(shape), std::vector<std::byte>(static_cast<size_t>(n) * 2)};
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(offset + det_value(seed, static_cast<uint64_t>(i), scale));
    std::memcpy(t.data.data() + 2 * i, &h, 2);
  }
  return t;
}

// tiny_llama: hidden 32, 2 layers, 4 heads (2 KV heads, head_dim 8),
// intermediate 64, vocab 64, untied lm_head, bf16.
constexpr const char* kTinyLlamaConfig = R"({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 32,
  "intermediate_size": 64,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 8,
  "vocab_size": 64,
  "max_position_embeddings": 256,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "hidden_act": "silu",
  "tie_word_embeddings": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "torch_dtype": "bfloat16"
}
)";

std::vector<TensorToWrite> tiny_llama_tensors() {
  const int64_t H = 32, I = 64, V = 64, Q = 4 * 8, KV = 2 * 8;
  std::vector<TensorToWrite> t;
  uint64_t seed = 1;
  t.push_back(bf16_tensor("model.embed_tokens.weight", {V, H}, seed++, 1.0f));
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back(bf16_tensor(p + "input_layernorm.weight", {H}, seed++, 0.1f, 1.0f));
    t.push_back(bf16_tensor(p + "self_attn.q_proj.weight", {Q, H}, seed++, 0.2f));
    t.push_back(bf16_tensor(p + "self_attn.k_proj.weight", {KV, H}, seed++, 0.2f));
    t.push_back(bf16_tensor(p + "self_attn.v_proj.weight", {KV, H}, seed++, 0.2f));
    t.push_back(bf16_tensor(p + "self_attn.o_proj.weight", {H, Q}, seed++, 0.2f));
    t.push_back(bf16_tensor(p + "post_attention_layernorm.weight", {H}, seed++, 0.1f, 1.0f));
    t.push_back(bf16_tensor(p + "mlp.gate_proj.weight", {I, H}, seed++, 0.2f));
    t.push_back(bf16_tensor(p + "mlp.up_proj.weight", {I, H}, seed++, 0.2f));
    t.push_back(bf16_tensor(p + "mlp.down_proj.weight", {H, I}, seed++, 0.15f));
  }
  t.push_back(bf16_tensor("model.norm.weight", {H}, seed++, 0.1f, 1.0f));
  t.push_back(bf16_tensor("lm_head.weight", {V, H}, seed++, 0.2f));
  return t;
}

void check_or_regen(const fs::path& p, const std::string& want) {
  if (std::getenv("FP8KV_REGEN_TINY")) {
    fs::create_directories(p.parent_path());
    atomic_write_file(p, want);
  }
  if (!fs::exists(p)) {
    ADD_FAILURE() << p << " missing; regenerate with FP8KV_REGEN_TINY=1";
    return;
  }
  EXPECT_TRUE(read_file(p) == want) << p << " differs from its recipe; regenerate with FP8KV_REGEN_TINY=1";
}

}  // namespace

TEST(TinyCheckpoints, TinyLlamaMatchesRecipe) {
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests/data/tiny_llama";
  const auto bytes = serialize_safetensors(tiny_llama_tensors(), {{"format", "pt"}});
  check_or_regen(dir / "model.safetensors", std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  check_or_regen(dir / "config.json", kTinyLlamaConfig);
  auto c = Checkpoint::open(dir);
  EXPECT_EQ(c->tensor_names().size(), 1u + 2u * 9u + 2u);
  // A norm weight decodes to 1 + small noise, as written.
  const auto norm = c->to_f32("model.norm.weight");
  for (float v : norm) EXPECT_LE(std::fabs(v - 1.0f), 0.1f + 1.0f / 128);  // bf16 rounding near 1: 2^-7
}

namespace {

template <class T>
TensorToWrite raw_tensor(std::string name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  TensorToWrite t{std::move(name), dt, std::move(shape), std::vector<std::byte>(v.size() * sizeof(T))};
  if (!v.empty()) std::memcpy(t.data.data(), v.data(), t.data.size());
  return t;
}

}  // namespace

// tests/data/safetensors_cpp/all_dtypes.safetensors: one tensor per dtype,
// written by our writer from bit patterns whose values are stated by hand in
// all_dtypes.expected.json. tools/check_safetensors_interop.py reads it with
// the Python safetensors library and compares against those values.
TEST(TinyCheckpoints, AllDtypesFileMatchesRecipe) {
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests/data/safetensors_cpp";
  std::vector<TensorToWrite> ts;
  nlohmann::ordered_json exp = nlohmann::ordered_json::object();
  auto add = [&](TensorToWrite t, nlohmann::ordered_json values) {
    exp[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"values", values}};
    ts.push_back(std::move(t));
  };
  add(raw_tensor<float>("f32", DType::F32, {2, 2}, {1.5f, -2.0f, 3.25f, 0.0f}), {1.5, -2.0, 3.25, 0.0});
  add(raw_tensor<uint16_t>("f16", DType::F16, {4}, {0x3c00, 0xc000, 0x7bff, 0x0001}),
      {1.0, -2.0, 65504.0, 5.9604644775390625e-08});
  add(raw_tensor<uint16_t>("bf16", DType::BF16, {3}, {0x3f80, 0xc0a0, 0x4049}), {1.0, -5.0, 3.140625});
  add(raw_tensor<double>("f64", DType::F64, {2}, {0.1, -1e300}), {0.1, -1e300});
  add(raw_tensor<uint8_t>("f8_e4m3", DType::F8_E4M3, {5}, {0x38, 0x7e, 0xfe, 0x01, 0x00}),
      {1.0, 448.0, -448.0, 0.001953125, 0.0});
  add(raw_tensor<uint8_t>("f8_e5m2", DType::F8_E5M2, {4}, {0x3c, 0x7b, 0x01, 0xbc}),
      {1.0, 57344.0, 1.52587890625e-05, -1.0});
  add(raw_tensor<int64_t>("i64", DType::I64, {2}, {-5, 9007199254740993LL}), {-5, 9007199254740993LL});
  add(raw_tensor<int32_t>("i32", DType::I32, {2}, {7, -8}), {7, -8});
  add(raw_tensor<uint8_t>("u8", DType::U8, {2}, {0, 255}), {0, 255});
  add(raw_tensor<uint8_t>("bool", DType::BOOL, {2}, {1, 0}), {true, false});
  add(raw_tensor<float>("scalar", DType::F32, {}, {0.25f}), {0.25});
  add(raw_tensor<float>("empty", DType::F32, {0, 3}, {}), nlohmann::ordered_json::array());
  const auto bytes = serialize_safetensors(ts, {{"format", "pt"}});
  check_or_regen(dir / "all_dtypes.safetensors", std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  check_or_regen(dir / "all_dtypes.expected.json", exp.dump(1) + "\n");

  // Our own reader agrees with the stated values.
  auto f = SafetensorsFile::open(dir / "all_dtypes.safetensors");
  for (const char* name : {"f32", "f16", "bf16", "f64", "f8_e4m3", "f8_e5m2", "scalar", "empty"}) {
    const auto got = f->to_f32(name);
    const auto& want = exp[name]["values"];
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<float>(want[i].get<double>())) << name << i;
  }
}
