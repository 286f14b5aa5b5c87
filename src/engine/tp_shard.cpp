#include "engine/tp_shard.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "engine/dummy_weights.h"
#include "io/errors.h"
#include "kv/planner.h"
#include "model/weights.h"
#include "model/weights_spec.h"
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
  if (c.gdn && (c.gdn->num_k_heads % world != 0 || c.gdn->num_v_heads % world != 0))
    throw InputError(fmt::format("--tensor-parallel-size {} does not divide linear_num_key_heads {} and "
                                 "linear_num_value_heads {} (the Gated DeltaNet heads shard like attention heads: "
                                 "both must be multiples of the tensor-parallel size)",
                                 world, c.gdn->num_k_heads, c.gdn->num_v_heads));
}

ModelConfig shard_config(const ModelConfig& cfg, int world) {
  check_tensor_parallel(cfg, world);
  ModelConfig c = cfg;
  c.num_heads = cfg.num_heads / world;
  c.num_kv_heads = kv_heads_per_rank(cfg, world);
  c.intermediate_size = cfg.intermediate_size / world;
  if (c.gdn) {
    c.gdn->num_k_heads /= world;
    c.gdn->num_v_heads /= world;
  }
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

// ---- the cuts: one table of how each layer matrix splits, used by
// shard_weights, dummy_weights_shard and the fp8 block checks ----

// How a matrix splits: its rows (column-parallel; `ranges` concatenated,
// in order: one range, or a gather of segments such as in_proj_qkv's q | k
// | v), or its columns (row-parallel; one range).
struct MatrixCut {
  const char* module;             // after "layers.N.", e.g. "self_attn.q_proj"
  WeightMatrix LayerWeights::*m;  // the matrix
  bool columns = false;
  int64_t rows = 0, cols = 0;     // the full shape
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [start, count) of rows (or one range of columns)
  uint64_t dummy_id = 0;          // the matrix's id in dummy_weights (engine/dummy_weights.h)
};

// What one rank holds of one layer, in the global coordinates of the full
// matrices (docs/design.md "Tensor parallelism").
struct RankDims {
  int64_t q0, nq;    // query rows [q0, q0 + nq) (D per head; a gated q_proj has 2 D per head)
  int64_t k0, nk;    // KV rows
  int64_t f0, nf;    // ffn rows
  int64_t kh0, nkh;  // Gated DeltaNet key heads
  int64_t vh0, nvh;  // Gated DeltaNet value heads
};

RankDims rank_dims(const ModelConfig& cfg, const TpShard& t) {
  const ModelConfig rc = shard_config(cfg, t.world);
  const int64_t D = cfg.head_dim;
  RankDims d{};
  d.q0 = static_cast<int64_t>(t.rank) * rc.num_heads * D;
  d.nq = rc.num_heads * D;
  d.k0 = static_cast<int64_t>(first_kv_head(cfg, t)) * D;
  d.nk = rc.num_kv_heads * D;
  d.f0 = static_cast<int64_t>(t.rank) * rc.intermediate_size;
  d.nf = rc.intermediate_size;
  if (cfg.gdn) {
    d.nkh = rc.gdn->num_k_heads;
    d.kh0 = static_cast<int64_t>(t.rank) * d.nkh;
    d.nvh = rc.gdn->num_v_heads;
    d.vh0 = static_cast<int64_t>(t.rank) * d.nvh;
  }
  return d;
}

bool linear_layer(const ModelConfig& cfg, int layer) { return cfg.gdn && cfg.is_linear(layer); }

// The rows of in_proj_qkv (and of conv1d) one rank holds: its heads of each
// of the q | k | v segments.
std::vector<std::pair<int64_t, int64_t>> qkv_rows(const ModelConfig& cfg, const RankDims& d) {
  const GatedDeltaNetConfig& g = *cfg.gdn;
  const int64_t Dk = g.k_head_dim, Dv = g.v_head_dim, KD = g.key_dim();
  return {{d.kh0 * Dk, d.nkh * Dk}, {KD + d.kh0 * Dk, d.nkh * Dk}, {2 * KD + d.vh0 * Dv, d.nvh * Dv}};
}

std::vector<MatrixCut> layer_cuts(const ModelConfig& cfg, int layer, const TpShard& t) {
  const RankDims d = rank_dims(cfg, t);
  const int64_t H = cfg.hidden_size, D = cfg.head_dim, I = cfg.intermediate_size;
  auto id = [&](int k) { return dummy_layer_matrix_id(cfg, layer, k); };
  std::vector<MatrixCut> c;
  if (linear_layer(cfg, layer)) {
    const GatedDeltaNetConfig& g = *cfg.gdn;
    const int64_t Dv = g.v_head_dim, Hv = g.num_v_heads, VD = g.value_dim();
    const uint64_t b = dummy_gdn_matrix_id(cfg, layer);
    c.push_back({"linear_attn.in_proj_qkv", &LayerWeights::in_proj_qkv, false, g.conv_dim(), H, qkv_rows(cfg, d), b});
    c.push_back({"linear_attn.in_proj_z", &LayerWeights::in_proj_z, false, VD, H, {{d.vh0 * Dv, d.nvh * Dv}}, b + 1});
    c.push_back({"linear_attn.in_proj_b", &LayerWeights::in_proj_b, false, Hv, H, {{d.vh0, d.nvh}}, b + 2});
    c.push_back({"linear_attn.in_proj_a", &LayerWeights::in_proj_a, false, Hv, H, {{d.vh0, d.nvh}}, b + 3});
    c.push_back({"linear_attn.out_proj", &LayerWeights::out_proj, true, H, VD, {{d.vh0 * Dv, d.nvh * Dv}}, b + 4});
  } else {
    const int64_t qm = cfg.attn_output_gate ? 2 : 1;  // a gated q_proj: 2 D rows per head (query, then gate)
    const int64_t Q = static_cast<int64_t>(cfg.num_heads) * D, KV = static_cast<int64_t>(cfg.num_kv_heads) * D;
    c.push_back({"self_attn.q_proj", &LayerWeights::q_proj, false, qm * Q, H, {{qm * d.q0, qm * d.nq}}, id(0)});
    c.push_back({"self_attn.k_proj", &LayerWeights::k_proj, false, KV, H, {{d.k0, d.nk}}, id(1)});
    c.push_back({"self_attn.v_proj", &LayerWeights::v_proj, false, KV, H, {{d.k0, d.nk}}, id(2)});
    c.push_back({"self_attn.o_proj", &LayerWeights::o_proj, true, H, Q, {{d.q0, d.nq}}, id(3)});
  }
  c.push_back({"mlp.gate_proj", &LayerWeights::gate_proj, false, I, H, {{d.f0, d.nf}}, id(4)});
  c.push_back({"mlp.up_proj", &LayerWeights::up_proj, false, I, H, {{d.f0, d.nf}}, id(5)});
  c.push_back({"mlp.down_proj", &LayerWeights::down_proj, true, H, I, {{d.f0, d.nf}}, id(6)});
  return c;
}

bool on_block(int64_t x, int64_t total) { return x % kFp8WeightBlock == 0 || x == total; }

// The 128x128 block rule for one rank's cut of a block-scaled matrix.
void check_block_cut(const std::string& name, const MatrixCut& c, const TpShard& t) {
  const int64_t total = c.columns ? c.cols : c.rows;
  for (const auto& [a, n] : c.ranges) {
    if (on_block(a, total) && on_block(a + n, total)) continue;
    const char* what = c.columns ? "columns" : "rows";
    throw InputError(fmt::format(
        "--tensor-parallel-size {}: fp8 weight {} [{}, {}] has 128x128 block scales, and rank {}'s {}-parallel "
        "shard of it, {} [{}, {}), does not start and end on a {}-{} block boundary (a block's scale cannot be "
        "split): use a --tensor-parallel-size that cuts this matrix's {} into whole 128-{} blocks",
        t.world, name, c.rows, c.cols, t.rank, c.columns ? "row" : "column", what, a, a + n, kFp8WeightBlock,
        c.columns ? "column" : "row", what, c.columns ? "column" : "row"));
  }
}

std::string matrix_name(const ModelConfig& cfg, int layer, const char* module) {
  return fmt::format("{}layers.{}.{}.weight", default_weight_naming(cfg).prefix, layer, module);
}

size_t elem_bytes(const WeightMatrix& m) { return m.fp8 ? 1 : m.bf16 ? 2 : 4; }

int64_t ceil_blocks(int64_t n) { return (n + kFp8WeightBlock - 1) / kFp8WeightBlock; }

// The rows [r0, r0 + n) of an fp8 matrix's scales (block: whole block rows,
// r0 on a block boundary).
std::shared_ptr<const std::vector<float>> scale_rows(const WeightMatrix& m, int64_t r0, int64_t n) {
  const std::vector<float>& s = *m.scales;
  switch (m.scale_granularity) {
    case ScaleGranularity::tensor: return m.scales;
    case ScaleGranularity::channel:
      return std::make_shared<const std::vector<float>>(s.begin() + r0, s.begin() + r0 + n);
    case ScaleGranularity::block128: {
      const int64_t kb = ceil_blocks(m.cols), b0 = r0 / kFp8WeightBlock, b1 = ceil_blocks(r0 + n);
      return std::make_shared<const std::vector<float>>(s.begin() + b0 * kb, s.begin() + b1 * kb);
    }
  }
  throw std::logic_error("shard: scale granularity");
}

// Rows [r0, r0 + n): a view sharing the owner (fp8: with the rows' scales).
WeightMatrix row_slice(const WeightMatrix& m, int64_t r0, int64_t n) {
  if (r0 < 0 || r0 + n > m.rows) throw std::logic_error("shard: row slice out of range");
  if (m.dummy) throw std::logic_error("shard: a lazy dummy matrix is made at tensor-parallel size 1 only");
  WeightMatrix o = m;
  o.rows = n;
  o.data = static_cast<const char*>(m.data) + static_cast<size_t>(r0 * m.cols) * elem_bytes(m);
  if (m.fp8) o.scales = scale_rows(m, r0, n);
  return o;
}

// Several row ranges concatenated (a copy; one range: row_slice).
WeightMatrix row_gather(const WeightMatrix& m, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  if (ranges.size() == 1) return row_slice(m, ranges[0].first, ranges[0].second);
  int64_t n = 0;
  for (const auto& r : ranges) n += r.second;
  const size_t es = elem_bytes(m), row = static_cast<size_t>(m.cols) * es;
  auto buf = std::shared_ptr<char[]>(new char[static_cast<size_t>(n) * row]);
  auto scales = std::make_shared<std::vector<float>>();
  size_t off = 0;
  for (const auto& [r0, k] : ranges) {
    const WeightMatrix part = row_slice(m, r0, k);
    std::memcpy(buf.get() + off, part.data, static_cast<size_t>(k) * row);
    off += static_cast<size_t>(k) * row;
    if (m.fp8 && m.scale_granularity != ScaleGranularity::tensor)
      scales->insert(scales->end(), part.scales->begin(), part.scales->end());
  }
  WeightMatrix o = m;
  o.rows = n;
  o.data = buf.get();
  o.owner = std::shared_ptr<const void>(buf, buf.get());
  if (m.fp8 && m.scale_granularity != ScaleGranularity::tensor) o.scales = std::move(scales);
  return o;
}

// Columns [c0, c0 + n): a copy (fp8: a block scale grid keeps the block
// columns, c0 on a block boundary; tensor / channel scales are the same).
WeightMatrix col_slice(const WeightMatrix& m, int64_t c0, int64_t n) {
  if (c0 < 0 || c0 + n > m.cols) throw std::logic_error("shard: column slice out of range");
  if (m.dummy) throw std::logic_error("shard: a lazy dummy matrix is made at tensor-parallel size 1 only");
  const size_t es = elem_bytes(m);
  auto buf = std::shared_ptr<char[]>(new char[static_cast<size_t>(m.rows * n) * es]);
  for (int64_t r = 0; r < m.rows; ++r)
    std::memcpy(buf.get() + static_cast<size_t>(r * n) * es,
                static_cast<const char*>(m.data) + static_cast<size_t>(r * m.cols + c0) * es, static_cast<size_t>(n) * es);
  WeightMatrix o = m;
  o.cols = n;
  o.data = buf.get();
  o.owner = std::shared_ptr<const void>(buf, buf.get());
  if (m.fp8 && m.scale_granularity == ScaleGranularity::block128) {
    const int64_t kb = ceil_blocks(m.cols), rb = ceil_blocks(m.rows), b0 = c0 / kFp8WeightBlock,
                  nb = ceil_blocks(c0 + n) - b0;
    auto s = std::make_shared<std::vector<float>>();
    s->reserve(static_cast<size_t>(rb * nb));
    for (int64_t i = 0; i < rb; ++i)
      s->insert(s->end(), m.scales->begin() + i * kb + b0, m.scales->begin() + i * kb + b0 + nb);
    o.scales = std::move(s);
  }
  return o;
}

// One rank's cut of one matrix (checking the block rule first).
WeightMatrix cut_matrix(const WeightMatrix& m, const MatrixCut& c, const std::string& name, const TpShard& t) {
  if (m.rows != c.rows || m.cols != c.cols)
    throw std::logic_error(fmt::format("shard: {} is [{}, {}], expected [{}, {}]", name, m.rows, m.cols, c.rows,
                                       c.cols));
  if (m.fp8 && m.scale_granularity == ScaleGranularity::block128) check_block_cut(name, c, t);
  return c.columns ? col_slice(m, c.ranges[0].first, c.ranges[0].second) : row_gather(m, c.ranges);
}

std::vector<float> vec_slice(const std::vector<float>& v, int64_t i0, int64_t n) {
  if (v.empty()) return {};
  return std::vector<float>(v.begin() + i0, v.begin() + i0 + n);
}

// Rows `ranges` of a row-major [R][width] vector, concatenated.
std::vector<float> vec_rows(const std::vector<float>& v, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                            int64_t width) {
  std::vector<float> o;
  for (const auto& [r0, n] : ranges) o.insert(o.end(), v.begin() + r0 * width, v.begin() + (r0 + n) * width);
  return o;
}

// The quantization_config's granularity when it quantizes `module` (as
// dummy_weights and the loader decide), else nullopt.
std::optional<ScaleGranularity> declared_fp8(const ModelConfig& cfg, int layer, const char* module) {
  const WeightQuantConfig& q = cfg.weight_quant;
  if (!q.quantized() || q.is_excluded(fmt::format("{}layers.{}.{}", default_weight_naming(cfg).prefix, layer, module)))
    return std::nullopt;
  return q.granularity;
}

}  // namespace

