#include "model/weights.h"

#include <unistd.h>

#include <cmath>
#include <random>
#include <type_traits>

#include <fmt/format.h>

#include "io/checkpoint.h"
#include "io/errors.h"
#include "model/weights_spec.h"
#include "numerics/fp8.h"

namespace fp8kv {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Which matrices an FP8-weight checkpoint quantizes: the attention and MLP
// projections unless its exclusion list names them; lm_head when its tensor
// is stored as F8_E4M3 (transformers leaves it unquantized by default);
// never the embedding.
enum class Quantizable { never, unless_excluded, if_stored_fp8 };

class Binder {
 public:
  Binder(std::shared_ptr<const Checkpoint> ckpt, std::string prefix, const WeightQuantConfig& quant)
      : ckpt_(std::move(ckpt)), prefix_(std::move(prefix)), quant_(quant) {}

  bool has(const std::string& name) const { return ckpt_->has(prefix_ + name); }

  void check_shape(const std::string& full, const std::vector<int64_t>& got, const std::vector<int64_t>& want) const {
    if (got != want)
      throw InputError(fmt::format("{}: tensor {} has shape {}, expected {}", ckpt_->dir().string(), full,
                                   shape_str(got), shape_str(want)));
  }

  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols, bool with_prefix = true,
                      Quantizable qz = Quantizable::unless_excluded) const {
    const std::string full = with_prefix ? prefix_ + name : name;
    TensorView v = ckpt_->view(full);
    check_shape(full, v.shape(), {rows, cols});
    WeightMatrix m;
    m.rows = rows;
    m.cols = cols;
    const std::string module = full.substr(0, full.size() - std::string_view(".weight").size());
    const bool stored_fp8 = v.dtype() == DType::F8_E4M3;
    const bool excluded = quant_.is_excluded(module);
    if (stored_fp8 || (qz == Quantizable::unless_excluded && !excluded)) {
      check_fp8_weight(full, module, v.dtype(), qz, excluded);
      m.fp8 = true;
      m.data = v.data;
      m.owner = ckpt_;
      m.scale_granularity = quant_.granularity;
      m.scales = scales(full, module, rows, cols);
      return m;
    }
    if (v.dtype() == DType::BF16 || v.dtype() == DType::F32) {
      m.bf16 = v.dtype() == DType::BF16;
      m.data = v.data;
      m.owner = ckpt_;  // views live as long as the checkpoint
    } else if (v.dtype() == DType::F16) {
      auto buf = std::shared_ptr<float[]>(new float[static_cast<size_t>(rows * cols)]);
      tensor_to_f32(v, std::span<float>(buf.get(), static_cast<size_t>(rows * cols)));
      m.data = buf.get();
      m.owner = std::shared_ptr<const void>(buf, buf.get());
    } else {
      throw InputError(fmt::format("{}: tensor {} has dtype {}, expected BF16, F16 or F32", ckpt_->dir().string(), full,
                                   dtype_name(v.dtype())));
    }
    return m;
  }

  // An F8_E4M3 tensor is accepted only where the quantization config puts one.
  void check_fp8_weight(const std::string& full, const std::string& module, DType dt, Quantizable qz,
                        bool excluded) const {
    const std::string where = fmt::format("{}: tensor {}", ckpt_->file_of(full)->string(), full);
    const std::string decl = fmt::format("{} {} (quant_method {})", quant_.source, quant_.field,
                                         weight_quant_method_name(quant_.method));
    if (dt != DType::F8_E4M3)
      throw InputError(fmt::format("{} has dtype {}, expected F8_E4M3: {} quantizes module {} (it is not in {})",
                                   where, dtype_name(dt), decl, module, quant_.excluded_field()));
    if (!quant_.quantized())
      throw InputError(fmt::format("{} is F8_E4M3 but config.json declares no weight quantization (supported: "
                                   "quantization_config with quant_method fp8, compressed-tensors or modelopt)",
                                   where));
    if (qz == Quantizable::never)
      throw InputError(fmt::format("{} is F8_E4M3; fp8 embeddings are not supported (expected BF16, F16 or F32)",
                                   where));
    if (excluded)
      throw InputError(fmt::format("{} is F8_E4M3 but {} lists module {} in {} (unquantized)", where, decl, module,
                                   quant_.excluded_field()));
  }

