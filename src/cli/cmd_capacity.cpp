// `fp8kv capacity`: KV pool size, max concurrency and tokens for a model and
// serving settings, exact to the token (the engine sizes its pool with the
// same plan_kv_cache). docs/capacity.md has the method.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "cli/commands.h"
#include "io/text_table.h"
#include "cli/engine_flags.h"
#include "io/checkpoint.h"
#include "io/errors.h"
#include "kv/planner.h"
#include "engine/engine.h"  // resolve_kv_cache_dtype
#include "model/config.h"
#include "numerics/version.h"

namespace fp8kv::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The engine's defaults (cli/engine_flags.h): capacity plans the pool the
// engine would allocate with the same flags, so it must start from the same
// values (issue 12: `fp8kv capacity` used 2048 batched tokens, the engine 8192).
const EngineFlags kEngineDefaults{};

struct CapacityArgs {
  std::string model;
  std::string kv_memory, gpu_memory;
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  int max_model_len = 0;
  int max_num_seqs = kEngineDefaults.max_num_seqs;
  int max_num_batched_tokens = kEngineDefaults.max_num_batched_tokens;
  int block_size = kEngineDefaults.block_size;
  std::string kv_cache_dtype = "auto";
  int tensor_parallel_size = 1;
  bool enable_prefix_caching = kEngineDefaults.enable_prefix_caching;
  int state_snapshot_interval = 0;  // 0: automatic, as the engine
  std::string mamba_cache_dtype = kEngineDefaults.mamba_cache_dtype;
  std::string mamba_ssm_cache_dtype = kEngineDefaults.mamba_ssm_cache_dtype;
  // The two above, parsed once (run_capacity).
  StateDtype conv_state_dtype = StateDtype::bf16;
  StateDtype ssm_state_dtype = StateDtype::f32;
  bool compare = false;
  bool json_out = false;
};

struct Weights {
  uint64_t bytes = 0;  // whole model
  std::string source;
};

Weights model_weights(const fs::path& model, const ModelConfig& cfg) {
  std::error_code ec;
  if (fs::is_directory(model, ec) &&
      (fs::exists(model / "model.safetensors", ec) || fs::exists(model / "model.safetensors.index.json", ec))) {
    const auto ckpt = Checkpoint::open(model);
    return {ckpt->total_tensor_bytes(),
            cfg.weight_quant.quantized() ? "checkpoint: fp8 weights at 1 byte + scales, as stored" : "checkpoint"};
  }
  return {estimate_weight_bytes(cfg), weight_estimate_source(cfg)};
}

// The KV budget (kv/planner: the same arithmetic as the engine). probe: when
// given, the settings whose one request of max_model_len must fit (the error
// then says which --gpu-memory or --max-model-len would).
KvBudget make_budget(const CapacityArgs& a, const ModelConfig& cfg, const std::optional<Weights>& w, int mnbt,
                     const KvPlanSettings* probe = nullptr) {
  if (!a.kv_memory.empty()) return KvBudget{parse_size(a.kv_memory)};
  GpuMemoryInputs in;
  in.gpu_memory_bytes = parse_size(a.gpu_memory);
  in.utilization = a.gpu_memory_utilization;
  in.weights_bytes_per_rank = weights_per_rank(w->bytes, a.tensor_parallel_size);
  in.weights_source = w->source;
  in.activation_bytes = estimate_activation_bytes(cfg, mnbt, a.max_num_seqs, a.tensor_parallel_size);
  return kv_budget_from_gpu(in, cfg, probe);
}

KvPlanSettings settings_for(const CapacityArgs& a, KvDtype d, uint64_t kv_memory, int mml, int mnbt) {
  KvPlanSettings s;
  s.kv_memory_bytes = kv_memory;
  s.budget_source = a.kv_memory.empty() ? "--gpu-memory" : "--kv-memory";
  s.max_model_len = mml;
  s.max_num_seqs = a.max_num_seqs;
  s.max_num_batched_tokens = mnbt;
  s.block_size = a.block_size;
  s.dtype = d;
  s.tensor_parallel_size = a.tensor_parallel_size;
  s.prefix_caching = a.enable_prefix_caching;  // a state pool's snapshots share the budget, as in the engine
  s.state_snapshot_interval = a.state_snapshot_interval;
  s.conv_state_dtype = a.conv_state_dtype;  // the state pool's bytes, as in the engine
  s.ssm_state_dtype = a.ssm_state_dtype;
  return s;
}

std::string group_type_label(const KvGroupPlan& g) {
  return g.window == 0 ? std::string("full") : fmt::format("sliding({})", g.window);
}

