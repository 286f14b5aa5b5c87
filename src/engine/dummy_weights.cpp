#include "engine/dummy_weights.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "model/weights_spec.h"
#include "numerics/fp8.h"

namespace fp8kv {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i of matrix `id`: a standard normal (Box-Muller on two 32-bit
// uniforms of one 64-bit hash), times std, rounded to bf16.
WeightMatrix dummy_matrix(uint64_t seed, uint64_t id, int64_t rows, int64_t cols, float std) {
  WeightMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.bf16 = true;
  const int64_t n = rows * cols;
  auto buf = std::shared_ptr<uint16_t[]>(new uint16_t[static_cast<size_t>(n)]);
  const uint64_t key = mix(seed ^ mix(id));
  uint16_t* p = buf.get();
  // One hash -> two normals (Box-Muller, both branches, fp32 math): an 8B
  // model fills in a few seconds on a 16-core host (the GPU benchmarks load
  // it once per case).
  const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < pairs; ++j) {
    const uint64_t h = mix(key + static_cast<uint64_t>(j));
    const float u1 = (static_cast<float>(h >> 40) + 1.0f) * 0x1.0p-24f;            // (0, 1]
    const float u2 = static_cast<float>((h >> 8) & 0xffffffu) * 0x1.0p-24f;         // [0, 1)
    const float r = std::sqrt(-2.0f * std::log(u1)) * std;
    const float a = 6.2831853f * u2;
    p[2 * j] = f32_to_bf16(r * std::cos(a));
    if (2 * j + 1 < n) p[2 * j + 1] = f32_to_bf16(r * std::sin(a));
  }
  m.data = p;
  m.owner = std::shared_ptr<const void>(buf, buf.get());
  return m;
}

// Element e of the matrix whose key is `key` (the pair (e / 2) as above).
inline uint16_t dummy_element(uint64_t key, int64_t e, float std) {
  const uint64_t h = mix(key + static_cast<uint64_t>(e / 2));
  const float u1 = (static_cast<float>(h >> 40) + 1.0f) * 0x1.0p-24f;
  const float u2 = static_cast<float>((h >> 8) & 0xffffffu) * 0x1.0p-24f;
  const float r = std::sqrt(-2.0f * std::log(u1)) * std;
  const float a = 6.2831853f * u2;
  return f32_to_bf16((e & 1) ? r * std::sin(a) : r * std::cos(a));
}

// A dummy matrix as an FP8-weight checkpoint holds it: its bf16 values
// quantized to e4m3 with amax / 448 scales of the config's granularity.
WeightMatrix to_fp8(const WeightMatrix& m, ScaleGranularity g) {
  const int64_t n = m.rows * m.cols;
  std::vector<float> f(static_cast<size_t>(n));
  const uint16_t* src = static_cast<const uint16_t*>(m.data);
  for (int64_t i = 0; i < n; ++i) f[i] = bf16_to_f32(src[i]);
  auto q = std::make_shared<Fp8QuantizedWeight>(quantize_weight_e4m3(f.data(), m.rows, m.cols, g));
  WeightMatrix o;
  o.rows = m.rows;
  o.cols = m.cols;
  o.fp8 = true;
  o.data = q->q.data();
  o.owner = q;
  o.scale_granularity = g;
  o.scales = std::shared_ptr<const std::vector<float>>(q, &q->scales);
  return o;
}

// The lazy descriptor of an fp8 dummy matrix (see dummy_weights below).
WeightMatrix lazy_fp8(const WeightMatrix& m, ScaleGranularity g) {
  WeightMatrix o = m;
  o.bf16 = false;
  o.fp8 = true;
  o.scale_granularity = g;
  const auto [sr, sc] = fp8_scale_shape(g, m.rows, m.cols);
  o.scales = std::make_shared<const std::vector<float>>(static_cast<size_t>(sr * sc),
                                                         kDummyFp8Sigmas * m.dummy_std / 448.0f);
  return o;
}

// A uniform in [0, 1) from element i of the stream whose key is `key`.
inline float dummy_uniform(uint64_t key, int64_t i) {
  return static_cast<float>(mix(key + static_cast<uint64_t>(i)) >> 40) * 0x1.0p-24f;
}

std::vector<float> ones(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 1.0f); }
std::vector<float> zeros(int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); }

}  // namespace

uint64_t dummy_matrix_key(uint64_t seed, uint64_t id) { return mix(seed ^ mix(id)); }