  // The module's scales as f32 (shape per granularity), each finite and > 0;
  // its input_scale, when present, checked likewise (W8A8 runs dynamic).
  std::shared_ptr<const std::vector<float>> scales(const std::string& full, const std::string& module, int64_t N,
                                                   int64_t K) const {
    const std::string name = module + "." + quant_.scale_suffix;
    const std::string what = fmt::format("the {} scales of fp8 weight {} [{}, {}] ({} {}, quant_method {})",
                                         scale_granularity_name(quant_.granularity), full, N, K, quant_.source,
                                         quant_.field, weight_quant_method_name(quant_.method));
    if (!ckpt_->has(name)) throw InputError(fmt::format("{}: missing tensor {}, {}", ckpt_->dir().string(), name, what));
    TensorView v = ckpt_->view(name);
    const auto [sr, sc] = fp8_scale_shape(quant_.granularity, N, K);
    const auto& sh = v.shape();
    bool ok = false;
    switch (quant_.granularity) {
      case ScaleGranularity::tensor: ok = v.numel() == 1 && sh.size() <= 2; break;
      case ScaleGranularity::channel: ok = sh == std::vector<int64_t>{N, 1} || sh == std::vector<int64_t>{N}; break;
      case ScaleGranularity::block128: ok = sh == std::vector<int64_t>{sr, sc}; break;
    }
    const std::string file = ckpt_->file_of(name)->string();
    if (!ok) {
      const std::string want = quant_.granularity == ScaleGranularity::tensor    ? "[] or [1]"
                               : quant_.granularity == ScaleGranularity::channel ? fmt::format("[{}, 1] or [{}]", N, N)
                                                                                 : shape_str({sr, sc});
      throw InputError(fmt::format("{}: tensor {} has shape {}, expected {} ({})", file, name, shape_str(sh), want,
                                   what));
    }
    if (v.dtype() != DType::F32 && v.dtype() != DType::BF16 && v.dtype() != DType::F16)
      throw InputError(fmt::format("{}: tensor {} has dtype {}, expected F32, BF16 or F16 ({})", file, name,
                                   dtype_name(v.dtype()), what));
    auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(sr * sc));
    tensor_to_f32(v, *out);
    check_positive_scales(file, name, *out);
    const std::string in_name = module + ".input_scale";
    if (ckpt_->has(in_name)) {
      TensorView iv = ckpt_->view(in_name);
      const std::string ifile = ckpt_->file_of(in_name)->string();
      if (iv.numel() != 1 || !is_float_dtype(iv.dtype()))
        throw InputError(fmt::format("{}: tensor {} has shape {} dtype {}, expected one float (a per-tensor "
                                     "activation scale)", ifile, in_name, shape_str(iv.shape()),
                                     dtype_name(iv.dtype())));
      std::vector<float> in(1);
      tensor_to_f32(iv, in);
      check_positive_scales(ifile, in_name, in);
    }
    return out;
  }

  static void check_positive_scales(const std::string& file, const std::string& name, const std::vector<float>& s) {
    for (size_t i = 0; i < s.size(); ++i)
      if (!std::isfinite(s[i]) || !(s[i] > 0.0f))
        throw InputError(fmt::format("{}: tensor {} holds {} at element {}; fp8 weight scales must be finite and > 0",
                                     file, name, std::isnan(s[i]) ? "NaN" : fmt::format("{}", s[i]), i));
  }

  // Any-shape tensor as f32 (e.g. the [C][1][K] conv1d weight of a Gated DeltaNet layer).
  std::vector<float> tensor_f32(const std::string& name, const std::vector<int64_t>& shape) const {
    const std::string full = prefix_ + name;
    TensorView v = ckpt_->view(full);
    check_shape(full, v.shape(), shape);
    std::vector<float> out(static_cast<size_t>(v.numel()));
    tensor_to_f32(v, out);
    return out;
  }

  std::vector<float> vec(const std::string& name, int64_t n, bool plus_one = false) const {
    const std::string full = prefix_ + name;
    TensorView v = ckpt_->view(full);
    check_shape(full, v.shape(), {n});
    std::vector<float> out(static_cast<size_t>(n));
    tensor_to_f32(v, out);
    if (plus_one)
      for (auto& x : out) x = 1.0f + x;  // Gemma3RMSNorm: (1.0 + weight.float()) in fp32
    return out;
  }

 private:
  std::shared_ptr<const Checkpoint> ckpt_;
  std::string prefix_;
  const WeightQuantConfig& quant_;
};

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace

namespace {
// Index of the first NaN/inf of a matrix and its kind, or -1.
int64_t first_bad(const WeightMatrix& m, const char** kind) {
  const int64_t n = m.rows * m.cols;
  if (m.fp8) {  // e4m3 has no infinities; NaN is S.1111.111
    const uint8_t* q = static_cast<const uint8_t*>(m.data);
    constexpr int64_t kBlock = 4096;  // a branch-free pass per block (vectorized), then the index
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      bool any = false;
      for (int64_t i = b; i < e; ++i) any |= (q[i] & 0x7f) == 0x7f;
      if (!any) continue;
      for (int64_t i = b; i < e; ++i)
        if ((q[i] & 0x7f) == 0x7f) {
          *kind = "NaN";
          return i;
        }
    }
    return -1;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float x = m.bf16 ? bf16_to_f32(static_cast<const uint16_t*>(m.data)[i]) : static_cast<const float*>(m.data)[i];
    if (!std::isfinite(x)) {
      *kind = std::isnan(x) ? "NaN" : x > 0 ? "inf" : "-inf";
      return i;
    }
  }
  return -1;
}
int64_t first_bad(const std::vector<float>& v, const char** kind) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) {
      *kind = std::isnan(v[i]) ? "NaN" : v[i] > 0 ? "inf" : "-inf";
      return static_cast<int64_t>(i);
    }
  return -1;
}

// A layer's named tensors (names after "model.layers.N."): matrices, then
// vectors; what first_non_finite and largest_value walk.
struct LayerTensors {
  std::vector<std::pair<const char*, const WeightMatrix*>> mats;
  std::vector<std::pair<const char*, const std::vector<float>*>> vecs;
};
LayerTensors layer_tensors(const LayerWeights& w) {
  return {{{"self_attn.q_proj.weight", &w.q_proj},        {"self_attn.k_proj.weight", &w.k_proj},
           {"self_attn.v_proj.weight", &w.v_proj},        {"self_attn.o_proj.weight", &w.o_proj},
           {"mlp.gate_proj.weight", &w.gate_proj},        {"mlp.up_proj.weight", &w.up_proj},
           {"mlp.down_proj.weight", &w.down_proj},        {"linear_attn.in_proj_qkv.weight", &w.in_proj_qkv},
           {"linear_attn.in_proj_z.weight", &w.in_proj_z}, {"linear_attn.in_proj_b.weight", &w.in_proj_b},
           {"linear_attn.in_proj_a.weight", &w.in_proj_a}, {"linear_attn.out_proj.weight", &w.out_proj}},
          {{"input_layernorm.weight", &w.input_norm},       {"self_attn.q_proj.bias", &w.q_bias},
           {"self_attn.k_proj.bias", &w.k_bias},            {"self_attn.v_proj.bias", &w.v_bias},
           {"self_attn.o_proj.bias", &w.o_bias},            {"self_attn.q_norm.weight", &w.q_norm},
           {"self_attn.k_norm.weight", &w.k_norm},          {"post_attention_layernorm.weight", &w.post_attention_norm},
           {"pre_feedforward_layernorm.weight", &w.pre_ffn_norm}, {"post_feedforward_layernorm.weight", &w.post_ffn_norm},
           {"mlp.gate_proj.bias", &w.gate_bias},            {"mlp.up_proj.bias", &w.up_bias},
           {"mlp.down_proj.bias", &w.down_bias},            {"linear_attn.conv1d.weight", &w.conv1d},
           {"linear_attn.A_log", &w.A_log},                 {"linear_attn.dt_bias", &w.dt_bias},
           {"linear_attn.norm.weight", &w.gdn_norm}}};
}
}  // namespace

std::optional<std::string> ModelWeights::first_non_finite() const { return first_bad_tensor(false); }
std::optional<std::string> ModelWeights::first_nan_fp8() const { return first_bad_tensor(true); }