// Blocks of the pool a group holds when the pool is full of max-length requests.
int64_t group_pool_share(const KvPlan& p, const KvGroupPlan& g) {
  const unsigned __int128 n = static_cast<unsigned __int128>(p.num_blocks) * static_cast<uint64_t>(g.blocks_per_request);
  return static_cast<int64_t>(n / static_cast<uint64_t>(p.blocks_per_request));
}

// A state pool's dtype name, null without a state pool.
json state_dtype_json(const StatePlan& s, StateDtype d) {
  return s.empty() ? json(nullptr) : json(std::string(state_dtype_name(d)));
}

json plan_json(const KvPlan& p) {
  json groups = json::array();
  for (const auto& g : p.groups) {
    const int64_t share = group_pool_share(p, g);
    groups.push_back({
        {"attention_type", std::string(layer_type_name(g.type))},
        {"sliding_window", g.window == 0 ? json(nullptr) : json(g.window)},
        {"layers", g.layers},
        {"num_layers", g.layers.size()},
        {"padding_layers", p.group_size - static_cast<int>(g.layers.size())},
        {"bytes_per_token", g.bytes_per_token},
        {"blocks_per_request", g.blocks_per_request},
        {"tokens_per_request", g.blocks_per_request * p.block_size},
        {"pool_blocks", share},
        {"pool_tokens", share * p.block_size},
        {"max_concurrency", p.max_concurrency},
    });
  }
  return {
      {"kv_cache_dtype", std::string(kv_dtype_name(p.dtype))},
      {"block_size", p.block_size},
      {"max_model_len", p.max_model_len},
      {"max_num_batched_tokens", p.max_num_batched_tokens},
      {"tensor_parallel_size", p.tensor_parallel_size},
      {"kv_heads_per_rank", p.kv_heads_per_rank},
      {"head_dim", p.head_dim},
      {"kv_memory_bytes", p.kv_memory_bytes},
      {"bytes_per_token", p.bytes_per_token},
      {"group_size", p.group_size},
      {"page_bytes", p.page_bytes},
      {"page_scale_bytes", 2ull * static_cast<uint64_t>(p.group_size) * p.layer_scale_block_bytes},
      {"num_blocks", p.num_blocks},
      {"pool_bytes", p.pool_bytes()},
      // The per-sequence state pool of linear-attention layers (0 for other models).
      {"state_bytes_per_sequence", p.state.empty() ? 0 : p.state.bytes_per_sequence()},
      {"state_pool_bytes", p.state.pool_bytes()},
      {"state_slots", p.state.num_slots},
      {"state_layers", p.state.layers},
      // Their dtypes (--mamba-cache-dtype, --mamba-ssm-cache-dtype); null without a state pool.
      {"state_conv_dtype", state_dtype_json(p.state, p.state.conv_dtype)},
      {"state_ssm_dtype", state_dtype_json(p.state, p.state.ssm_dtype)},
      // Prefix caching's state snapshots (0 when off or without a state pool).
      {"state_snapshot_interval", p.state.snapshot_interval},
      {"state_snapshot_slots", p.state.snapshot_slots},
      {"state_snapshot_bytes", p.state.snapshot_pool_bytes()},
      {"prefix_caching_off_reason",
       p.prefix_caching_off_reason.empty() ? json(nullptr) : json(p.prefix_caching_off_reason)},
      {"blocks_per_request", p.blocks_per_request},
      {"max_concurrency", p.max_concurrency},
      {"tokens", p.tokens},
      {"vllm_logged_tokens", p.vllm_logged_tokens},
      {"groups", groups},
  };
}

struct GridPoint {
  int max_model_len = 0, mnbt = 0;
  std::optional<KvPlan> bf16, fp8;
  uint64_t kv_memory = 0;
};

std::optional<KvPlan> try_plan(const ModelConfig& cfg, const KvPlanSettings& s) {
  // Only "does not fit" becomes an empty cell; any other error is the user's.
  if (kv_memory_needed(cfg, s) > s.kv_memory_bytes) return std::nullopt;
  return plan_kv_cache(cfg, s);
}