uint64_t dummy_layer_matrix_id(const ModelConfig& c, int layer, int k) {
  return (c.tie_word_embeddings ? 1u : 2u) + static_cast<uint64_t>(kDummyIdsPerLayer) * layer + k;
}

uint64_t dummy_gdn_matrix_id(const ModelConfig& c, int layer) {
  return dummy_layer_matrix_id(c, c.num_layers, 0) + static_cast<uint64_t>(kDummyGdnIdsPerLayer) * layer;
}

WeightMatrix dummy_matrix_block(uint64_t seed, uint64_t id, int64_t rows, int64_t cols, int64_t r0, int64_t nr,
                                int64_t c0, int64_t nc, float std) {
  (void)rows;
  WeightMatrix m;
  m.rows = nr;
  m.cols = nc;
  m.bf16 = true;
  auto buf = std::shared_ptr<uint16_t[]>(new uint16_t[static_cast<size_t>(nr * nc)]);
  const uint64_t key = mix(seed ^ mix(id));
  uint16_t* p = buf.get();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j) p[i * nc + j] = dummy_element(key, (r0 + i) * cols + c0 + j, std);
  m.data = p;
  m.owner = std::shared_ptr<const void>(buf, buf.get());
  return m;
}

WeightMatrix dummy_matrix_cut(uint64_t seed, uint64_t id, int64_t R, int64_t C,
                              const std::vector<std::pair<int64_t, int64_t>>& rows, int64_t c0, int64_t nc, float std,
                              std::optional<ScaleGranularity> fp8) {
  int64_t nr = 0;
  for (const auto& [r0, n] : rows) {
    if (r0 < 0 || n < 0 || r0 + n > R) throw std::logic_error("dummy_matrix_cut: rows out of range");
    nr += n;
  }
  if (c0 < 0 || nc < 0 || c0 + nc > C) throw std::logic_error("dummy_matrix_cut: columns out of range");
  const uint64_t key = mix(seed ^ mix(id));
  // The cut's bf16 elements, row by row (the matrix itself unless fp8).
  auto buf = std::shared_ptr<uint16_t[]>(new uint16_t[static_cast<size_t>(nr * nc)]);
  uint16_t* v = buf.get();
  std::vector<int64_t> global_row(static_cast<size_t>(nr));
  {
    int64_t i = 0;
    for (const auto& [r0, n] : rows)
      for (int64_t r = r0; r < r0 + n; ++r) global_row[static_cast<size_t>(i++)] = r;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j) v[i * nc + j] = dummy_element(key, global_row[i] * C + c0 + j, std);
  WeightMatrix m;
  m.rows = nr;
  m.cols = nc;
  if (!fp8) {
    m.bf16 = true;
    m.data = buf.get();
    m.owner = std::shared_ptr<const void>(buf, buf.get());
    return m;
  }
  // amax of the full matrix's elements in [ra, rb) x [ca, cb) (serial: the
  // callers parallelize over cells).
  auto amax = [&](int64_t ra, int64_t rb, int64_t ca, int64_t cb) {
    float a = 0.0f;
    for (int64_t r = ra; r < rb; ++r)
      for (int64_t c = ca; c < cb; ++c) a = std::max(a, std::fabs(bf16_to_f32(dummy_element(key, r * C + c, std))));
    return a;
  };
  const ScaleGranularity g = *fp8;
  const int64_t B = kFp8WeightBlock;
  auto scales = std::make_shared<std::vector<float>>();
  const int64_t ncb = g == ScaleGranularity::block128 ? (nc + B - 1) / B : 1;  // scale columns of a cut row
  std::vector<float> row_scale(static_cast<size_t>(nr * ncb));  // each cut row's scale per column block
  if (g == ScaleGranularity::tensor) {
    std::vector<float> per_row(static_cast<size_t>(R));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) per_row[r] = amax(r, r + 1, 0, C);
    scales->push_back(fp8_scale_from_amax(*std::max_element(per_row.begin(), per_row.end())));
    std::fill(row_scale.begin(), row_scale.end(), scales->front());
  } else if (g == ScaleGranularity::channel) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nr; ++i) row_scale[i] = fp8_scale_from_amax(amax(global_row[i], global_row[i] + 1, 0, C));
    scales->assign(row_scale.begin(), row_scale.end());
  } else {
    auto on_block = [&](int64_t x, int64_t total) { return x % B == 0 || x == total; };
    if (!on_block(c0, C) || !on_block(c0 + nc, C)) throw std::logic_error("dummy_matrix_cut: columns off a block");
    int64_t i = 0;
    for (const auto& [r0, n] : rows) {
      if (!on_block(r0, R) || !on_block(r0 + n, R)) throw std::logic_error("dummy_matrix_cut: rows off a block");
      for (int64_t br = r0; br < r0 + n; br += B) {
        const int64_t re = std::min(R, br + B);
        for (int64_t bc = 0; bc < ncb; ++bc) {
          const int64_t ca = c0 + bc * B;
          scales->push_back(fp8_scale_from_amax(amax(br, re, ca, std::min(C, ca + B))));
          for (int64_t k = 0; k < re - br; ++k) row_scale[static_cast<size_t>((i + k) * ncb + bc)] = scales->back();
        }
        i += re - br;
      }
    }
  }
  auto q = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(nr * nc)]);
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j) {
      const float s = row_scale[static_cast<size_t>(i * ncb + (g == ScaleGranularity::block128 ? j / B : 0))];
      q[i * nc + j] = f32_to_e4m3(bf16_to_f32(v[i * nc + j]) / s);
    }
  m.fp8 = true;
  m.scale_granularity = g;
  m.data = q.get();
  m.owner = std::shared_ptr<const void>(q, q.get());
  m.scales = std::move(scales);
  return m;
}

