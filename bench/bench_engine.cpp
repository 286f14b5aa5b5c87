// Engine throughput on the CPU backend: prefill and decode tokens/s with a
// bf16 vs fp8 KV cache. Not a test: prints a table.
//
//   bench_engine [MODEL_DIR] [--prompt N] [--decode N] [--threads T] [--reps R]
//
// Without MODEL_DIR a synthetic Llama-shaped model with random bf16 weights
// is used (hidden 1024, 8 layers, 16 heads / 4 KV heads, intermediate 2816,
// vocab 32000: 0.27 B parameters), big enough that the numbers mean
// something; the golden checkpoints (hidden 64) measure mostly overhead.
// Decode is bound by reading the weights: the table shows the achieved
// weight-read bandwidth (bytes of all matrices per decoded token / time).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "model/weights.h"

using namespace fp8kv;

namespace {

ModelConfig synthetic_config() {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", 1024}, {"intermediate_size", 2816}, {"num_hidden_layers", 8},
                      {"num_attention_heads", 16}, {"num_key_value_heads", 4}, {"vocab_size", 32000},
                      {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
                      {"eos_token_id", 2}};
  return parse_model_config(j, "synthetic");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int prompt = 512, decode = 64, threads = 0, reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--prompt") prompt = next();
    else if (a == "--decode") decode = next();
    else if (a == "--threads") threads = next();
    else if (a == "--reps") reps = next();
    else if (a.rfind("--", 0) == 0) { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
    else dir = a;
  }
  if (prompt < 1 || decode < 2 || reps < 1) { std::fprintf(stderr, "bad sizes\n"); return 2; }
  try {
    std::shared_ptr<const ModelWeights> weights;
    ModelConfig cfg;
    if (dir.empty()) {
      cfg = synthetic_config();
      weights = ModelWeights::random(cfg, 1, 0.02f, /*bf16=*/true);
    }
    std::printf("model: %s, prompt %d tokens, decode %d tokens, threads %s, median of %d\n",
                dir.empty() ? "synthetic llama 1024x8 (bf16 weights)" : dir.c_str(), prompt, decode,
                threads ? std::to_string(threads).c_str() : "default", reps);
    std::printf("%-10s %14s %14s %16s\n", "kv dtype", "prefill tok/s", "decode tok/s", "weights GB/s");
    for (const char* dt : {"bf16", "fp8_e4m3"}) {
      EngineOptions o;
      o.kv_cache_dtype = dt;
      o.num_threads = threads;
      o.max_model_len = prompt + decode + 1;
      o.max_num_seqs = 1;
      auto e = dir.empty() ? Engine::create(cfg, weights, o) : Engine::load(dir, o);
      const ModelConfig& c = e->config();
      std::mt19937 rng(3);
      std::vector<int> ids(prompt);
      for (auto& x : ids) x = static_cast<int>(rng() % static_cast<unsigned>(c.vocab_size));
      GenerateOptions g;
      g.max_tokens = decode;
      g.stop_at_eos = false;
      e->generate(ids, g);  // warm-up
      std::vector<double> pf, dc;
      size_t nd = 0;
      for (int r = 0; r < reps; ++r) {
        const GenerateResult res = e->generate(ids, g);
        pf.push_back(prompt / res.prefill_seconds);
        nd = res.tokens.size() - 1;
        dc.push_back(static_cast<double>(nd) / res.decode_seconds);
      }
      double wbytes = 0.0;
      if (dir.empty()) wbytes = static_cast<double>(weights->matrix_bytes());
      std::printf("%-10s %14.1f %14.2f %16s\n", dt, median(pf), median(dc),
                  wbytes > 0 ? std::to_string(wbytes * median(dc) / 1e9).substr(0, 6).c_str() : "-");
    }
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "error: %s\n", ex.what());
    return 1;
  }
  return 0;
}
