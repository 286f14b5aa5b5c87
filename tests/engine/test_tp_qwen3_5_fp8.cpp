// Tensor parallelism for the two model classes that ran on one rank before
// (engine/tp_shard.h; docs/design.md "Tensor parallelism"), on the CPU rank
// simulation:
//   Qwen3.5 hybrids: the Gated DeltaNet heads shard like attention heads;
//     TP 2 and 4 equal TP 1 within the bound test_tp.cpp derives, for bf16
//     and fp8 caches, prefill, decode and batched steps; the state pool is
//     per rank; per-rank dummy weights are the shard of the full dummy
//     model; linear heads that do not divide are refused by name.
//   FP8-weight checkpoints (block 128x128, compressed-tensors channel /
//     tensor, ModelOpt), W8A16 and W8A8: TP 2 and 4 against TP 1; a rank's
//     shard of each matrix dequantizes to the slice of the full dequantized
//     matrix; block cuts off a 128 boundary are refused naming the matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include "../common/errors.h"
#include "../common/temp_dir.h"
#include "engine/dummy_weights.h"
#include "engine/engine.h"
#include "engine/tp_shard.h"
#include "fp8_checkpoint.h"
#include "hf_golden.h"
#include "reference.h"
#include "weights_compare.h"
#include "io/errors.h"
#include "io/fs_util.h"
#include "kv/planner.h"
#include "model/quant_config.h"
#include "model/weights.h"
#include "numerics/fp8.h"
#include "numerics/fp8_weights.h"

namespace fp8kv {
namespace {

using testing::expect_dummy_shards_equal;
using testing::logits_of;
using testing::Fp8CheckpointOptions;
using testing::Fp8Format;
using testing::write_fp8_checkpoint;

// ---- shared helpers ----

using Logits = std::vector<std::vector<float>>;

struct Diff {
  double max_abs = 0.0;
  int top1_mismatches = 0;
};

Diff compare(const Logits& ref, const Logits& got) {
  Diff d;
  EXPECT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    EXPECT_EQ(got[i].size(), ref[i].size());
    int a = 0, b = 0;
    for (size_t j = 0; j < ref[i].size(); ++j) {
      d.max_abs = std::max(d.max_abs, static_cast<double>(std::abs(got[i][j] - ref[i][j])));
      if (ref[i][j] > ref[i][a]) a = static_cast<int>(j);
      if (got[i][j] > got[i][b]) b = static_cast<int>(j);
    }
    d.top1_mismatches += a != b;
  }
  return d;
}

std::vector<int> tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = 3 + static_cast<int>(rng() % static_cast<uint64_t>(vocab - 3));
  return t;
}

// The bound (test_tp.cpp derives it): TP reorders the fp32 sums of the
// row-parallel projections (o_proj, down_proj, out_proj: N partial sums
// added in rank order), a few 1e-6 on the logits; a cache value within that
// of a rounding boundary can be stored as the neighbouring code, which moves
// the logits by up to ~1e-3..2e-3 (bf16) or ~1e-2 (e4m3). Bound: one flipped
// code, 1e-2 (bf16 cache) and 5e-2 (e4m3), and the same top-1 everywhere.
double cache_bound(const std::string& dtype) { return dtype == "bf16" ? 1e-2 : 5e-2; }

// ---- Qwen3.5 ----

// 4 layers (linear, linear, full, linear), 4 query / 2 KV heads, 4 key / 8
// value linear heads: TP 2 and 4 split every head kind, TP 4 replicates the
// KV heads; vocab 64 is vocab-parallel.
nlohmann::json qwen3_5_json(int lin_k = 4, int lin_v = 8) {
  nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "vocab_size": 64, "max_position_embeddings": 512, "eos_token_id": 2,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
  })");
  j["linear_num_key_heads"] = lin_k;
  j["linear_num_value_heads"] = lin_v;
  return j;
}

ModelConfig qwen3_5_cfg(int lin_k = 4, int lin_v = 8) {
  return parse_model_config(qwen3_5_json(lin_k, lin_v), "config.json");
}