void check_fp8_block_shards(const ModelWeights& w, const ModelConfig& cfg, int world) {
  check_tensor_parallel(cfg, world);
  if (world == 1) return;
  for (int r = 0; r < world; ++r) {
    const TpShard t{r, world};
    for (int l = 0; l < cfg.num_layers; ++l) {
      const LayerWeights& L = w.layers.at(static_cast<size_t>(l));
      for (const MatrixCut& c : layer_cuts(cfg, l, t)) {
        const WeightMatrix& m = L.*c.m;
        if (m.fp8 && m.scale_granularity == ScaleGranularity::block128)
          check_block_cut(matrix_name(cfg, l, c.module), c, t);
      }
    }
    if (w.lm_head && w.lm_head->fp8 && w.lm_head->scale_granularity == ScaleGranularity::block128 &&
        vocab_parallel(cfg, world)) {
      const int64_t nv = cfg.vocab_size / world;
      const MatrixCut c{"lm_head", nullptr, false, cfg.vocab_size, cfg.hidden_size, {{r * nv, nv}}, 0};
      check_block_cut("lm_head.weight", c, t);
    }
  }
}

void check_fp8_block_shards(const ModelConfig& cfg, int world) {
  check_tensor_parallel(cfg, world);
  if (world == 1 || !cfg.weight_quant.quantized()) return;
  for (int r = 0; r < world; ++r)
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (const MatrixCut& c : layer_cuts(cfg, l, TpShard{r, world})) {
        const std::optional<ScaleGranularity> g = declared_fp8(cfg, l, c.module);
        if (!g) continue;
        if (*g == ScaleGranularity::block128) check_block_cut(matrix_name(cfg, l, c.module), c, TpShard{r, world});
      }
    }
}