std::vector<float> dummy_a_log(uint64_t seed, uint64_t id, int64_t h0, int64_t n) {
  const uint64_t akey = dummy_matrix_key(seed, id);
  std::vector<float> a(static_cast<size_t>(n));
  for (int64_t h = 0; h < n; ++h) a[h] = std::log(1.0f + 15.0f * dummy_uniform(akey, h0 + h));
  return a;
}

std::shared_ptr<ModelWeights> dummy_weights(const ModelConfig& c, uint64_t seed, float std, bool lazy) {
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, I = c.intermediate_size,
                V = c.vocab_size;
  auto w = std::make_shared<ModelWeights>();
  uint64_t id = 0;
  // lazy: the descriptor of the same matrix (same id order), filled on the device.
  auto dummy_matrix = [lazy](uint64_t sd, uint64_t i, int64_t rows, int64_t cols, float s) {
    if (!lazy) return fp8kv::dummy_matrix(sd, i, rows, cols, s);
    WeightMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.bf16 = true;
    m.dummy = true;
    m.dummy_key = dummy_matrix_key(sd, i);
    m.dummy_std = s;
    return m;
  };
  w->embed = dummy_matrix(seed, id++, V, H, std);
  if (!c.tie_word_embeddings) w->lm_head = dummy_matrix(seed, id++, V, H, std);
  w->final_norm = ones(H);
  if (c.embed_scale_sqrt_hidden) w->embed_scale = round_bf16(std::sqrt(static_cast<float>(H)));
  w->layers.resize(c.num_layers);
  // A gated full-attention layer's q_proj also writes the output gate.
  const int64_t q_rows = Hq * D * (c.attn_output_gate ? 2 : 1);
  for (int li = 0; li < c.num_layers; ++li) {
    LayerWeights& L = w->layers[li];
    L.input_norm = ones(H);
    const bool linear = c.gdn && c.is_linear(li);  // (c.gdn: hand-made test configs may leave layer_types empty)
    if (linear) {
      // A Gated DeltaNet layer has no attention tensors; its q, k, v, o ids
      // stay reserved so that every other matrix keeps its id.
      id += 4;
    } else {
      L.q_proj = dummy_matrix(seed, id++, q_rows, H, std);
      L.k_proj = dummy_matrix(seed, id++, Hkv * D, H, std);
      L.v_proj = dummy_matrix(seed, id++, Hkv * D, H, std);
      L.o_proj = dummy_matrix(seed, id++, H, Hq * D, std);
    }
    if (c.attention_bias && !linear) {
      L.q_bias = zeros(Hq * D);
      L.k_bias = zeros(Hkv * D);
      L.v_bias = zeros(Hkv * D);
    }
    if (c.o_proj_bias && !linear) L.o_bias = zeros(H);
    if (c.qk_norm && !linear) {
      L.q_norm = ones(D);
      L.k_norm = ones(D);
    }
    L.post_attention_norm = ones(H);
    if (c.sandwich_norms) {
      L.pre_ffn_norm = ones(H);
      L.post_ffn_norm = ones(H);
    }
    L.gate_proj = dummy_matrix(seed, id++, I, H, std);
    L.up_proj = dummy_matrix(seed, id++, I, H, std);
    L.down_proj = dummy_matrix(seed, id++, H, I, std);
    if (c.mlp_bias) {
      L.gate_bias = zeros(I);
      L.up_bias = zeros(I);
      L.down_bias = zeros(H);
    }
  }
  // Gated DeltaNet layers (qwen3_5): ids after every layer's seven above,
  // kDummyGdnIdsPerLayer per layer index (linear or not), so that adding
  // them moved no other matrix's id. Values after transformers' init
  // (Qwen3_5 / Qwen3Next _init_weights): projections N(0, std), the conv
  // N(0, std) (its Conv1d init), dt_bias 1, A = exp(A_log) uniform in
  // [1, 16) (transformers draws from (0.01, 16); the floor of 1 is
  // ModelWeights::random's, which the goldens and CPU tests run), the gated
  // norm 1 (Qwen3_5RMSNormGated: a plain weight).
  if (id != dummy_layer_matrix_id(c, c.num_layers, 0)) throw std::logic_error("dummy_weights: matrix id order");
  if (c.gdn) {
    const GatedDeltaNetConfig& g = *c.gdn;
    const int64_t C = g.conv_dim(), Hv = g.num_v_heads, Dv = g.v_head_dim, K = g.conv_kernel;
    for (int li = 0; li < c.num_layers; ++li) {
      if (!c.is_linear(li)) continue;
      LayerWeights& L = w->layers[li];
      const uint64_t b = dummy_gdn_matrix_id(c, li);
      L.in_proj_qkv = dummy_matrix(seed, b + 0, C, H, std);
      L.in_proj_z = dummy_matrix(seed, b + 1, Hv * Dv, H, std);
      L.in_proj_b = dummy_matrix(seed, b + 2, Hv, H, std);
      L.in_proj_a = dummy_matrix(seed, b + 3, Hv, H, std);
      L.out_proj = dummy_matrix(seed, b + 4, H, Hv * Dv, std);
      // conv1d [C][K]: bf16 values (what a bf16 checkpoint holds), as f32.
      const WeightMatrix conv = fp8kv::dummy_matrix(seed, b + 5, C, K, std);
      L.conv1d.resize(static_cast<size_t>(C * K));
      for (int64_t e = 0; e < C * K; ++e) L.conv1d[e] = bf16_to_f32(static_cast<const uint16_t*>(conv.data)[e]);
      L.A_log = dummy_a_log(seed, b + 6, 0, Hv);
      L.dt_bias = ones(Hv);
      L.gdn_norm = ones(Dv);
    }
  }
  // --load-format dummy with a quantization_config: the projections the
  // config quantizes become fp8 (the embedding and lm_head stay bf16, as in
  // the checkpoints). Host matrices are the bf16 dummy quantized with amax /
  // 448 scales; a lazy (device-made) matrix is generated straight as e4m3
  // with one constant scale, kDummyFp8Sigmas * std / 448 in every scale
  // slot (values past that many standard deviations saturate): the same
  // bytes per weight and scale layout as a checkpoint, not the host's values.
  const WeightQuantConfig& q = c.weight_quant;
  if (q.quantized()) {
    const std::string prefix = default_weight_naming(c).prefix;
    for (int i = 0; i < c.num_layers; ++i) {
      LayerWeights& L = w->layers[i];
      // As the checkpoint loader binds them (model/weights.cpp Binder):
      // every projection the config does not exclude, the Gated DeltaNet
      // ones included.
      const std::pair<const char*, WeightMatrix*> mats[] = {
          {"self_attn.q_proj", &L.q_proj},
          {"self_attn.k_proj", &L.k_proj},
          {"self_attn.v_proj", &L.v_proj},
          {"self_attn.o_proj", &L.o_proj},
          {"mlp.gate_proj", &L.gate_proj},
          {"mlp.up_proj", &L.up_proj},
          {"mlp.down_proj", &L.down_proj},
          {"linear_attn.in_proj_qkv", &L.in_proj_qkv},
          {"linear_attn.in_proj_z", &L.in_proj_z},
          {"linear_attn.in_proj_b", &L.in_proj_b},
          {"linear_attn.in_proj_a", &L.in_proj_a},
          {"linear_attn.out_proj", &L.out_proj}};
      for (const auto& [name, m] : mats)
        if ((m->data || m->dummy) && !q.is_excluded(fmt::format("{}layers.{}.{}", prefix, i, name))) *m = lazy ? lazy_fp8(*m, q.granularity) : to_fp8(*m, q.granularity);
    }
  }
  return w;
}

}  // namespace fp8kv