EngineOptions q_opts(const std::string& dtype, int tp) {
  EngineOptions o;
  o.backend = BackendChoice::cpu;
  o.kv_cache_dtype = dtype;
  o.block_size = 4;
  o.max_model_len = 96;
  o.max_num_batched_tokens = 32;
  o.max_num_seqs = 4;
  o.kv_memory_bytes = 4u << 20;
  o.tensor_parallel_size = tp;
  return o;
}

std::unique_ptr<Engine> q_make(const ModelConfig& cfg, std::shared_ptr<const ModelWeights> w, const std::string& dtype,
                               int tp) {
  return testing::create_engine(cfg, std::move(w), q_opts(dtype, tp));
}

class Qwen3_5Tp : public ::testing::TestWithParam<std::string> {};

// Prefill in chunks of 7 (the Gated DeltaNet's chunked form, its state
// carried between chunks on each rank).
TEST_P(Qwen3_5Tp, ScoreEqualsTp1WithinTheBound) {
  const std::string dtype = GetParam();
  const ModelConfig cfg = qwen3_5_cfg();
  auto w = ModelWeights::random(cfg, 17, 0.15f, true);
  const auto toks = tokens(40, cfg.vocab_size, 3);
  const Logits ref = logits_of(*q_make(cfg, w, dtype, 1), toks, 7);
  for (int tp : {2, 4}) {
    auto e = q_make(cfg, w, dtype, tp);
    const Diff d = compare(ref, logits_of(*e, toks, 7));
    EXPECT_EQ(d.top1_mismatches, 0) << "tp " << tp;
    EXPECT_LE(d.max_abs, cache_bound(dtype)) << dtype << " tp " << tp;
    std::printf("[tp] qwen3_5 %s tp=%d max|dlogit| = %.3g\n", dtype.c_str(), tp, d.max_abs);
  }
}

// Decode (the recurrent form, one state per sequence and rank) after a
// prefill, greedy: the same tokens.
TEST_P(Qwen3_5Tp, GreedyGenerationGivesTheSameTokens) {
  const std::string dtype = GetParam();
  const ModelConfig cfg = qwen3_5_cfg();
  auto w = ModelWeights::random(cfg, 5, 0.15f, true);
  testing::expect_greedy_same_at_tp([&](int tp) { return q_make(cfg, w, dtype, tp); }, tokens(11, cfg.vocab_size, 9));
}

INSTANTIATE_TEST_SUITE_P(Caches, Qwen3_5Tp, ::testing::Values("bf16", "fp8_e4m3"));

// Three sequences stepped together: each holds a state slot on every rank.
TEST(Qwen3_5TpEngine, BatchedStepsMatchTp1) {
  const ModelConfig cfg = qwen3_5_cfg();
  auto w = ModelWeights::random(cfg, 8, 0.15f, true);
  auto run = [&](int tp) {
    auto e = q_make(cfg, w, "fp8_e4m3", tp);
    for (int i = 0; i < 3; ++i) {
      GenerateOptions g;
      g.max_tokens = 8 + i;
      g.stop_at_eos = false;
      e->submit(Request{tokens(5 + 7 * i, cfg.vocab_size, 20 + i), g});
    }
    std::map<RequestId, std::vector<int>> out;
    while (!e->idle())
      for (const auto& ev : e->step())
        if (ev.token >= 0) out[ev.id].push_back(ev.token);
    return out;
  };
  const auto ref = run(1);
  ASSERT_EQ(ref.size(), 3u);
  EXPECT_EQ(run(2), ref);
}

// The state pool holds each rank's heads: the planner's per-rank plan (the
// engine's log line is `fp8kv capacity`'s for the same TP size).
TEST(Qwen3_5TpEngine, StatePoolIsPerRank) {
  const ModelConfig cfg = qwen3_5_cfg();
  auto w = ModelWeights::random(cfg, 1, 0.1f, true);
  uint64_t tp1_bytes = 0;
  for (int tp : {1, 2, 4}) {
    auto e = q_make(cfg, w, "bf16", tp);
    const KvPlan& p = e->kv_plan();
    EXPECT_EQ(p.state.num_k_heads, 4 / tp);
    EXPECT_EQ(p.state.num_v_heads, 8 / tp);
    EXPECT_EQ(p.state.conv_dim, cfg.gdn->conv_dim() / tp);
    if (tp == 1) tp1_bytes = p.state.bytes_per_sequence();
    EXPECT_EQ(p.state.bytes_per_sequence() * static_cast<uint64_t>(tp), tp1_bytes) << "tp " << tp;
    KvPlanSettings s;
    s.kv_memory_bytes = 4u << 20;
    s.max_model_len = 96;
    s.max_num_batched_tokens = 32;
    s.max_num_seqs = 4;
    s.block_size = 4;
    s.dtype = KvDtype::bf16;
    s.tensor_parallel_size = tp;
    s.prefix_caching = EngineOptions{}.enable_prefix_caching;  // the engine's default: the snapshot pool too
    EXPECT_EQ(kv_plan_log_line(p), kv_plan_log_line(plan_kv_cache(cfg, s))) << "tp " << tp;
  }
}

