// KV capacity planner: vLLM's hybrid-allocator arithmetic, token-exact.
// Mirrored functions (vllm/v1/core/kv_cache_utils.py, kv_cache_interface.py):
//   _get_kv_cache_groups_uniform_page_size  -> group_layers()
//   AttentionSpec.page_size_bytes           -> layer_block_bytes x 2
//   get_num_blocks                          -> kv_memory / page_bytes
//   FullAttentionSpec / SlidingWindowSpec .max_memory_usage_bytes
//                                           -> group_blocks_per_request()
//   get_max_concurrency_for_kv_cache_config -> num_blocks / blocks_per_request
//   estimate_max_model_len                  -> max_model_len_that_fits()
// See docs/capacity.md for the reasoning and the differences.
#include "kv/planner.h"
#include "kv/state_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <numeric>

#include "io/errors.h"

namespace fp8kv {

namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One factor of a size product, named as the user would find it (a flag or a
// config.json field).
struct Factor {
  std::string name;
  uint64_t value;
};

// The product of `f`, or an InputError naming every factor when it does not
// fit in 64 bits (issue 15 item 1: a wrapped page size once divided by zero).
uint64_t checked_product(std::string_view what, const std::vector<Factor>& f) {
  unsigned __int128 p = 1;
  bool over = false;
  for (const auto& x : f) {
    p *= x.value;  // p < 2^64 and value < 2^64 before each step: no 128-bit wrap
    if (p > std::numeric_limits<uint64_t>::max()) {
      over = true;
      break;
    }
  }
  if (!over) return static_cast<uint64_t>(p);
  std::string terms;
  for (const auto& x : f) terms += fmt::format("{}{} {}", terms.empty() ? "" : " x ", x.name, x.value);
  throw InputError(fmt::format("{} does not fit in 64 bits: {}; lower one of these values", what, terms));
}

uint64_t checked_add(std::string_view what, uint64_t a, uint64_t b) {
  if (a > std::numeric_limits<uint64_t>::max() - b)
    throw InputError(fmt::format("{} does not fit in 64 bits: {} + {}", what, a, b));
  return a + b;
}

// One attention type: full (window 0) or one sliding window size.
struct TypeLayers {
  int window = 0;
  std::vector<int> layers;
};

void check_model(const ModelConfig& cfg) {
  if (cfg.num_layers <= 0)
    throw InputError(fmt::format("model config: num_hidden_layers must be > 0 (got {})", cfg.num_layers));
  if (cfg.num_kv_heads <= 0)
    throw InputError(fmt::format("model config: num_key_value_heads must be > 0 (got {})", cfg.num_kv_heads));
  if (cfg.head_dim <= 0)
    throw InputError(fmt::format("model config: head_dim must be > 0 (got {})", cfg.head_dim));
  if (static_cast<int>(cfg.layer_types.size()) != cfg.num_layers)
    throw InputError(fmt::format("model config: layer_types has {} entries, expected num_hidden_layers = {}",
                                 cfg.layer_types.size(), cfg.num_layers));
  for (int i = 0; i < cfg.num_layers; ++i) {
    if (cfg.layer_types[static_cast<size_t>(i)] == LayerType::sliding_attention &&
        (!cfg.sliding_window || *cfg.sliding_window <= 0))
      throw InputError(fmt::format("model config: layer {} is sliding_attention but sliding_window is {}", i,
                                   cfg.sliding_window ? std::to_string(*cfg.sliding_window) : "unset"));
  }
}

int resolved_max_model_len(const ModelConfig& cfg, const KvPlanSettings& s) {
  const int limit = model_max_len(cfg);
  if (s.max_model_len < 0) throw InputError(fmt::format("--max-model-len must be >= 1 (got {})", s.max_model_len));
  if (s.max_model_len == 0) {
    if (limit <= 0)
      throw InputError("model config has no max_position_embeddings: give --max-model-len");
    return limit;
  }
  if (limit > 0 && s.max_model_len > limit)
    throw InputError(fmt::format("--max-model-len {} exceeds the model's maximum context length {} "
                                 "(max_position_embeddings{}); use at most {}",
                                 s.max_model_len, limit,
                                 limit != cfg.max_position_embeddings ? " x rope factor" : "", limit));
  return s.max_model_len;
}

void check_settings(const KvPlanSettings& s) {
  if (s.block_size <= 0) throw InputError(fmt::format("--block-size must be >= 1 (got {})", s.block_size));
  if (s.max_num_batched_tokens <= 0)
    throw InputError(fmt::format("--max-num-batched-tokens must be >= 1 (got {})", s.max_num_batched_tokens));
  if (s.max_num_seqs <= 0) throw InputError(fmt::format("--max-num-seqs must be >= 1 (got {})", s.max_num_seqs));
  if (s.tensor_parallel_size <= 0)
    throw InputError(fmt::format("--tensor-parallel-size must be >= 1 (got {})", s.tensor_parallel_size));
}

// Layers grouped by attention type, types in order of first appearance (as
// vLLM's dict of same-type layers), layers in model order.
std::vector<TypeLayers> layers_by_type(const ModelConfig& cfg) {
  std::vector<TypeLayers> types;
  for (int i = 0; i < cfg.num_layers; ++i) {
    if (cfg.layer_types[static_cast<size_t>(i)] == LayerType::linear_attention) continue;  // state pool, no KV
    const int w = cfg.window_for_layer(i);
    auto it = std::find_if(types.begin(), types.end(), [&](const TypeLayers& t) { return t.window == w; });
    if (it == types.end()) {
      types.push_back({w, {}});
      it = types.end() - 1;
    }
    it->layers.push_back(i);
  }
  return types;
}

// vLLM's group size: the smallest layer count among the types (the "1" of an
// n:1 pattern), or the largest when largest < 1.5 x smallest (less padding).
int choose_group_size(const std::vector<TypeLayers>& types) {
  size_t mn = std::numeric_limits<size_t>::max(), mx = 0;
  for (const auto& t : types) {
    mn = std::min(mn, t.layers.size());
    mx = std::max(mx, t.layers.size());
  }
  // max < 1.5 * min, in integers: 2 * max < 3 * min.
  return static_cast<int>(2 * mx < 3 * mn ? mx : mn);
}

int64_t group_blocks_per_request(int window, int64_t max_model_len, int64_t max_num_batched_tokens,
                                 int64_t block_size) {
  if (window == 0) return cdiv(max_model_len, block_size);
  // SlidingWindowSpec: the last window-1 computed tokens plus the tokens
  // scheduled in this step, never more than max_model_len; +1 because the
  // window need not start at a block boundary.
  const int64_t tokens = std::min<int64_t>(window - 1 + max_num_batched_tokens, max_model_len);
  return cdiv(tokens, block_size) + 1;
}

int64_t total_blocks_per_request(const KvPlan& p, int64_t max_model_len, int64_t mnbt) {
  int64_t total = 0;
  for (const auto& g : p.groups) total += group_blocks_per_request(g.window, max_model_len, mnbt, p.block_size);
  return total;
}

// Everything except num_blocks and what depends on it.
KvPlan plan_structure(const ModelConfig& cfg, const KvPlanSettings& s) {
  check_settings(s);
  check_model(cfg);
  KvPlan p;
  p.dtype = s.dtype;
  p.block_size = s.block_size;
  p.max_model_len = resolved_max_model_len(cfg, s);
  p.max_num_batched_tokens = s.max_num_batched_tokens;
  p.tensor_parallel_size = s.tensor_parallel_size;
  p.kv_memory_bytes = s.kv_memory_bytes;
  p.kv_heads_per_rank = kv_heads_per_rank(cfg, s.tensor_parallel_size);
  p.head_dim = cfg.head_dim;

  // Every size product is checked (issue 15 item 1): factors name the flag or
  // config.json field they come from.
  const auto u = [](auto v) { return static_cast<uint64_t>(v); };
  const Factor heads{s.tensor_parallel_size > 1 ? "KV heads per rank (num_key_value_heads / --tensor-parallel-size)"
                                                : "num_key_value_heads",
                     u(p.kv_heads_per_rank)};
  const Factor dim{"head_dim", u(cfg.head_dim)};
  const Factor dbytes{fmt::format("{} bytes per value", kv_dtype_name(s.dtype)), u(kv_dtype_bytes(s.dtype))};
  const Factor block{"--block-size", u(s.block_size)};
  // Per-token-head dtypes: one f32 scale per (token, KV head) of K and of V
  // beside the cache (KvCacheLayout::scale_block_bytes). Their products name
  // the bytes of one token head (values + scale) as one factor; the others
  // keep head_dim and the value bytes as separate factors.
  const bool pth = kv_dtype_per_token_head(s.dtype);
  const uint64_t scale_bytes = pth ? u(sizeof(float)) : 0;
  const std::vector<Factor> head_bytes =
      pth ? std::vector<Factor>{{fmt::format("bytes per token head (head_dim {} x {} + {} scale bytes)", cfg.head_dim,
                                             kv_dtype_bytes(s.dtype), scale_bytes),
                                 u(cfg.head_dim) * u(kv_dtype_bytes(s.dtype)) + scale_bytes}}
          : std::vector<Factor>{dim, dbytes};
  const auto with_heads = [&](std::initializer_list<Factor> f) {
    std::vector<Factor> v(f);
    v.insert(v.end(), head_bytes.begin(), head_bytes.end());
    return v;
  };
  const uint64_t token_layer_bytes = checked_product("KV bytes per token per layer", with_heads({heads}));
  p.layer_block_bytes = checked_product("KV bytes per layer block", {block, heads, dim, dbytes});
  p.layer_scale_block_bytes = checked_product("KV scale bytes per layer block", {block, heads, {"scale bytes", scale_bytes}});
  p.bytes_per_token =
      checked_product("KV bytes per token", with_heads({{"K and V", 2}, {"num_hidden_layers", u(cfg.num_layers)}, heads}));

  const auto types = layers_by_type(cfg);
  if (types.empty()) throw InputError("model config: no attention layer (every layer is linear_attention)");
  p.group_size = choose_group_size(types);
  p.page_bytes = checked_product("KV page size (bytes of one block)",
                                 with_heads({block, {"K and V", 2}, {"layers per KV group", u(p.group_size)}, heads}));
  for (const auto& t : types) {
    // Each type split into cdiv(n, group_size) groups, layer i of the type
    // going to group i % num_groups (vLLM: layers[i::num_groups]); groups
    // shorter than group_size are padded.
    const size_t n = t.layers.size();
    const size_t num_groups = static_cast<size_t>(cdiv(static_cast<int64_t>(n), p.group_size));
    for (size_t gi = 0; gi < num_groups; ++gi) {
      KvGroupPlan g;
      g.type = t.window == 0 ? LayerType::full_attention : LayerType::sliding_attention;
      g.window = t.window;
      for (size_t i = gi; i < n; i += num_groups) g.layers.push_back(t.layers[i]);
      g.bytes_per_token = checked_product("KV bytes per token of a group",
                                          {{"K and V", 2}, {"layers", g.layers.size()}, {"bytes", token_layer_bytes}});
      g.blocks_per_request =
          group_blocks_per_request(t.window, p.max_model_len, s.max_num_batched_tokens, s.block_size);
      p.blocks_per_request += g.blocks_per_request;
      p.groups.push_back(std::move(g));
    }
  }
  // The marginal bytes of a token: the attention layers' only (hybrids with
  // linear_attention layers keep those in the state pool).
  p.bytes_per_token = 0;
  for (const auto& g : p.groups) p.bytes_per_token = checked_add("KV bytes per token", p.bytes_per_token, g.bytes_per_token);
  p.state = plan_state(cfg, s.max_num_seqs, s.tensor_parallel_size, s.conv_state_dtype, s.ssm_state_dtype);
  return p;
}

// The budget left for KV blocks once the state pool is carved out; an
// InputError when the state pool alone exceeds it.
uint64_t kv_bytes_after_state(const KvPlan& p, const KvPlanSettings& s) {
  const uint64_t state = p.state.pool_bytes();
  if (state > s.kv_memory_bytes)
    throw InputError(fmt::format(
        "{}: the budget {} ({} bytes) is smaller than the linear-attention state pool: --max-num-seqs {} x {} "
        "bytes per sequence = {} ({} bytes); lower --max-num-seqs or raise the budget",
        s.budget_source, format_bytes(s.kv_memory_bytes), s.kv_memory_bytes, p.state.num_slots,
        p.state.bytes_per_sequence(), format_bytes(state), state));
  return s.kv_memory_bytes - state;
}

}  // namespace

int model_max_len(const ModelConfig& cfg) {
  // vLLM _get_and_verify_max_len: rope scaling other than llama3 / longrope
  // extends the derived length by its factor (yarn: from the original length),
  // except for gemma3, whose max_position_embeddings is already scaled.
  const RopeParams& r = cfg.rope_full;
  double len = cfg.max_position_embeddings;
  const bool gemma3 = cfg.family == ModelFamily::gemma3 || cfg.model_type.find("gemma3") != std::string::npos;
  if (!gemma3 && (r.type == "linear" || r.type == "dynamic" || r.type == "yarn")) {
    if (r.type == "yarn" && r.original_max_position_embeddings > 0) len = r.original_max_position_embeddings;
    len *= r.factor;
  }
  if (len > std::numeric_limits<int>::max()) return std::numeric_limits<int>::max();
  return static_cast<int>(len);
}

std::string max_model_len_origin(const ModelConfig& cfg, const KvPlanSettings& s) {
  if (s.max_model_len > 0) return "--max-model-len";
  const int limit = model_max_len(cfg);
  if (limit != cfg.max_position_embeddings)
    return fmt::format("the model's limit: max_position_embeddings {} in config.json x its RoPE factor; "
                       "--max-model-len not given",
                       cfg.max_position_embeddings);
  return "the model's limit: max_position_embeddings in config.json; --max-model-len not given";
}

int kv_heads_per_rank(const ModelConfig& cfg, int tp) {
  if (tp <= 0) throw InputError(fmt::format("--tensor-parallel-size must be >= 1 (got {})", tp));
  const int kv = cfg.num_kv_heads;
  if (kv <= 0) throw InputError(fmt::format("model config: num_key_value_heads must be > 0 (got {})", kv));
  if (cfg.num_heads > 0 && cfg.num_heads % tp != 0)
    throw InputError(fmt::format("--tensor-parallel-size {} does not divide num_attention_heads {}", tp,
                                 cfg.num_heads));
  if (tp <= kv) {
    if (kv % tp != 0)
      throw InputError(fmt::format("--tensor-parallel-size {} does not divide num_key_value_heads {}", tp, kv));
    return kv / tp;
  }
  // tp > kv heads: each KV head replicated on tp / kv ranks (vLLM's
  // QKVParallelLinear); needs kv | tp.
  if (tp % kv != 0)
    throw InputError(fmt::format("--tensor-parallel-size {} > num_key_value_heads {} must be a multiple of it "
                                 "(each KV head is then replicated on tp / kv ranks)",
                                 tp, kv));
  return 1;
}

uint64_t kv_memory_needed(const ModelConfig& cfg, const KvPlanSettings& s) {
  const KvPlan p = plan_structure(cfg, s);
  return checked_add("KV memory of one request of max_model_len plus the state pool",
                     checked_product("KV memory of one request of max_model_len",
                                     {{"blocks per request (max_model_len / --block-size, summed over KV groups)",
                                       static_cast<uint64_t>(p.blocks_per_request)},
                                      {"page bytes", p.page_bytes}}),
                     p.state.pool_bytes());
}

int max_model_len_that_fits(const ModelConfig& cfg, const KvPlanSettings& s) {
  const KvPlan p = plan_structure(cfg, s);
  if (p.state.pool_bytes() > s.kv_memory_bytes) return 0;
  const int64_t avail_blocks = static_cast<int64_t>((s.kv_memory_bytes - p.state.pool_bytes()) / p.page_bytes);
  auto fits = [&](int64_t len) {
    return total_blocks_per_request(p, len, s.max_num_batched_tokens) <= avail_blocks;
  };
  int64_t lo = 1, hi = p.max_model_len, best = 0;
  if (!fits(1)) return 0;
  while (lo <= hi) {  // blocks_per_request is monotone in max_model_len
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) {
      best = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return static_cast<int>(best);
}

int auto_snapshot_interval(const KvPlan& p) {
  const int64_t B = p.block_size;
  const int64_t step = std::lcm<int64_t>(B, kSnapshotAlignTokens) / B;  // blocks per aligned boundary
  const uint64_t per_block = static_cast<uint64_t>(p.groups.size()) * p.page_bytes;
  const uint64_t state = p.state.bytes_per_sequence();
  const uint64_t blocks = std::max<uint64_t>(1, (state + per_block - 1) / per_block);
  const uint64_t n = (blocks + step - 1) / static_cast<uint64_t>(step) * static_cast<uint64_t>(step);
  return static_cast<int>(std::min<uint64_t>(n, std::numeric_limits<int>::max()));
}

namespace {
// Prefix caching on a model with a state pool: the snapshot interval, or why
// none can be used (p.prefix_caching_off_reason).
void plan_snapshot_interval(KvPlan& p, const KvPlanSettings& s) {
  if (s.state_snapshot_interval < 0)
    throw InputError(fmt::format("--state-snapshot-interval must be >= 1 (got {})", s.state_snapshot_interval));
  if (!s.prefix_caching || p.state.empty()) return;
  for (const auto& g : p.groups)
    if (g.window > 0) {
      // A hit would also need the window's pages, which the snapshot rule
      // does not cover; no such model exists (Qwen3.5 is full attention +
      // linear attention).
      p.prefix_caching_off_reason = fmt::format(
          "its linear_attention layers sit beside sliding-window layers (window {}), a combination the state "
          "snapshots do not cover",
          g.window);
      return;
    }
  const int n = s.state_snapshot_interval > 0 ? s.state_snapshot_interval : auto_snapshot_interval(p);
  const int64_t tokens = static_cast<int64_t>(n) * p.block_size;
  if (tokens >= p.max_model_len) {
    if (s.state_snapshot_interval > 0)
      throw InputError(fmt::format("--state-snapshot-interval {} x --block-size {} = {} tokens: no sequence of "
                                   "max_model_len {} reaches a snapshot boundary; give fewer blocks",
                                   n, p.block_size, tokens, p.max_model_len));
    p.prefix_caching_off_reason = fmt::format(
        "a state snapshot every {} blocks ({} tokens, where one costs no more than the KV blocks it covers) lies "
        "beyond max_model_len {}; --state-snapshot-interval sets a shorter one",
        n, tokens, p.max_model_len);
    return;
  }
  p.state.snapshot_interval = n;
}

// The KV blocks beside a state snapshot pool: the most blocks b with
// b x page_bytes + floor(b / (groups x interval)) x state bytes <= avail
// (a snapshot for every interval of cached blocks), when at least one
// request of max_model_len fits that way; else as without snapshots (the
// snapshots get what is left). The snapshot slots are what remains.
uint64_t blocks_beside_snapshots(KvPlan& p, uint64_t avail) {
  const uint64_t page = p.page_bytes, state = p.state.bytes_per_sequence();
  const uint64_t per = static_cast<uint64_t>(p.groups.size()) * static_cast<uint64_t>(p.state.snapshot_interval);
  auto cost = [&](unsigned __int128 b) { return b * page + b / per * state; };
  uint64_t lo = static_cast<uint64_t>(static_cast<unsigned __int128>(avail) * per / (per * page + state));
  uint64_t hi = lo + per + 1;  // cost(b) >= b (page + state / per) - state bounds the answer
  while (lo < hi) {            // largest b with cost(b) <= avail (cost is monotone)
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (cost(mid) <= avail)
      lo = mid;
    else
      hi = mid - 1;
  }
  const uint64_t blocks = lo >= static_cast<uint64_t>(p.blocks_per_request) ? lo : avail / page;
  p.state.snapshot_slots = static_cast<int64_t>((avail - std::min<uint64_t>(avail, blocks * page)) / state);
  return blocks;
}
}  // namespace

KvPlan plan_kv_cache(const ModelConfig& cfg, const KvPlanSettings& s) {
  KvPlan p = plan_structure(cfg, s);
  plan_snapshot_interval(p, s);
  const uint64_t avail = kv_bytes_after_state(p, s);
  const uint64_t blocks = p.state.snapshots() ? blocks_beside_snapshots(p, avail) : avail / p.page_bytes;
  if (p.state.snapshots() && p.state.snapshot_slots == 0) {
    p.prefix_caching_off_reason = fmt::format(
        "the budget leaves no room for one state snapshot ({} bytes) beside a request of max_model_len {}",
        p.state.bytes_per_sequence(), p.max_model_len);
    p.state.snapshot_interval = 0;
  }
  // Block ids are int32 (BlockPool, block tables): a budget with more blocks
  // is refused here, naming where the budget came from (issue 15 item 10).
  constexpr uint64_t kMaxBlocks = std::numeric_limits<int32_t>::max();
  if (blocks > kMaxBlocks) {
    const uint64_t most = kMaxBlocks * p.page_bytes;  // < kv_memory_bytes: no wrap
    throw InputError(fmt::format(
        "{}: a KV budget of {} ({} bytes) is {} blocks of {} bytes; block ids are 32-bit, so at most {} blocks "
        "({}, {} bytes) can be used: lower {}",
        s.budget_source, format_bytes(s.kv_memory_bytes), s.kv_memory_bytes, blocks, p.page_bytes, kMaxBlocks,
        format_bytes(most), most, s.budget_source.rfind("--", 0) == 0 ? s.budget_source : "the budget (--kv-memory)"));
  }
  p.num_blocks = static_cast<int64_t>(blocks);
  if (p.num_blocks < p.blocks_per_request) {
    const uint64_t needed = kv_memory_needed(cfg, s);
    const int fit = max_model_len_that_fits(cfg, s);
    std::string what_fits =
        fit > 0 ? fmt::format("the largest max_model_len that fits is {} (give --max-model-len {} or less)", fit, fit)
                : fmt::format("not even a 1-token request fits (one page is {} bytes)", p.page_bytes);
    throw InputError(fmt::format(
        "{}: KV memory {} ({} bytes) is too small for one request of max_model_len {} ({}) with {} KV cache: "
        "it needs {} blocks of {} bytes = {} bytes ({}); {}",
        s.budget_source, format_bytes(s.kv_memory_bytes), s.kv_memory_bytes, p.max_model_len,
        max_model_len_origin(cfg, s), kv_dtype_name(p.dtype), p.blocks_per_request, p.page_bytes, needed,
        format_bytes(needed), what_fits));
  }
  p.max_concurrency = static_cast<double>(p.num_blocks) / static_cast<double>(p.blocks_per_request);
  // floor(num_blocks * max_model_len / blocks_per_request), exactly.
  const unsigned __int128 num = static_cast<unsigned __int128>(p.num_blocks) * static_cast<uint64_t>(p.max_model_len);
  p.tokens = static_cast<int64_t>(num / static_cast<uint64_t>(p.blocks_per_request));
  p.vllm_logged_tokens = p.num_blocks / static_cast<int64_t>(p.groups.size()) * p.block_size;
  return p;
}

std::string kv_plan_log_line(const KvPlan& p) {
  std::string line;
  if (p.groups.size() == 1 && p.groups[0].window == 0) {
    // One full-attention group: tokens = blocks x block_size (to within the
    // rounding of max_model_len to whole blocks).
    line = fmt::format("KV cache: {} tokens ({} blocks of {}), max concurrency {:.2f}x at max_model_len {}, dtype {}",
                       p.tokens, p.num_blocks, p.block_size, p.max_concurrency, p.max_model_len,
                       kv_dtype_name(p.dtype));
  } else {
    // Sliding windows and several groups: a request takes blocks in every
    // group (a sliding group only its window's), all from one pool, so
    // blocks x block_size is not the tokens; the line gives the arithmetic
    // (issue 37: "394496 blocks" beside "1048576 tokens", unexplained).
    struct Term {
      int window;
      int64_t blocks;
      int count;
    };
    std::vector<Term> terms;
    for (const auto& g : p.groups) {
      auto it = std::find_if(terms.begin(), terms.end(),
                             [&](const Term& t) { return t.window == g.window && t.blocks == g.blocks_per_request; });
      if (it == terms.end())
        terms.push_back({g.window, g.blocks_per_request, 1});
      else
        ++it->count;
    }
    std::stable_sort(terms.begin(), terms.end(), [](const Term& a, const Term& b) { return a.window < b.window; });
    std::string takes;
    for (const auto& t : terms) {
      if (!takes.empty()) takes += " + ";
      takes += t.count > 1 ? fmt::format("{} x {}", t.count, t.blocks) : fmt::format("{}", t.blocks);
      takes += t.window == 0 ? " in full attention" : fmt::format(" in sliding window {}", t.window);
    }
    if (p.groups.size() > 1)
      takes += fmt::format(" = {} blocks", p.blocks_per_request);
    else
      takes = fmt::format("{} blocks in sliding window {}", terms[0].blocks, terms[0].window);
    const size_t G = p.groups.size();
    line = fmt::format(
        "KV cache: {} tokens = max concurrency {:.2f}x at max_model_len {} (pool: {} blocks of {} tokens{} {} "
        "KV-cache group{} of {} layer{}; a request of max_model_len takes {}), dtype {}",
        p.tokens, p.max_concurrency, p.max_model_len, p.num_blocks, p.block_size, G > 1 ? " shared by" : " in", G,
        G > 1 ? "s" : "", p.group_size, p.group_size > 1 ? "s" : "", takes, kv_dtype_name(p.dtype));
  }
  if (!p.state.empty())
    line += fmt::format("; state pool: {} slots x {} bytes = {} ({} linear_attention layers, conv {}, recurrent {})",
                        p.state.num_slots, p.state.bytes_per_sequence(), format_bytes(p.state.pool_bytes()),
                        p.state.layers.size(), state_dtype_name(p.state.conv_dtype),
                        state_dtype_name(p.state.ssm_dtype));
  if (p.state.snapshots())
    line += fmt::format("; state snapshots (prefix caching): every {} blocks ({} tokens, --state-snapshot-interval), "
                        "{} slots = {}",
                        p.state.snapshot_interval, static_cast<int64_t>(p.state.snapshot_interval) * p.block_size,
                        p.state.snapshot_slots, format_bytes(p.state.snapshot_pool_bytes()));
  return line;
}

// ---- the memory budget ----

uint64_t weights_per_rank(uint64_t total_bytes, int tp) {
  if (tp <= 0) throw InputError(fmt::format("--tensor-parallel-size must be >= 1 (got {})", tp));
  return total_bytes / static_cast<uint64_t>(tp);
}

uint64_t estimate_parameters(const ModelConfig& c) {
  const auto u = [](auto v) { return static_cast<uint64_t>(v); };
  const auto mul = [](std::string_view what, std::initializer_list<Factor> f) { return checked_product(what, f); };
  const auto add = [](uint64_t a, uint64_t b) { return checked_add("parameter count", a, b); };
  const Factor h{"hidden_size", u(c.hidden_size)}, hd{"head_dim", u(c.head_dim)};
  const uint64_t q = mul("query width", {{"num_attention_heads", u(c.num_heads)}, hd});
  const uint64_t kv = mul("KV width", {{"num_key_value_heads", u(c.num_kv_heads)}, hd});
  const uint64_t embed = mul("embedding parameters", {{"vocab_size", u(c.vocab_size)}, h});
  const Factor inter{"intermediate_size", u(c.intermediate_size)};
  // q_proj also writes the output gate on gated attention (qwen3_5).
  const uint64_t q_rows = c.attn_output_gate ? 2 * q : q;
  uint64_t layer = add(add(mul("q/k/v parameters", {h, {"q + 2 x kv width", add(q_rows, 2 * kv)}}),
                           mul("o_proj parameters", {{"query width", q}, h})),
                       mul("MLP parameters", {{"gate, up, down", 3}, h, inter}));
  if (c.attention_bias) layer = add(layer, add(q, 2 * kv));
  if (c.o_proj_bias) layer = add(layer, u(c.hidden_size));
  if (c.mlp_bias) layer = add(layer, add(2 * u(c.intermediate_size), u(c.hidden_size)));
  if (c.qk_norm) layer = add(layer, 2 * u(c.head_dim));
  layer = add(layer, (c.sandwich_norms ? 4 : 2) * u(c.hidden_size));
  const uint64_t linear = c.gdn ? static_cast<uint64_t>(c.num_layers - c.num_attention_layers()) : 0;
  uint64_t total = add(embed * (c.tie_word_embeddings ? 1 : 2),
                       mul("layer parameters", {{"attention layers", u(c.num_layers) - linear},
                                                {"parameters per layer", layer}}));
  if (linear > 0) {
    // A Gated DeltaNet layer (model/weights.h): in_proj_qkv, in_proj_z,
    // in_proj_b, in_proj_a, out_proj, conv1d [C][K], A_log, dt_bias, the
    // gated norm [Dv]; its MLP and two norms as above.
    const GatedDeltaNetConfig& g = *c.gdn;
    const uint64_t C = u(g.conv_dim()), Vd = u(g.value_dim()), Hv = u(g.num_v_heads);
    uint64_t gl = add(mul("in_proj_qkv parameters", {{"conv_dim", C}, h}),
                      mul("in_proj_z and out_proj parameters", {{"2", 2}, {"value_dim", Vd}, h}));
    gl = add(gl, mul("in_proj_b and in_proj_a parameters", {{"2", 2}, {"linear_num_value_heads", Hv}, h}));
    gl = add(gl, mul("conv1d parameters", {{"conv_dim", C}, {"linear_conv_kernel_dim", u(g.conv_kernel)}}));
    gl = add(gl, add(2 * Hv, u(g.v_head_dim)));
    gl = add(gl, mul("MLP parameters", {{"gate, up, down", 3}, h, inter}));
    gl = add(gl, (c.sandwich_norms ? 4 : 2) * u(c.hidden_size));
    total = add(total, mul("linear_attention layer parameters", {{"linear_attention layers", linear},
                                                                 {"parameters per layer", gl}}));
  }
  return add(total, u(c.hidden_size));
}

uint64_t fp8_projection_savings(const ModelConfig& c, uint64_t elem_bytes) {
  const WeightQuantConfig& q = c.weight_quant;
  if (!q.quantized() || elem_bytes <= 1) return 0;
  // FP8-weight checkpoints (model/quant_config.h): every projection the
  // config quantizes at 1 byte per element plus its f32 scales.
  const uint64_t qw = static_cast<uint64_t>(c.num_heads) * c.head_dim, kvw = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
  const uint64_t H = c.hidden_size, I = c.intermediate_size;
  const std::pair<const char*, std::pair<uint64_t, uint64_t>> mats[] = {
      {"self_attn.q_proj", {qw, H}},  {"self_attn.k_proj", {kvw, H}}, {"self_attn.v_proj", {kvw, H}},
      {"self_attn.o_proj", {H, qw}},  {"mlp.gate_proj", {I, H}},      {"mlp.up_proj", {I, H}},
      {"mlp.down_proj", {H, I}}};
  uint64_t saved = 0;
  for (int l = 0; l < c.num_layers; ++l)
    for (const auto& [name, nk] : mats) {
      if (q.is_excluded(fmt::format("model.layers.{}.{}", l, name))) continue;
      const auto [sr, sc] = fp8_scale_shape(q.granularity, static_cast<int64_t>(nk.first), static_cast<int64_t>(nk.second));
      saved += nk.first * nk.second * (elem_bytes - 1);
      saved -= 4 * static_cast<uint64_t>(sr * sc);
    }
  return saved;
}

uint64_t estimate_weight_bytes(const ModelConfig& c) {
  const std::string& d = c.torch_dtype;
  const uint64_t bytes = d == "float32" || d == "fp32" ? 4 : d == "float8_e4m3fn" || d == "float8_e5m2" ? 1 : 2;
  const uint64_t total = checked_product("weight bytes", {{"parameters (from config.json)", estimate_parameters(c)},
                                                          {"torch_dtype bytes", bytes}});
  // The embedding, lm_head, norms and excluded modules stay at torch_dtype.
  return total - fp8_projection_savings(c, bytes);
}

std::string weight_estimate_source(const ModelConfig& c) {
  const WeightQuantConfig& q = c.weight_quant;
  if (!q.quantized()) return "estimate";
  return fmt::format("estimate: {} parameters; fp8 projections at 1 byte + {} f32 scales, the rest as {}",
                     estimate_parameters(c), scale_granularity_name(q.granularity),
                     c.torch_dtype.empty() ? "bfloat16" : c.torch_dtype);
}

uint64_t estimate_activation_bytes(const ModelConfig& c, int mnbt, int max_num_seqs, int tp) {
  if (mnbt < 1) throw InputError(fmt::format("--max-num-batched-tokens must be >= 1 (got {})", mnbt));
  if (max_num_seqs < 1) throw InputError(fmt::format("--max-num-seqs must be >= 1 (got {})", max_num_seqs));
  if (tp < 1) throw InputError(fmt::format("--tensor-parallel-size must be >= 1 (got {})", tp));
  const auto u = [](auto v) { return static_cast<uint64_t>(v); };
  const uint64_t t = u(tp);
  // Per token: residual + normed hidden, q/k/v + attention output (q-sized),
  // gate/up and their product; sizes come from config.json (< 2^31 each, so
  // these sums fit; the products below are checked).
  const uint64_t per_token = 2 * u(c.hidden_size) +
                             checked_product("attention width", {{"2 x (num_attention_heads + num_key_value_heads)",
                                                                  2 * u(c.num_heads) + 2 * u(c.num_kv_heads)},
                                                                 {"head_dim", u(c.head_dim)}}) / t +
                             3 * u(c.intermediate_size) / t;
  return checked_add("activation estimate",
                     checked_product("activation estimate", {{"--max-num-batched-tokens", u(mnbt)},
                                                             {"bf16 activation values per token", per_token},
                                                             {"bytes", 2}}),
                     checked_product("logits estimate", {{"--max-num-seqs", u(max_num_seqs)},
                                                         {"vocab_size", u(c.vocab_size)},
                                                         {"fp32 bytes", 4}}));
}

KvBudget kv_budget_from_gpu(const GpuMemoryInputs& in, const ModelConfig& cfg, const KvPlanSettings* probe) {
  if (!(in.utilization > 0.0 && in.utilization <= 1.0))
    throw InputError(fmt::format("{} must be in (0, 1] (got {})", in.utilization_flag, in.utilization));
  KvBudget b;
  b.source = in.gpu_memory_what.rfind("--", 0) == 0 ? in.gpu_memory_what : in.utilization_flag;
  b.from_gpu = true;
  b.gpu_memory_bytes = in.gpu_memory_bytes;
  b.gpu_memory_utilization = in.utilization;
  b.weights_bytes_per_rank = in.weights_bytes_per_rank;
  b.weights_source = in.weights_source;
  b.activation_bytes = in.activation_bytes;
  const auto usable = static_cast<uint64_t>(std::floor(static_cast<long double>(in.gpu_memory_bytes) * in.utilization));
  const uint64_t non_kv = checked_add("weights + activations", in.weights_bytes_per_rank, in.activation_bytes);
  const uint64_t kv_needed = probe ? kv_memory_needed(cfg, *probe) : 0;
  // GPU memory that would hold the weights, activations and one request.
  const auto gpu_needed = [&] {
    return static_cast<uint64_t>(
        std::ceil(static_cast<long double>(checked_add("GPU memory needed", non_kv, kv_needed)) / in.utilization));
  };
  if (usable <= non_kv)
    throw InputError(fmt::format(
        "{} {} x {} {} = {} leaves nothing for the KV cache: weights {} per rank ({}) + activations {} need {}; one "
        "request of max_model_len needs at least {} {} ({} bytes), or give --kv-memory directly",
        in.gpu_memory_what, format_bytes(in.gpu_memory_bytes), in.utilization_flag, in.utilization,
        format_bytes(usable), format_bytes(in.weights_bytes_per_rank), in.weights_source,
        format_bytes(in.activation_bytes), format_bytes(non_kv), in.gpu_memory_what, format_bytes(gpu_needed()),
        gpu_needed()));
  b.kv_memory_bytes = usable - non_kv;
  if (kv_needed > b.kv_memory_bytes) {
    KvPlanSettings fit = *probe;
    fit.kv_memory_bytes = b.kv_memory_bytes;
    const int64_t fits = max_model_len_that_fits(cfg, fit);
    // No context fits when a linear-attention model's state pool alone
    // exceeds the budget: then the lever is the number of sequences.
    const StatePlan sp = plan_state(cfg, probe->max_num_seqs, probe->tensor_parallel_size, probe->conv_state_dtype,
                                    probe->ssm_state_dtype);
    const std::string lever =
        fits > 0 || sp.empty()
            ? fmt::format("a --max-model-len of at most {}", fits)
            : fmt::format("a smaller --max-num-seqs (the linear-attention state pool of {} sequences takes {} of it)",
                          probe->max_num_seqs, format_bytes(sp.pool_bytes()));
    throw InputError(fmt::format(
        "{} {} leaves {} ({} bytes) for the KV cache after weights {} ({}) and activations {}; one "
        "request of max_model_len needs {} ({} bytes): give {} of at least {} ({} bytes), or {}",
        in.gpu_memory_what, format_bytes(in.gpu_memory_bytes), format_bytes(b.kv_memory_bytes), b.kv_memory_bytes,
        format_bytes(in.weights_bytes_per_rank), in.weights_source, format_bytes(in.activation_bytes),
        format_bytes(kv_needed), kv_needed, in.gpu_memory_what, format_bytes(gpu_needed()), gpu_needed(), lever));
  }
  return b;
}

KvBudget default_cpu_kv_budget(const ModelConfig& cfg, const KvPlanSettings& s, uint64_t physical_memory,
                               std::string_view memory_what) {
  KvBudget b;
  b.source = "the default KV budget";
  const uint64_t one = kv_memory_needed(cfg, s);
  // vLLM's rule: the pool must hold one request of max_model_len. When even
  // that exceeds the machine's memory, say so now, by arithmetic, rather than
  // reserve it and fail (or be killed) later (issue 37 B, "Resources").
  if (physical_memory > 0 && one > physical_memory) {
    KvPlanSettings fit = s;
    fit.kv_memory_bytes = physical_memory;
    const int most = max_model_len_that_fits(cfg, fit);
    const KvPlan p = plan_structure(cfg, s);
    throw InputError(fmt::format(
        "max_model_len {} ({}) needs {} ({} bytes) of {} KV cache for one request ({} blocks of {} bytes{}), more "
        "than {}: {} ({} bytes); {}",
        p.max_model_len, max_model_len_origin(cfg, s), format_bytes(one), one, kv_dtype_name(p.dtype),
        p.blocks_per_request, p.page_bytes,
        p.state.empty() ? "" : fmt::format(" + the state pool {} bytes", p.state.pool_bytes()), memory_what,
        format_bytes(physical_memory), physical_memory,
        most > 0 ? fmt::format("give --max-model-len {} or less", most)
        : p.state.pool_bytes() < physical_memory
            ? fmt::format("not even a 1-token request fits: it takes a block in each of the {} KV-cache group(s), "
                          "{} bytes each (--block-size {}): lower --block-size",
                          p.groups.size(), p.page_bytes, p.block_size)
            : fmt::format("not even the linear-attention state pool fits ({} bytes for --max-num-seqs {}): lower "
                          "--max-num-seqs",
                          p.state.pool_bytes(), p.state.num_slots)));
  }
  // Saturating: the cap below bounds the result, a product past 2^64 only means "more than the cap".
  const unsigned __int128 want = static_cast<unsigned __int128>(one) * static_cast<uint64_t>(std::max(s.max_num_seqs, 1));
  uint64_t w = want > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                           : static_cast<uint64_t>(want);
  const uint64_t cap = physical_memory / 4;
  if (cap > 0) w = std::min(w, std::max(one, cap));
  b.kv_memory_bytes = w;
  return b;
}

std::string format_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", b);
  return fmt::format("{:.2f} {}", v, units[u]);
}

uint64_t parse_size(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return InputError(fmt::format("invalid size '{}': {} (expected e.g. 80GiB, 512MiB, 80GB or plain bytes)",
                                  text, why));
  };
  size_t i = 0;
  const size_t n = text.size();
  while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i < n && (text[i] == '-' || text[i] == '+')) {
    if (text[i] == '-') throw bad("sizes cannot be negative");
    ++i;
  }
  unsigned __int128 int_part = 0;
  bool any_digit = false;
  const unsigned __int128 cap = static_cast<unsigned __int128>(1) << 64;  // x unit (< 2^40) stays < 2^128
  while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) {
    int_part = int_part * 10 + static_cast<unsigned>(text[i] - '0');
    if (int_part > cap) throw bad("too large");
    any_digit = true;
    ++i;
  }
  unsigned __int128 frac = 0, frac_den = 1;
  if (i < n && text[i] == '.') {
    ++i;
    while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (frac_den < static_cast<unsigned __int128>(1) << 60) {  // ignore digits past ~18
        frac = frac * 10 + static_cast<unsigned>(text[i] - '0');
        frac_den *= 10;
      }
      any_digit = true;
      ++i;
    }
  }
  if (!any_digit) throw bad("no number");
  while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < n; ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(text[i]))));
  }
  while (i < n && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != n) throw bad("unexpected trailing text");

  struct Unit {
    const char* name;
    uint64_t mult;
  };
  static const Unit units[] = {
      {"", 1},
      {"b", 1},
      {"kib", 1ull << 10},
      {"mib", 1ull << 20},
      {"gib", 1ull << 30},
      {"tib", 1ull << 40},
      {"kb", 1000ull},
      {"mb", 1000ull * 1000},
      {"gb", 1000ull * 1000 * 1000},
      {"tb", 1000ull * 1000 * 1000 * 1000},
  };
  const Unit* u = nullptr;
  for (const auto& c : units)
    if (unit == c.name) u = &c;
  if (!u) throw bad(fmt::format("unknown unit '{}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", unit));
  const unsigned __int128 bytes = int_part * u->mult + frac * u->mult / frac_den;
  if (frac != 0 && (frac * u->mult) % frac_den != 0)
    throw bad("not a whole number of bytes");
  if (bytes > std::numeric_limits<uint64_t>::max()) throw bad("too large");
  return static_cast<uint64_t>(bytes);
}

}  // namespace fp8kv
