#include "engine/tp_shard.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "engine/dummy_weights.h"
#include "io/errors.h"
#include "kv/planner.h"
#include "model/weights.h"
#include "numerics/fp8.h"

namespace fp8kv {

void check_tensor_parallel(const ModelConfig& c, int world) {
  if (world < 1) throw InputError(fmt::format("--tensor-parallel-size must be >= 1 (got {})", world));
  if (c.num_heads % world != 0)
    throw InputError(fmt::format("--tensor-parallel-size {} does not divide num_attention_heads {}", world,
                                 c.num_heads));
  if (c.intermediate_size % world != 0)
    throw InputError(fmt::format("--tensor-parallel-size {} does not divide intermediate_size {}", world,
                                 c.intermediate_size));
  (void)kv_heads_per_rank(c, world);  // throws InputError naming num_key_value_heads
}

ModelConfig shard_config(const ModelConfig& cfg, int world) {
  check_tensor_parallel(cfg, world);
  ModelConfig c = cfg;
  c.num_heads = cfg.num_heads / world;
  c.num_kv_heads = kv_heads_per_rank(cfg, world);
  c.intermediate_size = cfg.intermediate_size / world;
  return c;
}

ModelConfig rank_traffic_config(const ModelConfig& cfg, int world) {
  if (world <= 1) return cfg;
  ModelConfig c = shard_config(cfg, world);
  if (vocab_parallel(cfg, world)) c.vocab_size = cfg.vocab_size / world;
  return c;
}

bool vocab_parallel(const ModelConfig& cfg, int world) { return world > 1 && cfg.vocab_size % world == 0; }

int first_kv_head(const ModelConfig& cfg, const TpShard& t) {
  const int per = kv_heads_per_rank(cfg, t.world);
  if (cfg.num_kv_heads >= t.world) return t.rank * per;
  return t.rank / (t.world / cfg.num_kv_heads);  // replicated: world / Hkv ranks per KV head
}

namespace {

// Rows [r0, r0 + n): a view sharing the owner.
WeightMatrix row_slice(const WeightMatrix& m, int64_t r0, int64_t n) {
  if (r0 < 0 || r0 + n > m.rows) throw std::logic_error("shard: row slice out of range");
  WeightMatrix o = m;
  o.rows = n;
  o.data = static_cast<const char*>(m.data) + static_cast<size_t>(r0 * m.cols) * (m.bf16 ? 2 : 4);
  return o;
}

// Columns [c0, c0 + n): a copy.
WeightMatrix col_slice(const WeightMatrix& m, int64_t c0, int64_t n) {
  if (c0 < 0 || c0 + n > m.cols) throw std::logic_error("shard: column slice out of range");
  const size_t es = m.bf16 ? 2 : 4;
  auto buf = std::shared_ptr<char[]>(new char[static_cast<size_t>(m.rows * n) * es]);
  for (int64_t r = 0; r < m.rows; ++r)
    std::memcpy(buf.get() + static_cast<size_t>(r * n) * es,
                static_cast<const char*>(m.data) + static_cast<size_t>(r * m.cols + c0) * es, static_cast<size_t>(n) * es);
  WeightMatrix o;
  o.bf16 = m.bf16;
  o.rows = m.rows;
  o.cols = n;
  o.data = buf.get();
  o.owner = std::shared_ptr<const void>(buf, buf.get());
  return o;
}

std::vector<float> vec_slice(const std::vector<float>& v, int64_t i0, int64_t n) {
  if (v.empty()) return {};
  return std::vector<float>(v.begin() + i0, v.begin() + i0 + n);
}

}  // namespace

std::shared_ptr<const ModelWeights> shard_weights(std::shared_ptr<const ModelWeights> w, const ModelConfig& cfg,
                                                  const TpShard& t) {
  if (t.world == 1 || t.presharded) return w;
  const ModelConfig rc = shard_config(cfg, t.world);
  const int64_t D = cfg.head_dim, q0 = static_cast<int64_t>(t.rank) * rc.num_heads * D, nq = rc.num_heads * D;
  const int64_t k0 = static_cast<int64_t>(first_kv_head(cfg, t)) * D, nk = rc.num_kv_heads * D;
  const int64_t f0 = static_cast<int64_t>(t.rank) * rc.intermediate_size, nf = rc.intermediate_size;
  auto o = std::make_shared<ModelWeights>();
  o->embed = w->embed;
  if (vocab_parallel(cfg, t.world)) {
    const int64_t nv = cfg.vocab_size / t.world;
    o->lm_head = row_slice(w->output(), static_cast<int64_t>(t.rank) * nv, nv);
  } else {
    o->lm_head = w->lm_head;  // replicated (tied: output() is the embedding)
  }
  o->final_norm = w->final_norm;
  o->embed_scale = w->embed_scale;
  o->layers.reserve(w->layers.size());
  for (const LayerWeights& L : w->layers) {
    LayerWeights s = L;  // norms (and anything not sharded below) replicated
    s.q_proj = row_slice(L.q_proj, q0, nq);
    s.k_proj = row_slice(L.k_proj, k0, nk);
    s.v_proj = row_slice(L.v_proj, k0, nk);
    s.o_proj = col_slice(L.o_proj, q0, nq);
    s.q_bias = vec_slice(L.q_bias, q0, nq);
    s.k_bias = vec_slice(L.k_bias, k0, nk);
    s.v_bias = vec_slice(L.v_bias, k0, nk);
    if (t.rank != 0) s.o_bias.clear();  // added once, by rank 0, before the all-reduce
    s.gate_proj = row_slice(L.gate_proj, f0, nf);
    s.up_proj = row_slice(L.up_proj, f0, nf);
    s.down_proj = col_slice(L.down_proj, f0, nf);
    s.gate_bias = vec_slice(L.gate_bias, f0, nf);
    s.up_bias = vec_slice(L.up_bias, f0, nf);
    if (t.rank != 0) s.down_bias.clear();
    o->layers.push_back(std::move(s));
  }
  // Keep the source alive: the row slices point into its memory (the
  // WeightMatrix owners already share it; this covers unowned mapped data).
  auto keep = std::shared_ptr<const ModelWeights>(o.get(), [o, w](const ModelWeights*) {});
  return keep;
}

std::shared_ptr<const ModelWeights> dummy_weights_shard(const ModelConfig& c, const TpShard& t, uint64_t seed,
                                                        float std) {
  if (t.world == 1) return dummy_weights(c, seed, std);
  // Qwen3.5 runs on one rank (the engine refuses TP > 1 before this).
  if (c.gdn || c.attn_output_gate)
    throw InputError(fmt::format("dummy_weights_shard: {} ({}) has no tensor-parallel shards yet", c.architecture,
                                 c.model_type));
  // The matrices in dummy_weights' order (their ids), each cut as
  // shard_weights cuts it; vectors as there (norms 1, biases 0).
  const ModelConfig rc = shard_config(c, t.world);
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, I = c.intermediate_size,
                V = c.vocab_size;
  const int64_t q0 = static_cast<int64_t>(t.rank) * rc.num_heads * D, nq = rc.num_heads * D;
  const int64_t k0 = static_cast<int64_t>(first_kv_head(c, t)) * D, nk = rc.num_kv_heads * D;
  const int64_t f0 = static_cast<int64_t>(t.rank) * rc.intermediate_size, nf = rc.intermediate_size;
  const bool vp = vocab_parallel(c, t.world);
  const int64_t nv = V / t.world, v0 = static_cast<int64_t>(t.rank) * nv;
  auto rows = [&](uint64_t id, int64_t R, int64_t C, int64_t r0, int64_t n) {
    return dummy_matrix_block(seed, id, R, C, r0, n, 0, C, std);
  };
  auto cols = [&](uint64_t id, int64_t R, int64_t C, int64_t c0, int64_t n) {
    return dummy_matrix_block(seed, id, R, C, 0, R, c0, n, std);
  };
  auto w = std::make_shared<ModelWeights>();
  uint64_t id = 0;
  w->embed = rows(id++, V, H, 0, V);
  if (!c.tie_word_embeddings) {
    w->lm_head = vp ? rows(id, V, H, v0, nv) : rows(id, V, H, 0, V);
    ++id;
  } else if (vp) {
    w->lm_head = row_slice(w->embed, v0, nv);  // the embedding's rows: a view (as shard_weights cuts it)
  }
  w->final_norm.assign(static_cast<size_t>(H), 1.0f);
  if (c.embed_scale_sqrt_hidden) w->embed_scale = round_bf16(std::sqrt(static_cast<float>(H)));
  w->layers.resize(c.num_layers);
  for (auto& L : w->layers) {
    L.input_norm.assign(static_cast<size_t>(H), 1.0f);
    L.q_proj = rows(id++, Hq * D, H, q0, nq);
    L.k_proj = rows(id++, Hkv * D, H, k0, nk);
    L.v_proj = rows(id++, Hkv * D, H, k0, nk);
    L.o_proj = cols(id++, H, Hq * D, q0, nq);
    if (c.attention_bias) {
      L.q_bias.assign(static_cast<size_t>(nq), 0.0f);
      L.k_bias.assign(static_cast<size_t>(nk), 0.0f);
      L.v_bias.assign(static_cast<size_t>(nk), 0.0f);
    }
    if (c.o_proj_bias && t.rank == 0) L.o_bias.assign(static_cast<size_t>(H), 0.0f);
    if (c.qk_norm) {
      L.q_norm.assign(static_cast<size_t>(D), 1.0f);
      L.k_norm.assign(static_cast<size_t>(D), 1.0f);
    }
    L.post_attention_norm.assign(static_cast<size_t>(H), 1.0f);
    if (c.sandwich_norms) {
      L.pre_ffn_norm.assign(static_cast<size_t>(H), 1.0f);
      L.post_ffn_norm.assign(static_cast<size_t>(H), 1.0f);
    }
    L.gate_proj = rows(id++, I, H, f0, nf);
    L.up_proj = rows(id++, I, H, f0, nf);
    L.down_proj = cols(id++, H, I, f0, nf);
    if (c.mlp_bias) {
      L.gate_bias.assign(static_cast<size_t>(nf), 0.0f);
      L.up_bias.assign(static_cast<size_t>(nf), 0.0f);
      if (t.rank == 0) L.down_bias.assign(static_cast<size_t>(H), 0.0f);
    }
  }
  return w;
}

KvScales shard_kv_scales(const KvScales& s, const ModelConfig& cfg, const TpShard& t) {
  if (t.world == 1) return s;
  const ModelConfig rc = shard_config(cfg, t.world);
  const int q0 = t.rank * rc.num_heads, k0 = first_kv_head(cfg, t);
  KvScales o = s;
  for (auto& L : o.layers) {
    auto cut = [](StreamScale& sc, int h0, int n) {
      if (sc.values.size() > 1) sc.values = std::vector<float>(sc.values.begin() + h0, sc.values.begin() + h0 + n);
    };
    cut(L.q, q0, rc.num_heads);
    cut(L.k, k0, rc.num_kv_heads);
    cut(L.v, k0, rc.num_kv_heads);
  }
  return o;
}

}  // namespace fp8kv