// Linear heads that a TP size does not divide: InputError (exit 2 on the
// CLI) naming both fields, from Engine::create and before any weight is
// made on Engine::load.
TEST(Qwen3_5TpEngine, LinearHeadsThatDoNotDivideAreRefusedByName) {
  const ModelConfig cfg =
      qwen3_5_cfg(2, 4);  // attention heads 4 / 2 fit TP 4 (KV replicated); linear key heads 2 do not
  auto w = ModelWeights::random(cfg, 1, 0.1f, true);
  const std::string want =
      "--tensor-parallel-size 4 does not divide linear_num_key_heads 2 and linear_num_value_heads 4";
  std::string m = test_util::input_error_of([&] { Engine::create(cfg, w, q_opts("bf16", 4)); });
  EXPECT_NE(m.find(want), std::string::npos) << m;
  test_util::TempDir tmp;
  atomic_write_file(tmp.path() / "config.json", qwen3_5_json(2, 4).dump());
  EngineOptions o = q_opts("bf16", 4);
  o.load_format = LoadFormat::dummy;
  m = test_util::input_error_of([&] { Engine::load(tmp.path(), o); });
  EXPECT_NE(m.find(want), std::string::npos) << m;
  EXPECT_NO_THROW(Engine::create(cfg, w, q_opts("bf16", 2)));  // 2 divides both
}

TEST(Qwen3_5TpShard, DummyWeightsShardEqualsShardOfFullDummy) {
  const ModelConfig cfg = qwen3_5_cfg();
  for (int world : {2, 4}) expect_dummy_shards_equal(cfg, world, "qwen3_5");
  // The shard is what the sharding rule says: rank 1 of 2 holds key heads
  // 2..3 and value heads 4..7 (Dk = Dv = 8) of in_proj_qkv's q | k | v.
  const auto full = dummy_weights(cfg, 3);
  const auto s = shard_weights(full, cfg, TpShard{1, 2});
  const WeightMatrix &a = full->layers[0].in_proj_qkv, &b = s->layers[0].in_proj_qkv;
  ASSERT_EQ(b.rows, 16 + 16 + 32);
  const auto* fa = static_cast<const uint16_t*>(a.data);
  const auto* fb = static_cast<const uint16_t*>(b.data);
  const int64_t H = cfg.hidden_size;
  const std::pair<int64_t, int64_t> segs[] = {{16, 16}, {32 + 16, 16}, {64 + 32, 32}};  // [start, count) of full rows
  int64_t row = 0;
  for (const auto& [r0, n] : segs)
    for (int64_t r = r0; r < r0 + n; ++r, ++row)
      EXPECT_EQ(0, std::memcmp(fb + row * H, fa + r * H, static_cast<size_t>(H) * 2)) << "shard row " << row;
  EXPECT_EQ(s->layers[0].A_log, std::vector<float>(full->layers[0].A_log.begin() + 4, full->layers[0].A_log.end()));
  EXPECT_EQ(s->layers[0].gdn_norm, full->layers[0].gdn_norm);  // replicated
  // The gated q_proj (layer 2): 2 D rows per head, query then gate; rank 1 holds heads 2..3.
  EXPECT_EQ(s->layers[2].q_proj.rows, 2 * 2 * 16);
  EXPECT_EQ(s->layers[2].q_proj.data, static_cast<const uint16_t*>(full->layers[2].q_proj.data) + 2 * 2 * 16 * H);
}