std::optional<std::string> ModelWeights::first_bad_tensor(bool fp8_only) const {
  const char* kind = "";
  auto found = [&](const std::string& name, int64_t i) {
    return std::optional<std::string>(fmt::format("{} holds {} at element {}", name, kind, i));
  };
  auto scan = [&](const WeightMatrix& m) { return m.data && (!fp8_only || m.fp8); };
  if (scan(embed))
    if (int64_t i = first_bad(embed, &kind); i >= 0) return found("model.embed_tokens.weight (the embedding)", i);
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& L = layers[l];
    const std::string p = fmt::format("model.layers.{}.", l);
    const std::string tag = fmt::format(" (layer {})", l);
    const LayerTensors t = layer_tensors(L);
    for (const auto& [n, m] : t.mats)
      if (scan(*m))
        if (int64_t i = first_bad(*m, &kind); i >= 0) return found(p + n + tag, i);
    if (!fp8_only)
      for (const auto& [n, v] : t.vecs)
        if (int64_t i = first_bad(*v, &kind); i >= 0) return found(p + n + tag, i);
  }
  if (!fp8_only)
    if (int64_t i = first_bad(final_norm, &kind); i >= 0) return found("model.norm.weight (the final norm)", i);
  if (lm_head && scan(*lm_head))
    if (int64_t i = first_bad(*lm_head, &kind); i >= 0) return found("lm_head.weight", i);
  return std::nullopt;
}

namespace {
// The largest |value| of a matrix (fp8: its largest scale) and its index.
std::pair<float, int64_t> largest_abs(const WeightMatrix& m) {
  std::pair<float, int64_t> best{-1.0f, -1};
  if (!m.data) return best;
  if (m.fp8) {
    if (!m.scales) return best;
    for (size_t i = 0; i < m.scales->size(); ++i)
      if (std::fabs((*m.scales)[i]) > best.first) best = {std::fabs((*m.scales)[i]), static_cast<int64_t>(i)};
    return best;
  }
  const int64_t n = m.rows * m.cols;
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::fabs(m.bf16 ? bf16_to_f32(static_cast<const uint16_t*>(m.data)[i])
                                     : static_cast<const float*>(m.data)[i]);
    if (x > best.first) best = {x, i};
  }
  return best;
}
std::pair<float, int64_t> largest_abs(const std::vector<float>& v) {
  std::pair<float, int64_t> best{-1.0f, -1};
  for (size_t i = 0; i < v.size(); ++i)
    if (std::fabs(v[i]) > best.first) best = {std::fabs(v[i]), static_cast<int64_t>(i)};
  return best;
}
}  // namespace

std::string ModelWeights::largest_value(int stage) const {
  std::string name;
  std::pair<float, int64_t> best{-1.0f, -1};
  bool scale = false;
  const auto consider = [&](const std::string& n, const auto& t) {
    const auto b = largest_abs(t);
    if (b.first > best.first) {
      best = b;
      name = n;
      if constexpr (std::is_same_v<std::decay_t<decltype(t)>, WeightMatrix>) scale = t.fp8;
      else scale = false;
    }
  };
  const int L = static_cast<int>(layers.size());
  if (stage < 0) {
    consider("model.embed_tokens.weight", embed);
  } else if (stage < L) {
    const LayerWeights& w = layers[static_cast<size_t>(stage)];
    const std::string p = fmt::format("model.layers.{}.", stage);
    const LayerTensors t = layer_tensors(w);
    for (const auto& [n, m] : t.mats) consider(p + n, *m);
    for (const auto& [n, v] : t.vecs) consider(p + n, *v);
  } else if (stage == L) {
    consider("model.norm.weight", final_norm);
  } else {
    consider(lm_head ? "lm_head.weight" : "model.embed_tokens.weight (tied to lm_head)", output());
  }
  if (best.second < 0) return "no values";
  return fmt::format("{} holds {:.3g}{} at element {}", name, best.first, scale ? " as its largest scale" : " in magnitude",
                     best.second);
}

namespace {
template <class F>
void for_each_matrix(const ModelWeights& w, F&& f) {
  f(w.embed);
  if (w.lm_head) f(*w.lm_head);
  for (const auto& l : w.layers)
    for (const WeightMatrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj,
                                  &l.in_proj_qkv, &l.in_proj_z, &l.in_proj_b, &l.in_proj_a, &l.out_proj})
      f(*m);
}
}  // namespace

size_t ModelWeights::matrix_bytes() const {
  size_t b = 0;
  for_each_matrix(*this, [&](const WeightMatrix& m) { b += m.bytes() + m.scale_bytes(); });
  return b;
}