std::shared_ptr<const ModelWeights> shard_weights(std::shared_ptr<const ModelWeights> w, const ModelConfig& cfg,
                                                  const TpShard& t) {
  if (t.world == 1 || t.presharded) return w;
  const RankDims d = rank_dims(cfg, t);
  auto o = std::make_shared<ModelWeights>();
  o->embed = w->embed;
  if (vocab_parallel(cfg, t.world)) {
    const int64_t nv = cfg.vocab_size / t.world;
    const MatrixCut c{"lm_head", nullptr, false, cfg.vocab_size, cfg.hidden_size, {{t.rank * nv, nv}}, 0};
    o->lm_head = cut_matrix(w->output(), c, w->lm_head ? "lm_head.weight" : "the tied embedding (lm_head)", t);
  } else {
    o->lm_head = w->lm_head;  // replicated (tied: output() is the embedding)
  }
  o->final_norm = w->final_norm;
  o->embed_scale = w->embed_scale;
  o->fp8_compute = w->fp8_compute;
  o->layers.reserve(w->layers.size());
  for (size_t li = 0; li < w->layers.size(); ++li) {
    const int l = static_cast<int>(li);
    const LayerWeights& L = w->layers[li];
    LayerWeights s = L;  // norms (and anything not sharded below) replicated
    const bool linear = linear_layer(cfg, l);
    for (const MatrixCut& c : layer_cuts(cfg, l, t)) s.*c.m = cut_matrix(L.*c.m, c, matrix_name(cfg, l, c.module), t);
    if (linear) {
      // Per value head: A_log, dt_bias; conv1d [C][K] with in_proj_qkv's
      // rows; the gated norm (per Dv) replicated.
      s.conv1d = vec_rows(L.conv1d, qkv_rows(cfg, d), cfg.gdn->conv_kernel);
      s.A_log = vec_slice(L.A_log, d.vh0, d.nvh);
      s.dt_bias = vec_slice(L.dt_bias, d.vh0, d.nvh);
    } else {
      s.q_bias = vec_slice(L.q_bias, d.q0, d.nq);
      s.k_bias = vec_slice(L.k_bias, d.k0, d.nk);
      s.v_bias = vec_slice(L.v_bias, d.k0, d.nk);
      if (t.rank != 0) s.o_bias.clear();  // added once, by rank 0, before the all-reduce
    }
    s.gate_bias = vec_slice(L.gate_bias, d.f0, d.nf);
    s.up_bias = vec_slice(L.up_bias, d.f0, d.nf);
    if (t.rank != 0) s.down_bias.clear();
    o->layers.push_back(std::move(s));
  }
  // Keep the source alive: the row slices point into its memory (the
  // WeightMatrix owners already share it; this covers unowned mapped data).
  auto keep = std::shared_ptr<const ModelWeights>(o.get(), [o, w](const ModelWeights*) {});
  return keep;
}

