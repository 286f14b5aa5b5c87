// Fixtures shared by the engine tests that drive the scheduler and the
// engine loop (test_scheduler, test_prefix_cache, test_backend_split): random
// prompts, small KV plans and pools sized in whole requests, scheduler
// requests, and a run-until-idle loop that records every event.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "kv/planner.h"
#include "model/config.h"
#include "numerics/fp8.h"

namespace fp8kv::testing {

// The tiny Qwen3.5 hybrid of the engine tests (test_qwen3_5,
// test_qwen3_5_prefix): three linear_attention layers, then one gated
// full-attention layer with partial rotary.
inline ModelConfig tiny_qwen3_5_config() {
  return parse_model_config(nlohmann::json::parse(R"({
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 16, "vocab_size": 64, "max_position_embeddings": 512, "eos_token_id": 2,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_num_key_heads": 1, "linear_num_value_heads": 2,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
  })"),
                            "config.json");
}

// n random prompt ids in [3, vocab): never 0-2 (tiny_config's specials, EOS
// = 2), so a greedy run never stops early.
inline std::vector<int> random_tokens(const ModelConfig& c, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = 3 + static_cast<int>(rng() % static_cast<uint64_t>(c.vocab_size - 3));
  return t;
}

// Plan settings of the small test engines: block 4 unless given.
inline KvPlanSettings small_plan_settings(int max_model_len, int max_num_batched_tokens,
                                          KvDtype dtype = KvDtype::bf16, int block_size = 4) {
  KvPlanSettings s;
  s.block_size = block_size;
  s.max_model_len = max_model_len;
  s.max_num_batched_tokens = max_num_batched_tokens;
  s.dtype = dtype;
  return s;
}

// The plan whose pool holds exactly `requests` requests of max_model_len.
inline KvPlan plan_for_requests(const ModelConfig& c, KvPlanSettings s, int requests) {
  s.kv_memory_bytes = kv_memory_needed(c, s) * static_cast<uint64_t>(requests);
  return plan_kv_cache(c, s);
}

// Engine options for a small CPU engine (block 4).
inline EngineOptions small_engine_options(const std::string& dtype, int max_model_len, int max_num_batched_tokens,
                                          int max_num_seqs = 256) {
  EngineOptions o;
  o.kv_cache_dtype = dtype;
  o.block_size = 4;
  o.max_model_len = max_model_len;
  o.max_num_batched_tokens = max_num_batched_tokens;
  o.max_num_seqs = max_num_seqs;
  return o;
}

// o with a KV pool of exactly `requests` requests of o.max_model_len (the
// planner's own kv_memory_needed, so the count does not depend on page sizes).
inline EngineOptions with_pool_for(EngineOptions o, const ModelConfig& c, int requests) {
  const KvPlanSettings s =
      small_plan_settings(o.max_model_len, o.max_num_batched_tokens, o.kv_cache_dtype.dtype.value_or(KvDtype::bf16), o.block_size);
  o.kv_memory_bytes = kv_memory_needed(c, s) * static_cast<uint64_t>(requests);
  return o;
}

// A greedy generation request for the scheduler: no EOS stop, prefill chunks
// of at most `chunk` tokens.
inline std::unique_ptr<SchedRequest> gen_request(RequestId id, std::vector<int> prompt, int max_tokens, int chunk) {
  auto r = std::make_unique<SchedRequest>();
  r->id = id;
  r->tokens = std::move(prompt);
  r->num_prompt = static_cast<int>(r->tokens.size());
  r->chunk = chunk;
  r->gen.max_tokens = max_tokens;
  r->gen.stop_at_eos = false;
  return r;
}

// One request's events: sampled tokens, their logprobs, how it finished.
struct RunOut {
  std::vector<int> tokens;
  std::vector<float> logprobs;
  std::optional<FinishReason> finish;
};

// Submits every prompt at once (greedy, max_tokens, no EOS stop, the sampled
// token's logprob), steps the engine until idle, and returns each request's
// events in submission order. No event may follow a request's finish.
inline std::vector<RunOut> run_until_idle(Engine& e, const std::vector<std::vector<int>>& prompts, int max_tokens) {
  std::vector<RunOut> out(prompts.size());
  std::map<RequestId, size_t> idx;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions g;
    g.max_tokens = max_tokens;
    g.stop_at_eos = false;
    g.logprobs = 0;
    idx[e.submit(Request{prompts[i], g})] = i;
  }
  while (!e.idle())
    for (const auto& ev : e.step()) {
      RunOut& o = out[idx.at(ev.id)];
      EXPECT_FALSE(o.finish.has_value()) << "event after the request finished";
      if (ev.token >= 0) {
        o.tokens.push_back(ev.token);
        EXPECT_TRUE(ev.logprob.has_value());
        o.logprobs.push_back(ev.logprob.value_or(0.0f));
      }
      if (ev.finished) o.finish = *ev.finished;
    }
  return out;
}

}  // namespace fp8kv::testing