bool ModelWeights::has_fp8() const {
  bool any = false;
  for_each_matrix(*this, [&](const WeightMatrix& m) { any = any || m.fp8; });
  return any;
}

std::shared_ptr<ModelWeights> ModelWeights::load(std::shared_ptr<const Checkpoint> ckpt, const ModelConfig& c,
                                                 bool check_memory) {
  // Refuse up front when the weights cannot fit: bf16/fp32 stay as stored,
  // fp16 doubles (converted to fp32).
  uint64_t need = 0;
  for (const auto& n : ckpt->tensor_names()) {
    const TensorInfo* t = ckpt->find(n);
    need += t->dtype == DType::F16 ? 2 * t->nbytes() : t->nbytes();
  }
  const uint64_t have = physical_memory_bytes();
  if (check_memory && have > 0 && need > have / 10 * 9)
    throw InputError(fmt::format("{}: the weights need {:.1f} GiB of memory and this machine has {:.1f} GiB",
                                 ckpt->dir().string(), need / 1073741824.0, have / 1073741824.0));

  const WeightNaming naming = detect_weight_naming(c, *ckpt);
  Binder b(ckpt, naming.prefix, c.weight_quant);
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, I = c.intermediate_size,
                V = c.vocab_size;
  const bool p1 = c.gemma_norm_plus_one;
  auto w = std::make_shared<ModelWeights>();
  w->embed = b.matrix("embed_tokens.weight", V, H, true, Quantizable::never);
  if (!c.tie_word_embeddings) {
    if (!ckpt->has(naming.lm_head))
      throw InputError(fmt::format("{}: missing tensor {} (tie_word_embeddings is false)", ckpt->dir().string(),
                                   naming.lm_head));
    w->lm_head = b.matrix(naming.lm_head, V, H, /*with_prefix=*/false, Quantizable::if_stored_fp8);
  }
  w->final_norm = b.vec("norm.weight", H, p1);
  if (c.embed_scale_sqrt_hidden) {
    // transformers multiplies by sqrt(H) cast to the embedding dtype.
    const float s = std::sqrt(static_cast<float>(H));
    w->embed_scale = w->embed.bf16 ? round_bf16(s) : s;
  }
  w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& L = w->layers[i];
    const std::string p = fmt::format("layers.{}.", i);
    L.input_norm = b.vec(p + "input_layernorm.weight", H, p1);
    if (c.is_linear(i)) {  // a Gated DeltaNet layer (qwen3_5): no attention tensors
      const GatedDeltaNetConfig& g = *c.gdn;
      const std::string a = p + "linear_attn.";
      L.in_proj_qkv = b.matrix(a + "in_proj_qkv.weight", g.conv_dim(), H);
      L.in_proj_z = b.matrix(a + "in_proj_z.weight", g.value_dim(), H);
      L.in_proj_b = b.matrix(a + "in_proj_b.weight", g.num_v_heads, H);
      L.in_proj_a = b.matrix(a + "in_proj_a.weight", g.num_v_heads, H);
      L.out_proj = b.matrix(a + "out_proj.weight", H, g.value_dim());
      L.conv1d = b.tensor_f32(a + "conv1d.weight", {g.conv_dim(), 1, g.conv_kernel});
      L.A_log = b.vec(a + "A_log", g.num_v_heads);
      L.dt_bias = b.vec(a + "dt_bias", g.num_v_heads);
      L.gdn_norm = b.vec(a + "norm.weight", g.v_head_dim);  // Qwen3_5RMSNormGated: a plain weight
    } else {
      L.q_proj = b.matrix(p + "self_attn.q_proj.weight", Hq * D * (c.attn_output_gate ? 2 : 1), H);
      L.k_proj = b.matrix(p + "self_attn.k_proj.weight", Hkv * D, H);
      L.v_proj = b.matrix(p + "self_attn.v_proj.weight", Hkv * D, H);
      L.o_proj = b.matrix(p + "self_attn.o_proj.weight", H, Hq * D);
      if (c.attention_bias) {
        L.q_bias = b.vec(p + "self_attn.q_proj.bias", Hq * D);
        L.k_bias = b.vec(p + "self_attn.k_proj.bias", Hkv * D);
        L.v_bias = b.vec(p + "self_attn.v_proj.bias", Hkv * D);
      }
      if (c.o_proj_bias) L.o_bias = b.vec(p + "self_attn.o_proj.bias", H);
      if (c.qk_norm) {
        L.q_norm = b.vec(p + "self_attn.q_norm.weight", D, p1);
        L.k_norm = b.vec(p + "self_attn.k_norm.weight", D, p1);
      }
    }
    L.post_attention_norm = b.vec(p + "post_attention_layernorm.weight", H, p1);
    if (c.sandwich_norms) {
      L.pre_ffn_norm = b.vec(p + "pre_feedforward_layernorm.weight", H, p1);
      L.post_ffn_norm = b.vec(p + "post_feedforward_layernorm.weight", H, p1);
    }
    L.gate_proj = b.matrix(p + "mlp.gate_proj.weight", I, H);
    L.up_proj = b.matrix(p + "mlp.up_proj.weight", I, H);
    L.down_proj = b.matrix(p + "mlp.down_proj.weight", H, I);
    if (c.mlp_bias) {
      L.gate_bias = b.vec(p + "mlp.gate_proj.bias", I);
      L.up_bias = b.vec(p + "mlp.up_proj.bias", I);
      L.down_bias = b.vec(p + "mlp.down_proj.bias", H);
    }
  }
  return w;
}