std::shared_ptr<ModelWeights> dummy_weights_shard(const ModelConfig& c, const TpShard& t, uint64_t seed, float std) {
  if (t.world == 1) return dummy_weights(c, seed, std);
  check_fp8_block_shards(c, t.world);
  // The matrices by their dummy_weights ids, each cut as shard_weights cuts
  // it (fp8 where the config quantizes it); vectors as there (norms 1,
  // biases 0).
  const RankDims d = rank_dims(c, t);
  const int64_t H = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  const bool vp = vocab_parallel(c, t.world);
  const int64_t nv = V / t.world, v0 = static_cast<int64_t>(t.rank) * nv;
  auto w = std::make_shared<ModelWeights>();
  w->embed = dummy_matrix_block(seed, 0, V, H, 0, V, 0, H, std);
  if (!c.tie_word_embeddings) {
    w->lm_head =
        vp ? dummy_matrix_block(seed, 1, V, H, v0, nv, 0, H, std) : dummy_matrix_block(seed, 1, V, H, 0, V, 0, H, std);
  } else if (vp) {
    w->lm_head = row_slice(w->embed, v0, nv);  // the embedding's rows: a view (as shard_weights cuts it)
  }
  w->final_norm.assign(static_cast<size_t>(H), 1.0f);
  if (c.embed_scale_sqrt_hidden) w->embed_scale = round_bf16(std::sqrt(static_cast<float>(H)));
  w->layers.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w->layers[static_cast<size_t>(l)];
    const bool linear = linear_layer(c, l);
    L.input_norm.assign(static_cast<size_t>(H), 1.0f);
    for (const MatrixCut& m : layer_cuts(c, l, t)) {
      const bool cols = m.columns;
      const std::vector<std::pair<int64_t, int64_t>> rows = cols ? std::vector<std::pair<int64_t, int64_t>>{{0, m.rows}}
                                                                 : m.ranges;
      const int64_t c0 = cols ? m.ranges[0].first : 0, nc = cols ? m.ranges[0].second : m.cols;
      L.*m.m = dummy_matrix_cut(seed, m.dummy_id, m.rows, m.cols, rows, c0, nc, std, declared_fp8(c, l, m.module));
    }
    if (linear) {
      const GatedDeltaNetConfig& g = *c.gdn;
      const uint64_t b = dummy_gdn_matrix_id(c, l);
      const WeightMatrix conv = dummy_matrix_cut(seed, b + 5, g.conv_dim(), g.conv_kernel, qkv_rows(c, d), 0,
                                                 g.conv_kernel, std, std::nullopt);
      L.conv1d.resize(static_cast<size_t>(conv.rows * conv.cols));
      for (size_t e = 0; e < L.conv1d.size(); ++e)
        L.conv1d[e] = bf16_to_f32(static_cast<const uint16_t*>(conv.data)[e]);
      L.A_log = dummy_a_log(seed, b + 6, d.vh0, d.nvh);
      L.dt_bias.assign(static_cast<size_t>(d.nvh), 1.0f);
      L.gdn_norm.assign(static_cast<size_t>(g.v_head_dim), 1.0f);
    } else {
      if (c.attention_bias) {
        L.q_bias.assign(static_cast<size_t>(d.nq), 0.0f);
        L.k_bias.assign(static_cast<size_t>(d.nk), 0.0f);
        L.v_bias.assign(static_cast<size_t>(d.nk), 0.0f);
      }
      if (c.o_proj_bias && t.rank == 0) L.o_bias.assign(static_cast<size_t>(H), 0.0f);
      if (c.qk_norm) {
        L.q_norm.assign(static_cast<size_t>(D), 1.0f);
        L.k_norm.assign(static_cast<size_t>(D), 1.0f);
      }
    }
    L.post_attention_norm.assign(static_cast<size_t>(H), 1.0f);
    if (c.sandwich_norms) {
      L.pre_ffn_norm.assign(static_cast<size_t>(H), 1.0f);
      L.post_ffn_norm.assign(static_cast<size_t>(H), 1.0f);
    }
    if (c.mlp_bias) {
      L.gate_bias.assign(static_cast<size_t>(d.nf), 0.0f);
      L.up_bias.assign(static_cast<size_t>(d.nf), 0.0f);
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