// `--load-format dummy` at TP 2 (each rank makes its own shard) against TP 1.
TEST(Qwen3_5TpEngine, DummyLoadPerRankMatchesTp1) {
  test_util::TempDir tmp;
  atomic_write_file(tmp.path() / "config.json", qwen3_5_json().dump());
  EngineOptions o = q_opts("bf16", 1);
  o.load_format = LoadFormat::dummy;
  const auto toks = tokens(24, 64, 4);
  const Logits ref = logits_of(*Engine::load(tmp.path(), o), toks, 0);
  o.tensor_parallel_size = 2;
  const Diff d = compare(ref, logits_of(*Engine::load(tmp.path(), o), toks, 0));
  EXPECT_EQ(d.top1_mismatches, 0);
  EXPECT_LE(d.max_abs, cache_bound("bf16"));
}

// Per-rank loading of real Qwen3.5 checkpoints (transformers' layout,
// `model.language_model.*`; tests/golden/models_qwen3_5, whose linear heads
// 2 / 4 split at TP 2): every rank cuts its shard from the mapped file.
// TP 2 against TP 1 on the goldens' sequences, logprobs (a logprob moves by
// at most twice the largest logit move): the bf16-cache bound, top-1 equal.
TEST(Qwen3_5TpEngine, GoldenCheckpointsTp2MatchTp1) {
  for (const char* c : {"l1f1_hd256", "l3f1_hd64"}) {
    const std::filesystem::path dir = testing::qwen3_5_golden_dir(c);
    nlohmann::json g;
    if (!testing::load_qwen3_5_golden(c, g)) GTEST_SKIP() << dir << " missing (tools/gen_gdn_goldens.py)";
    const std::vector<std::vector<int>> seqs = testing::golden_sequences(g);
    EngineOptions o = q_opts("bf16", 1);
    o.max_model_len = 128;
    o.kv_memory_bytes = 64u << 20;
    ScoreOptions so;
    so.chunk_size = 48;
    const auto a = Engine::load(dir, o)->score_batch(seqs, so);
    o.tensor_parallel_size = 2;
    const auto b = Engine::load(dir, o)->score_batch(seqs, so);
    double mx = 0;
    for (size_t q = 0; q < seqs.size(); ++q)
      for (size_t p = 1; p < seqs[q].size(); ++p) {
        mx = std::max(mx, std::fabs(*a[q].logprobs[p] - *b[q].logprobs[p]));
        EXPECT_EQ(*a[q].top1_ids[p], *b[q].top1_ids[p]) << c << " seq " << q << " pos " << p;
      }
    std::printf("[tp] qwen3_5 golden %s: TP 2 vs TP 1 max |dlogprob| %.3g\n", c, mx);
    EXPECT_LE(mx, 2 * cache_bound("bf16")) << c;
  }
}

// ---- FP8-weight checkpoints ----

// A shape whose block cuts are whole 128 blocks at TP 2 and 4: head_dim
// 128 (q_proj 512 rows, k/v 256: at TP 4 each rank holds one replicated KV
// head, rows [0, 128) or [128, 256)), intermediate 512; hidden 160 keeps a
// partial 32-column block; vocab 212 makes the LM head vocab-parallel (fp8
// in the ct_tensor checkpoint).
void aligned_shape(nlohmann::json& j) {
  j["head_dim"] = 128;
  j["intermediate_size"] = 512;
  j["vocab_size"] = 212;
}

class Fp8Tp : public ::testing::TestWithParam<std::tuple<Fp8Format, Fp8Compute>> {};