namespace {

WeightMatrix widen(const WeightMatrix& m) {
  if (!m.bf16) return m;
  const size_t n = static_cast<size_t>(m.rows * m.cols);
  auto buf = std::shared_ptr<float[]>(new float[n]);
  const uint16_t* src = static_cast<const uint16_t*>(m.data);
  for (size_t i = 0; i < n; ++i) buf[i] = bf16_to_f32(src[i]);
  WeightMatrix w = m;
  w.bf16 = false;
  w.data = buf.get();
  w.owner = std::shared_ptr<const void>(buf, buf.get());
  return w;
}

}  // namespace

std::shared_ptr<ModelWeights> ModelWeights::widened_to_f32() const {
  auto w = std::make_shared<ModelWeights>(*this);
  w->embed = widen(embed);
  if (lm_head) {
    // A row range of the embedding (a tensor-parallel rank's vocab-parallel
    // slice of a tied head, engine/tp_shard.cpp) stays a view, into the
    // widened embedding: no second copy of those rows.
    const char* e = static_cast<const char*>(embed.data);
    const char* h = static_cast<const char*>(lm_head->data);
    const size_t row_bytes = static_cast<size_t>(embed.cols) * 2;
    if (embed.bf16 && lm_head->bf16 && !lm_head->fp8 && e && h && lm_head->cols == embed.cols && h >= e &&
        h + lm_head->bytes() <= e + embed.bytes() && static_cast<size_t>(h - e) % row_bytes == 0) {
      WeightMatrix v = w->embed;
      v.rows = lm_head->rows;
      v.data = static_cast<const float*>(w->embed.data) + static_cast<size_t>(h - e) / 2;
      w->lm_head = v;
    } else {
      w->lm_head = widen(*lm_head);
    }
  }
  for (auto& L : w->layers) {
    for (WeightMatrix* m : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj})
      *m = widen(*m);
  }
  return w;
}

namespace {

WeightMatrix random_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols, float std, bool bf16) {
  std::normal_distribution<float> nd(0.0f, std);
  WeightMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.bf16 = bf16;
  const size_t n = static_cast<size_t>(rows * cols);
  if (bf16) {
    auto buf = std::shared_ptr<uint16_t[]>(new uint16_t[n]);
    for (size_t i = 0; i < n; ++i) buf[i] = f32_to_bf16(nd(rng));
    m.data = buf.get();
    m.owner = std::shared_ptr<const void>(buf, buf.get());
  } else {
    auto buf = std::shared_ptr<float[]>(new float[n]);
    for (size_t i = 0; i < n; ++i) buf[i] = nd(rng);
    m.data = buf.get();
    m.owner = std::shared_ptr<const void>(buf, buf.get());
  }
  return m;
}