std::vector<GridPoint> compare_grid(const CapacityArgs& a, const ModelConfig& cfg, const std::optional<Weights>& w,
                                    int chosen_mml) {
  const int limit = model_max_len(cfg);
  std::set<int> lens{chosen_mml};
  for (int l : {4096, 8192, 32768, 131072, 524288, 1048576})
    if (l <= limit) lens.insert(l);
  std::set<int> batched{a.max_num_batched_tokens, 2048, 8192, 16384};
  std::vector<GridPoint> out;
  for (int l : lens) {
    for (int t : batched) {
      GridPoint g;
      g.max_model_len = l;
      g.mnbt = t;
      // With --gpu-memory the activation estimate (hence the KV budget)
      // follows max_num_batched_tokens, as vLLM's profiling run does.
      g.kv_memory = make_budget(a, cfg, w, t).kv_memory_bytes;
      g.bf16 = try_plan(cfg, settings_for(a, KvDtype::bf16, g.kv_memory, l, t));
      g.fp8 = try_plan(cfg, settings_for(a, KvDtype::fp8_e4m3, g.kv_memory, l, t));
      out.push_back(std::move(g));
    }
  }
  return out;
}

std::optional<double> gain_pct(const GridPoint& g) {
  if (!g.bf16 || !g.fp8 || g.bf16->tokens == 0) return std::nullopt;
  return 100.0 * (static_cast<double>(g.fp8->tokens) - static_cast<double>(g.bf16->tokens)) /
         static_cast<double>(g.bf16->tokens);
}

void print_text(const CapacityArgs& a, const ModelConfig& cfg, const KvBudget& b, const KvPlan& p,
                const std::vector<GridPoint>* grid) {
  std::string o;
  o += fmt::format("model: {} ({}, {}, {} layers)\n", a.model, cfg.architecture, cfg.model_type, cfg.num_layers);
  if (b.from_gpu)
    o += fmt::format("KV memory per rank: {} ({} bytes) = {} x {} - weights {} ({}) - activations {}\n",
                     format_bytes(b.kv_memory_bytes), b.kv_memory_bytes, format_bytes(b.gpu_memory_bytes),
                     b.gpu_memory_utilization, format_bytes(b.weights_bytes_per_rank), b.weights_source,
                     format_bytes(b.activation_bytes));
  else
    o += fmt::format("KV memory per rank: {} ({} bytes)\n", format_bytes(b.kv_memory_bytes), b.kv_memory_bytes);
  o += fmt::format(
      "dtype {}, block_size {}, max_model_len {}, max_num_batched_tokens {}, tensor_parallel_size {} "
      "({} KV heads x head_dim {} per rank)\n",
      kv_dtype_name(p.dtype), p.block_size, p.max_model_len, p.max_num_batched_tokens, p.tensor_parallel_size,
      p.kv_heads_per_rank, p.head_dim);
  o += fmt::format("bytes per token per rank ({}): {}\n",
                   p.state.empty() ? "all layers" : fmt::format("{} attention layers", cfg.num_attention_layers()),
                   p.bytes_per_token);
  if (!p.state.empty())
    o += fmt::format(
        "state pool: {} slots (--max-num-seqs) x {} bytes per sequence = {} ({} bytes), carved from the budget "
        "before the KV blocks ({} linear_attention layers: conv [{}][{}] {}, recurrent [{}][{}][{}] {})\n",
        p.state.num_slots, p.state.bytes_per_sequence(), format_bytes(p.state.pool_bytes()), p.state.pool_bytes(),
        p.state.layers.size(), p.state.conv_dim, p.state.conv_width, state_dtype_name(p.state.conv_dtype),
        p.state.num_v_heads, p.state.k_head_dim, p.state.v_head_dim, state_dtype_name(p.state.ssm_dtype));
  if (p.state.snapshots())
    o += fmt::format(
        "state snapshots (prefix caching): every {} blocks ({} tokens, --state-snapshot-interval), {} slots x {} "
        "bytes = {} ({} bytes), sharing the budget with the KV blocks\n",
        p.state.snapshot_interval, static_cast<int64_t>(p.state.snapshot_interval) * p.block_size,
        p.state.snapshot_slots, p.state.bytes_per_sequence(), format_bytes(p.state.snapshot_pool_bytes()),
        p.state.snapshot_pool_bytes());
  else if (!p.prefix_caching_off_reason.empty())
    o += fmt::format("prefix caching is off for this model: {}\n", p.prefix_caching_off_reason);
  o += fmt::format("page: {} tokens x {} layers x K+V = {} bytes; pool: {} blocks ({})\n", p.block_size,
                   p.group_size, p.page_bytes, p.num_blocks, format_bytes(p.pool_bytes()));
  if (p.layer_scale_block_bytes > 0)  // per-token-head dtypes: f32 scales beside the cache
    o += fmt::format("  of which per-token-head scales: {} bytes a page ({:.4g}% of the KV values' bytes)\n",
                     2ull * p.group_size * p.layer_scale_block_bytes,
                     100.0 * static_cast<double>(p.layer_scale_block_bytes) / static_cast<double>(p.layer_block_bytes));
  using A = TextTable::Align;
  TextTable groups({{"group", 6, A::left}, {"type", 16, A::left}, {"layers", 7}, {"bytes/token", 14},
                    {"blocks/request", 16}, {"pool blocks held", 18}, {"pool tokens", 14}},
                   "", "");
  for (size_t i = 0; i < p.groups.size(); ++i) {
    const auto& g = p.groups[i];
    const int64_t share = group_pool_share(p, g);
    groups.add_row({std::to_string(i), group_type_label(g), std::to_string(g.layers.size()),
                    std::to_string(g.bytes_per_token), std::to_string(g.blocks_per_request), std::to_string(share),
                    std::to_string(share * p.block_size)});
  }
  groups.add_row({"total", "", std::to_string(cfg.num_attention_layers()), std::to_string(p.bytes_per_token),
                  std::to_string(p.blocks_per_request)});
  o += groups.str();
  o += fmt::format("max concurrency: {:.2f}x requests of {} tokens\n", p.max_concurrency, p.max_model_len);
  if (p.max_concurrency > a.max_num_seqs)  // vLLM does not cap the reported figure either
    o += fmt::format("  (the scheduler runs at most --max-num-seqs {} requests at once)\n", a.max_num_seqs);
  o += fmt::format("tokens: {}\n", p.tokens);
  o += kv_plan_log_line(p) + "\n";
  if (grid) {
    o += "\nbf16 vs fp8 (same memory):\n";
    TextTable t({{"max_model_len", 14}, {"batched tokens", 16}, {"bf16 tokens", 14}, {"fp8 tokens", 14}, {"gain", 10}},
                "", "");
    for (const auto& g : *grid) {
      const auto gain = gain_pct(g);
      t.add_row({std::to_string(g.max_model_len), std::to_string(g.mnbt),
                 g.bf16 ? std::to_string(g.bf16->tokens) : "no fit", g.fp8 ? std::to_string(g.fp8->tokens) : "no fit",
                 gain ? fmt::format("{:+.1f}%", *gain) : "-"});
    }
    o += t.str();
  }
  std::fputs(o.c_str(), stdout);
}

