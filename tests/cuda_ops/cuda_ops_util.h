// Helpers for the CUDA op tests: GPU presence, typed device vectors, seeds.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/ops/ops.h"
#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv::cudaops_test {

#define FP8KV_NEED_GPU()                                \
  if (!::fp8kv::cuda::cuda_device_available())          \
  GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount failed or returned 0)"

template <class T>
cuda::DeviceBuffer to_device(const std::vector<T>& h) {
  cuda::DeviceBuffer d(std::max<size_t>(1, h.size() * sizeof(T)));
  d.upload(h.data(), h.size() * sizeof(T));
  return d;
}
template <class T>
std::vector<T> to_host(const cuda::DeviceBuffer& d, size_t n) {
  std::vector<T> h(n);
  d.download(h.data(), n * sizeof(T));
  return h;
}

// Fresh seed every run (printed; FP8KV_SEED replays).
inline uint64_t test_seed() {
  if (const char* s = std::getenv("FP8KV_SEED")) return std::stoull(s);
  const uint64_t s = std::random_device{}();
  std::printf("[ seed ] FP8KV_SEED=%llu\n", static_cast<unsigned long long>(s));
  return s;
}

inline std::vector<float> randn(std::mt19937_64& rng, size_t n, float sd) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

constexpr double kU32 = 0x1.0p-24;  // fp32 unit roundoff
constexpr double kUbf16 = 0x1.0p-8;  // bf16 unit roundoff (8-bit significand, RNE: half an ulp <= 2^-8 relative)

// The small hybrid Qwen3 (head_dim 64, sliding + full layers) that the CUDA
// engine and tensor-parallel tests run.
inline ModelConfig small_qwen3_config() {
  nlohmann::json j = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "qwen3"}, {"hidden_size", 128},
                      {"intermediate_size", 256}, {"num_hidden_layers", 3}, {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"head_dim", 64}, {"vocab_size", 512},
                      {"max_position_embeddings", 1024}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0},
                      {"tie_word_embeddings", true}, {"use_sliding_window", true}, {"sliding_window", 40},
                      {"max_window_layers", 0},
                      {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}},
                      {"eos_token_id", 2}};
  return parse_model_config(j, "small qwen3 test config");
}

// Random token sequences of the given lengths (ids 3 .. vocab_size - 1, one
// generator seeded with test_seed() drawn in order).
inline std::vector<std::vector<int>> random_token_seqs(const ModelConfig& cfg, std::initializer_list<int> lens) {
  std::mt19937_64 rng(test_seed());
  std::uniform_int_distribution<int> tok(3, cfg.vocab_size - 1);
  std::vector<std::vector<int>> seqs;
  for (int n : lens) {
    seqs.emplace_back();
    for (int t = 0; t < n; ++t) seqs.back().push_back(tok(rng));
  }
  return seqs;
}

}  // namespace fp8kv::cudaops_test