std::vector<float> random_vec(std::mt19937_64& rng, int64_t n, float mean, float std) {
  std::normal_distribution<float> nd(mean, std);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

// A Gated DeltaNet layer's random weights: projections N(0, std), the conv
// N(0, 0.5) (K taps of O(1)), A = exp(A_log) in [1, 16) and dt_bias 1
// (transformers' init), the gated norm around 1.
void random_linear_attention(std::mt19937_64& rng, const ModelConfig& c, float std, bool bf16, LayerWeights& L) {
  const GatedDeltaNetConfig& g = *c.gdn;
  const int64_t H = c.hidden_size;
  L.in_proj_qkv = random_matrix(rng, g.conv_dim(), H, std, bf16);
  L.in_proj_z = random_matrix(rng, g.value_dim(), H, std, bf16);
  L.in_proj_b = random_matrix(rng, g.num_v_heads, H, std, bf16);
  L.in_proj_a = random_matrix(rng, g.num_v_heads, H, std, bf16);
  L.out_proj = random_matrix(rng, H, g.value_dim(), std, bf16);
  L.conv1d = random_vec(rng, g.conv_dim() * g.conv_kernel, 0.0f, 0.5f);
  std::uniform_real_distribution<float> ud(1.0f, 16.0f);
  L.A_log.resize(g.num_v_heads);
  for (auto& x : L.A_log) x = std::log(ud(rng));
  L.dt_bias.assign(g.num_v_heads, 1.0f);
  L.gdn_norm = random_vec(rng, g.v_head_dim, 1.0f, 0.1f);
}

}  // namespace

std::shared_ptr<ModelWeights> ModelWeights::random(const ModelConfig& c, uint64_t seed, float std, bool bf16) {
  std::mt19937_64 rng(seed);
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, I = c.intermediate_size,
                V = c.vocab_size;
  auto w = std::make_shared<ModelWeights>();
  w->embed = random_matrix(rng, V, H, std, bf16);
  if (!c.tie_word_embeddings) w->lm_head = random_matrix(rng, V, H, std, bf16);
  w->final_norm = random_vec(rng, H, 1.0f, 0.1f);
  if (c.embed_scale_sqrt_hidden) {
    const float s = std::sqrt(static_cast<float>(H));
    w->embed_scale = bf16 ? round_bf16(s) : s;
  }
  w->layers.resize(c.num_layers);
  for (size_t li = 0; li < w->layers.size(); ++li) {
    LayerWeights& L = w->layers[li];
    L.input_norm = random_vec(rng, H, 1.0f, 0.1f);
    if (c.is_linear(static_cast<int>(li))) {
      random_linear_attention(rng, c, std, bf16, L);
      L.post_attention_norm = random_vec(rng, H, 1.0f, 0.1f);
      L.gate_proj = random_matrix(rng, I, H, std, bf16);
      L.up_proj = random_matrix(rng, I, H, std, bf16);
      L.down_proj = random_matrix(rng, H, I, std, bf16);
      continue;
    }
    L.q_proj = random_matrix(rng, Hq * D * (c.attn_output_gate ? 2 : 1), H, std, bf16);
    L.k_proj = random_matrix(rng, Hkv * D, H, std, bf16);
    L.v_proj = random_matrix(rng, Hkv * D, H, std, bf16);
    L.o_proj = random_matrix(rng, H, Hq * D, std, bf16);
    if (c.attention_bias) {
      L.q_bias = random_vec(rng, Hq * D, 0.0f, std);
      L.k_bias = random_vec(rng, Hkv * D, 0.0f, std);
      L.v_bias = random_vec(rng, Hkv * D, 0.0f, std);
    }
    if (c.o_proj_bias) L.o_bias = random_vec(rng, H, 0.0f, std);
    if (c.qk_norm) {
      L.q_norm = random_vec(rng, D, 1.0f, 0.1f);
      L.k_norm = random_vec(rng, D, 1.0f, 0.1f);
    }
    L.post_attention_norm = random_vec(rng, H, 1.0f, 0.1f);
    if (c.sandwich_norms) {
      L.pre_ffn_norm = random_vec(rng, H, 1.0f, 0.1f);
      L.post_ffn_norm = random_vec(rng, H, 1.0f, 0.1f);
    }
    L.gate_proj = random_matrix(rng, I, H, std, bf16);
    L.up_proj = random_matrix(rng, I, H, std, bf16);
    L.down_proj = random_matrix(rng, H, I, std, bf16);
    if (c.mlp_bias) {
      L.gate_bias = random_vec(rng, I, 0.0f, std);
      L.up_bias = random_vec(rng, I, 0.0f, std);
      L.down_bias = random_vec(rng, H, 0.0f, std);
    }
  }
  return w;
}

}  // namespace fp8kv