int run_capacity(CapacityArgs a) {
  if (a.kv_memory.empty() == a.gpu_memory.empty())
    throw UsageError("give exactly one of --kv-memory SIZE (the KV budget itself) or --gpu-memory SIZE");
  // Same words as the engine flags (cli/engine_flags.h): a flag means the same in every command.
  if (!a.kv_memory.empty()) parse_size_flag("--kv-memory", a.kv_memory);
  if (!a.gpu_memory.empty()) parse_size_flag("--gpu-memory", a.gpu_memory);
  if (!(a.gpu_memory_utilization > 0.0 && a.gpu_memory_utilization <= 1.0))
    throw UsageError(fmt::format("--gpu-memory-utilization must be in (0, 1] (got {})", a.gpu_memory_utilization));
  // Parsed once, before any file is read, as the engine flags are.
  a.conv_state_dtype = parse_mamba_cache_dtype_flag(a.mamba_cache_dtype);
  a.ssm_state_dtype = parse_mamba_ssm_cache_dtype_flag(a.mamba_ssm_cache_dtype, a.mamba_cache_dtype);
  const fs::path model(a.model);
  const ModelConfig cfg = load_model_config(model);
  std::error_code ec;
  const fs::path model_dir = fs::is_directory(model, ec) ? model : model.parent_path();
  const KvDtype dtype = resolve_kv_cache_dtype(parse_kv_cache_dtype_flag(a.kv_cache_dtype),
                                               model_dir.empty() ? fs::path(".") : model_dir);

  std::optional<Weights> weights;
  if (!a.gpu_memory.empty()) weights = model_weights(model, cfg);
  const KvPlanSettings probe = settings_for(a, dtype, 0, a.max_model_len, a.max_num_batched_tokens);
  const KvBudget budget = make_budget(a, cfg, weights, a.max_num_batched_tokens, &probe);
  const KvPlan plan =
      plan_kv_cache(cfg, settings_for(a, dtype, budget.kv_memory_bytes, a.max_model_len, a.max_num_batched_tokens));
  std::fprintf(stderr, "%s\n", kv_plan_log_line(plan).c_str());

  std::vector<GridPoint> grid;
  if (a.compare) grid = compare_grid(a, cfg, weights, plan.max_model_len);

  if (!a.json_out) {
    print_text(a, cfg, budget, plan, a.compare ? &grid : nullptr);
    return 0;
  }
  json j = plan_json(plan);
  j["fp8kv_version"] = version_string();
  j["model"] = a.model;
  j["architecture"] = cfg.architecture;
  j["model_type"] = cfg.model_type;
  j["max_num_seqs"] = a.max_num_seqs;
  json mem = {{"kv_memory_bytes", budget.kv_memory_bytes}};
  if (budget.from_gpu) {
    mem["gpu_memory_bytes"] = budget.gpu_memory_bytes;
    mem["gpu_memory_utilization"] = budget.gpu_memory_utilization;
    mem["weights_bytes_per_rank"] = budget.weights_bytes_per_rank;
    mem["weights_source"] = budget.weights_source;
    mem["activation_bytes"] = budget.activation_bytes;
  }
  j["memory"] = mem;
  j["log_line"] = kv_plan_log_line(plan);
  if (a.compare) {
    json rows = json::array();
    for (const auto& g : grid) {
      const auto gain = gain_pct(g);
      rows.push_back({
          {"max_model_len", g.max_model_len},
          {"max_num_batched_tokens", g.mnbt},
          {"kv_memory_bytes", g.kv_memory},
          {"bf16", g.bf16 ? g.bf16->tokens : 0},
          {"fp8", g.fp8 ? g.fp8->tokens : 0},
          {"bf16_max_concurrency", g.bf16 ? g.bf16->max_concurrency : 0.0},
          {"fp8_max_concurrency", g.fp8 ? g.fp8->max_concurrency : 0.0},
          {"gain_pct", gain ? json(*gain) : json(nullptr)},
      });
    }
    j["grid"] = rows;
  }
  std::fputs((dump_json(j) + "\n").c_str(), stdout);
  return 0;
}

