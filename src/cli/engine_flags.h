// Flags shared by every command that runs the engine (DESIGN.md "Command
// line"): --kv-cache-dtype, --max-model-len, --block-size, --kv-memory,
// --backend, --threads. Header-only so any cmd_*.cpp can use it.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "engine/engine.h"
#include "kv/planner.h"

namespace fp8kv::cli {

struct EngineFlags {
  std::string kv_cache_dtype = "auto";
  int max_model_len = 0;
  int block_size = 16;
  std::string kv_memory;  // empty: engine default
  std::string backend = "auto";
  int threads = 0;

  void add(CLI::App* sub) {
    sub->add_option("--kv-cache-dtype", kv_cache_dtype, "KV cache dtype: auto, bf16, fp8 (= fp8_e4m3), fp8_e4m3, fp8_e5m2")
        ->check(CLI::IsMember({"auto", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"}));
    sub->add_option("--max-model-len", max_model_len, "Max tokens per sequence (default: the model's)")
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--block-size", block_size, "Tokens per KV block")->check(CLI::PositiveNumber);
    sub->add_option("--kv-memory", kv_memory, "KV cache budget: 512MiB, 80GB, bytes (default: enough for a few full-length requests)");
    sub->add_option("--backend", backend, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    sub->add_option("--threads", threads, "CPU threads (default: all)")->check(CLI::NonNegativeNumber);
  }

  EngineOptions options() const {
    EngineOptions o;
    o.kv_cache_dtype = kv_cache_dtype;
    o.max_model_len = max_model_len;
    o.block_size = block_size;
    o.kv_memory_bytes = kv_memory.empty() ? 0 : parse_size(kv_memory);
    o.backend = backend;
    o.num_threads = threads;
    return o;
  }
};

}  // namespace fp8kv::cli