// W8A16: every rank's GEMM dequantizes its shard to exactly the values of
// TP 1's (the shard test below), so TP only reorders the row-parallel sums:
// the bf16-cache bound, and the same top-1.
// W8A8 rounds every GEMM input to e4m3 first, which moves the logits from
// W8A16's by D (measured here at TP 1). With 128x128 blocks the 1x128
// activation groups are the same at every TP size (the row-parallel cuts
// are whole blocks), so only an activation within the reordering's 1e-6 of
// a rounding tie rounds differently: one e4m3 step on that element (twice
// the half step W8A8 applies to every element at once; observed 7e-7 at
// TP 2, 0.054 at TP 4 when one flips); the top-1 must agree. With
// per-token activations (channel, tensor scales) a row-parallel rank
// quantizes its own K / N columns of each token with their own amax, as
// vLLM does: a scale no larger than TP 1's over all K, so every element
// rounds by at most what TP 1's W8A8 rounds it by, and the two differ by at
// most about twice TP 1's effect; the top-1 may differ. W8A8 bound: 2 D +
// the reorder bound.
TEST_P(Fp8Tp, ScoreEqualsTp1WithinTheBound) {
  const auto [format, mode] = GetParam();
  test_util::TempDir tmp;
  Fp8CheckpointOptions co;
  co.format = format;
  co.edit_config = aligned_shape;
  write_fp8_checkpoint(tmp.path(), co);
  const auto toks = tokens(20, 212, 3);
  const Logits ref = logits_of(*Engine::load(tmp.path(), testing::fp8_engine_options(mode, 1)), toks, 0);
  const bool per_token = mode == Fp8Compute::w8a8 && format != Fp8Format::block;
  double bound = cache_bound("bf16");
  if (mode == Fp8Compute::w8a8) {
    const Logits a16 = logits_of(*Engine::load(tmp.path(), testing::fp8_engine_options(Fp8Compute::w8a16, 1)), toks, 0);
    const double D = compare(a16, ref).max_abs;
    EXPECT_GT(D, 0.0);
    bound += 2.0 * D;
  }
  for (int tp : {2, 4}) {
    const Diff d = compare(ref, logits_of(*Engine::load(tmp.path(), testing::fp8_engine_options(mode, tp)), toks, 0));
    if (!per_token) {
      EXPECT_EQ(d.top1_mismatches, 0) << "tp " << tp;
    }
    EXPECT_LE(d.max_abs, bound) << "tp " << tp;
    std::printf("[tp] fp8 %s %s tp=%d max|dlogit| = %.3g (bound %.3g, top-1 mismatches %d)\n",
                testing::fp8_format_name(format), std::string(fp8_compute_name(mode)).c_str(), tp, d.max_abs, bound,
                d.top1_mismatches);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Tp,
                         ::testing::Combine(::testing::Values(Fp8Format::block, Fp8Format::ct_channel,
                                                              Fp8Format::ct_tensor, Fp8Format::modelopt),
                                            ::testing::Values(Fp8Compute::w8a16, Fp8Compute::w8a8)),
                         [](const auto& info) {
                           return std::string(testing::fp8_format_name(std::get<0>(info.param))) + "_" +
                                  std::string(fp8_compute_name(std::get<1>(info.param)));
                         });

// Qwen3.5 with fp8 Gated DeltaNet projections: the aligned shape with 4 key
// and 4 value heads of 128 (in_proj_qkv [1536, 160]: q, k and v cut into
// whole 128-row blocks at TP 2 and 4; in_proj_z [512, 160]; out_proj's
// columns 512), in_proj_a / in_proj_b kept bf16 (4 rows: a shard would cut
// inside one block, refused below). Block scales, both modes, the bound of
// Fp8Tp above (the same arithmetic argument: the Gated DeltaNet layer's
// projections are linear ops like the others, and its rule is per head).
void aligned_qwen3_5_shape(nlohmann::json& j) {
  aligned_shape(j);
  j["linear_key_head_dim"] = 128;
  j["linear_value_head_dim"] = 128;
  j["linear_num_key_heads"] = 4;
  j["linear_num_value_heads"] = 4;
}

// fp8_engine_options with 4 sequences (the state pool of 256 would not fit
// the 8 MiB budget).
EngineOptions qwen3_5_fp8_options(Fp8Compute mode, int tp) {
  EngineOptions o = testing::fp8_engine_options(mode, tp);
  o.max_num_seqs = 4;
  return o;
}

class Qwen3_5Fp8Tp : public ::testing::TestWithParam<Fp8Compute> {};

TEST_P(Qwen3_5Fp8Tp, ScoreEqualsTp1WithinTheBound) {
  const Fp8Compute mode = GetParam();
  test_util::TempDir tmp;
  Fp8CheckpointOptions co;
  co.family = "qwen3_5";
  co.format = Fp8Format::block;
  co.edit_config = aligned_qwen3_5_shape;
  co.keep_bf16 = {"in_proj_a", "in_proj_b"};
  write_fp8_checkpoint(tmp.path(), co);
  const auto toks = tokens(20, 212, 5);
  const Logits ref = logits_of(*Engine::load(tmp.path(), qwen3_5_fp8_options(mode, 1)), toks, 0);
  double bound = cache_bound("bf16");
  if (mode == Fp8Compute::w8a8) {
    const Logits a16 = logits_of(*Engine::load(tmp.path(), qwen3_5_fp8_options(Fp8Compute::w8a16, 1)), toks, 0);
    const double D = compare(a16, ref).max_abs;
    EXPECT_GT(D, 0.0);
    bound += 2.0 * D;
  }
  for (int tp : {2, 4}) {
    const Diff d = compare(ref, logits_of(*Engine::load(tmp.path(), qwen3_5_fp8_options(mode, tp)), toks, 0));
    EXPECT_EQ(d.top1_mismatches, 0) << "tp " << tp;
    EXPECT_LE(d.max_abs, bound) << "tp " << tp;
    std::printf("[tp] qwen3_5 fp8 block %s tp=%d max|dlogit| = %.3g (bound %.3g)\n",
                std::string(fp8_compute_name(mode)).c_str(), tp, d.max_abs, bound);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, Qwen3_5Fp8Tp, ::testing::Values(Fp8Compute::w8a16, Fp8Compute::w8a8),
                         [](const auto& info) { return std::string(fp8_compute_name(info.param)); });

// in_proj_a / in_proj_b quantized block-wise: their 4 rows cut at row 2 at
// TP 2, inside one 128-row block; refused naming the matrix, from the
// checkpoint and from the config alone (the check --load-format dummy runs
// before making shards). TP 1 runs it.
TEST(Qwen3_5Fp8TpShard, SubBlockCutOfInProjABIsRefused) {
  test_util::TempDir tmp;
  Fp8CheckpointOptions co;
  co.family = "qwen3_5";
  co.format = Fp8Format::block;
  co.edit_config = aligned_qwen3_5_shape;
  write_fp8_checkpoint(tmp.path(), co);
  std::string m =
      test_util::input_error_of([&] { Engine::load(tmp.path(), qwen3_5_fp8_options(Fp8Compute::w8a16, 2)); });
  EXPECT_NE(m.find("linear_attn.in_proj_"), std::string::npos) << m;
  EXPECT_NE(m.find("rows [0, 2)"), std::string::npos) << m;
  nlohmann::json j = testing::fp8_test_config("qwen3_5");
  aligned_qwen3_5_shape(j);
  j["quantization_config"] = testing::fp8_quant_json(Fp8Format::block);
  const ModelConfig cfg = parse_model_config(j, "config.json");
  m = test_util::input_error_of([&] { check_fp8_block_shards(cfg, 2); });
  EXPECT_NE(m.find("linear_attn.in_proj_"), std::string::npos) << m;
  EXPECT_NO_THROW(Engine::load(tmp.path(), qwen3_5_fp8_options(Fp8Compute::w8a16, 1)));
}

// The config of the aligned shape with a quantization_config of `format`
// (the checkpoint writer's, minus its exclusions unless kept).
ModelConfig fp8_cfg(Fp8Format format, bool aligned = true) {
  nlohmann::json j = testing::fp8_test_config("llama");
  if (aligned) aligned_shape(j);
  j["quantization_config"] = testing::fp8_quant_json(format == Fp8Format::modelopt ? Fp8Format::ct_tensor : format);
  return parse_model_config(j, "config.json");
}

// Every element of W [N][K], dequantized (numerics/fp8_weights.h).
std::vector<float> dequantized(const WeightMatrix& m) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  const Fp8WeightScales s{m.scales->data(), m.scale_granularity};
  dequantize_fp8_weight_rows(static_cast<const uint8_t*>(m.data), s, m.rows, m.cols, 0, m.rows, out.data());
  return out;
}

// A rank's shard of each fp8 matrix dequantizes to exactly the matching
// slice of the full dequantized matrix: rows for column-parallel matrices,
// columns for row-parallel ones (block scales moved with their blocks,
// channel scales with their rows, a tensor scale replicated).
TEST(Fp8TpShard, RankShardDequantizesToTheSliceOfTheFullMatrix) {
  for (Fp8Format f : {Fp8Format::block, Fp8Format::ct_channel, Fp8Format::ct_tensor}) {
    const ModelConfig cfg = fp8_cfg(f);
    const auto full = dummy_weights(cfg, 5);
    for (int world : {2, 4}) {
      for (int r = 0; r < world; ++r) {
        const auto s = shard_weights(full, cfg, TpShard{r, world});
        const int64_t D = cfg.head_dim, nq = cfg.num_heads / world * D, I = cfg.intermediate_size / world;
        const int64_t nk = D * std::max(1, cfg.num_kv_heads / world);
        const int64_t k0 = static_cast<int64_t>(first_kv_head(cfg, TpShard{r, world})) * D;
        struct Case {
          const char* name;
          WeightMatrix LayerWeights::*m;
          bool columns;
          int64_t start, count;
        };
        const Case cases[] = {{"q_proj", &LayerWeights::q_proj, false, r * nq, nq},
                              {"k_proj", &LayerWeights::k_proj, false, k0, nk},
                              {"v_proj", &LayerWeights::v_proj, false, k0, nk},
                              {"o_proj", &LayerWeights::o_proj, true, r * nq, nq},
                              {"gate_proj", &LayerWeights::gate_proj, false, r * I, I},
                              {"up_proj", &LayerWeights::up_proj, false, r * I, I},
                              {"down_proj", &LayerWeights::down_proj, true, r * I, I}};
        for (size_t l = 0; l < full->layers.size(); ++l)
          for (const Case& c : cases) {
            const WeightMatrix &a = full->layers[l].*c.m, &b = s->layers[l].*c.m;
            const std::string at = std::string(testing::fp8_format_name(f)) + " world " + std::to_string(world) +
                                   " rank " + std::to_string(r) + " layer " + std::to_string(l) + " " + c.name;
            if (!a.fp8) {  // excluded by the config (block: layers.1.mlp.down_proj)
              EXPECT_FALSE(b.fp8) << at;
              continue;
            }
            ASSERT_TRUE(b.fp8) << at;
            const auto [sr, sc] = fp8_scale_shape(b.scale_granularity, b.rows, b.cols);
            ASSERT_EQ(b.scales->size(), static_cast<size_t>(sr * sc)) << at;
            const std::vector<float> fa = dequantized(a), fb = dequantized(b);
            ASSERT_EQ(b.rows, c.columns ? a.rows : c.count) << at;
            ASSERT_EQ(b.cols, c.columns ? c.count : a.cols) << at;
            int64_t differ = 0;
            for (int64_t i = 0; i < b.rows; ++i)
              for (int64_t j = 0; j < b.cols; ++j)
                differ +=
                    fb[i * b.cols + j] != (c.columns ? fa[i * a.cols + c.start + j] : fa[(c.start + i) * a.cols + j]);
            EXPECT_EQ(differ, 0) << at;
          }
        // The vocab-parallel LM head stays bf16 in dummy weights; its rows are the full head's.
        ASSERT_TRUE(s->lm_head.has_value());
        EXPECT_EQ(s->lm_head->rows, cfg.vocab_size / world);
      }
      expect_dummy_shards_equal(cfg, world, testing::fp8_format_name(f));
    }
  }
}

// Block cuts off a 128 boundary: InputError naming the matrix, its shape,
// the TP size, the rank's rows or columns and the 128 block, before any
// weight is made (dummy) or read (a checkpoint; test_fp8_weights.cpp).
TEST(Fp8TpShard, BlockCutsOffA128BoundaryAreRefused) {
  // head_dim 40: q_proj [160, 160], 80 rows per rank at TP 2.
  const ModelConfig cfg = fp8_cfg(Fp8Format::block, /*aligned=*/false);
  const std::string rows =
      "--tensor-parallel-size 2: fp8 weight model.layers.0.self_attn.q_proj.weight [160, 160] has 128x128 block "
      "scales, and rank 0's column-parallel shard of it, rows [0, 80), does not start and end on a 128-row block "
      "boundary";
  std::string m = test_util::input_error_of([&] { check_fp8_block_shards(cfg, 2); });
  EXPECT_NE(m.find(rows), std::string::npos) << m;
  m = test_util::input_error_of([&] { check_fp8_block_shards(*dummy_weights(cfg, 1), cfg, 2); });
  EXPECT_NE(m.find(rows), std::string::npos) << m;
  m = test_util::input_error_of([&] { shard_weights(dummy_weights(cfg, 1), cfg, TpShard{1, 2}); });
  EXPECT_NE(m.find("rank 1's column-parallel shard of it, rows [80, 160)"), std::string::npos) << m;
  // Row-parallel: only o_proj and down_proj quantized (the others excluded):
  // o_proj [160, 160]'s columns [0, 80) at TP 2.
  nlohmann::json j = testing::fp8_test_config("llama");
  j["quantization_config"] = testing::fp8_quant_json(Fp8Format::block);
  j["quantization_config"]["modules_to_not_convert"] = {"lm_head", "q_proj", "k_proj", "v_proj", "gate_proj",
                                                        "up_proj"};
  const ModelConfig c2 = parse_model_config(j, "config.json");
  const std::string cols =
      "--tensor-parallel-size 2: fp8 weight model.layers.0.self_attn.o_proj.weight [160, 160] has 128x128 block "
      "scales, and rank 0's row-parallel shard of it, columns [0, 80), does not start and end on a 128-column block "
      "boundary";
  m = test_util::input_error_of([&] { check_fp8_block_shards(c2, 2); });
  EXPECT_NE(m.find(cols), std::string::npos) << m;
  m = test_util::input_error_of([&] { check_fp8_block_shards(*dummy_weights(c2, 1), c2, 2); });
  EXPECT_NE(m.find(cols), std::string::npos) << m;
  // The same shapes with channel or tensor scales shard anywhere.
  EXPECT_NO_THROW(check_fp8_block_shards(fp8_cfg(Fp8Format::ct_channel, false), 2));
  EXPECT_NO_THROW(check_fp8_block_shards(*dummy_weights(fp8_cfg(Fp8Format::ct_tensor, false), 1),
                                         fp8_cfg(Fp8Format::ct_tensor, false), 4));
  // `--load-format dummy` refuses before any rank makes its shard.
  test_util::TempDir tmp;
  atomic_write_file(tmp.path() / "config.json", j.dump());
  EngineOptions o = testing::fp8_engine_options(Fp8Compute::w8a16, 2);
  o.load_format = LoadFormat::dummy;
  m = test_util::input_error_of([&] { Engine::load(tmp.path(), o); });
  EXPECT_NE(m.find(cols), std::string::npos) << m;
}

// Per-rank dummy fp8 weights run at TP 2 against TP 1, in both modes; the
// mode reaches every rank (TP 2's W8A8 is nearer TP 1's W8A8 than W8A16).
TEST(Fp8TpEngine, DummyLoadPerRankMatchesTp1) {
  test_util::TempDir tmp;
  nlohmann::json j = testing::fp8_test_config("qwen3");
  aligned_shape(j);
  j["quantization_config"] = testing::fp8_quant_json(Fp8Format::block);
  atomic_write_file(tmp.path() / "config.json", j.dump());
  const auto toks = tokens(16, 212, 6);
  std::map<std::pair<int, Fp8Compute>, Logits> out;
  for (int tp : {1, 2})
    for (Fp8Compute mode : {Fp8Compute::w8a16, Fp8Compute::w8a8}) {
      EngineOptions o = testing::fp8_engine_options(mode, tp);
      o.load_format = LoadFormat::dummy;
      out[{tp, mode}] = logits_of(*Engine::load(tmp.path(), o), toks, 0);
    }
  for (Fp8Compute mode : {Fp8Compute::w8a16, Fp8Compute::w8a8}) {
    const Diff d = compare(out[{1, mode}], out[{2, mode}]);
    EXPECT_EQ(d.top1_mismatches, 0) << fp8_compute_name(mode);
    EXPECT_LE(d.max_abs, mode == Fp8Compute::w8a8 ? 5e-2 : 1e-2) << fp8_compute_name(mode);
  }
  EXPECT_LT(compare(out[{1, Fp8Compute::w8a8}], out[{2, Fp8Compute::w8a8}]).max_abs,
            compare(out[{1, Fp8Compute::w8a16}], out[{2, Fp8Compute::w8a8}]).max_abs);
}

}  // namespace
}  // namespace fp8kv