const Registrar reg_capacity([](CLI::App& app) {
  auto args = std::make_shared<CapacityArgs>();
  CLI::App* sub = app.add_subcommand(
      "capacity", "KV cache capacity (blocks, tokens, max concurrency) for a model and serving settings");
  sub->add_option("model", args->model, "model directory or config.json")->required();
  auto* kvm = sub->add_option("--kv-memory", args->kv_memory,
                              "KV cache budget per rank (80GiB, 512MiB, 80GB or bytes)");
  auto* gpu = sub->add_option("--gpu-memory", args->gpu_memory,
                              "GPU memory per rank; weights and an activation estimate are subtracted");
  kvm->excludes(gpu);
  gpu->excludes(kvm);
  sub->add_option("--gpu-memory-utilization", args->gpu_memory_utilization,
                  "fraction of --gpu-memory the engine may use (default 0.9)");
  sub->add_option("--max-model-len", args->max_model_len, "default: the model's max_position_embeddings (32k = 32000, 32K = 32768)")
      ->transform(token_count_rule())
      ->check(at_least(1));  // as the engine flags: omitted = default, 0 refused
  sub->add_option("--max-num-seqs", args->max_num_seqs, fmt::format("default {} (as the engine)", args->max_num_seqs));
  sub->add_option("--max-num-batched-tokens", args->max_num_batched_tokens,
                  fmt::format("default {} (as the engine)", args->max_num_batched_tokens));
  sub->add_option("--block-size", args->block_size, fmt::format("tokens per block (default {})", args->block_size));
  sub->add_option("--kv-cache-dtype", args->kv_cache_dtype, kv_cache_dtype_help());
  sub->add_option("--tensor-parallel-size,--tp", args->tensor_parallel_size, "default 1");
  sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", args->enable_prefix_caching,
                "as the engine (default on): on a linear-attention model the state snapshots share the budget");
  sub->add_option("--state-snapshot-interval", args->state_snapshot_interval,
                  "as the engine: blocks between state snapshots (default automatic)")
      ->check(at_least(1));
  sub->add_option("--mamba-cache-dtype", args->mamba_cache_dtype, mamba_cache_dtype_help());
  sub->add_option("--mamba-ssm-cache-dtype", args->mamba_ssm_cache_dtype, mamba_ssm_cache_dtype_help());
  sub->add_flag("--compare", args->compare, "bf16 vs fp8 over a grid of max_model_len x max_num_batched_tokens");
  sub->add_flag("--json", args->json_out, "print JSON");
  set_action(sub, [args] { return run_capacity(*args); });
});

}  // namespace
}  // namespace fp8kv::cli
