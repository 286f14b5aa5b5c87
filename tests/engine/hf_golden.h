// Comparison of an engine backend against the transformers goldens written by
// tools/gen_model_goldens_hd64.py (tests/golden/models_hd64/<case>/), shared by
// the CPU test (test_goldens_hd64.cpp) and, later, the CUDA one: the backend
// is a parameter (EngineOptions::backend).
//
// Tolerances (docs/bench.md "HF goldens, head_dim 64/256"):
// - backend cpu (the reference): per-position logprob within the fp32
//   tolerance of test_goldens.cpp, scaled by the longest dot product: fp32
//   dot products of length K have relative error <= K * 2^-24 of sum |a_i b_i|
//   (test_engine_reference.cpp); the hd16/32 goldens use 1e-4 + 1e-4 |lp| for
//   K <= 128, so here 1e-4 * (K_max / 128) * (1 + |lp|), with K_max the
//   longest reduction (hidden, heads x head_dim, intermediate). Positions at
//   or after the first K/V rounding flip at layer 0 (two fp32 values on either
//   side of a rounding boundary), and the fp32 variant (compared with a bf16
//   cache), get in addition the whole-cache rounding effect of the format,
//   max |golden(dtype) - golden(fp32)|.
// - any other backend (bf16 weights, bf16 GEMMs): issue 12 §4. bf16 cache:
//   mean |logprob - golden fp32| <= min(1.5 x transformers' own bf16-vs-fp32
//   gap on the same inputs ("hf_bf16_gap"), 0.02). fp8 cache: <= 1.5 x the CPU
//   engine's fp8-vs-fp32 gap, which the fp8 golden variant stands for (the CPU
//   engine matches it to the tolerance above).
//   Layer-0 K/V elements (before rounding) against transformers' fp32 pass:
//   see kv_layer0_bounds below (derived where the model has plain RMSNorm and
//   no QK-norm; 2^-7 (1 + |K|) otherwise).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "io/safetensors.h"
#include "reference.h"

namespace fp8kv::testing {

inline std::filesystem::path hd64_golden_dir(const std::string& name) {
  return std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/golden/models_hd64" / name;
}

// The Qwen3.5 hybrid goldens written by tools/gen_gdn_goldens.py.
inline std::filesystem::path qwen3_5_golden_dir(const std::string& name) {
  return std::filesystem::path(FP8KV_SOURCE_DIR) / "tests/golden/models_qwen3_5" / name;
}

// qwen3_5_golden_dir(name)/golden.json into g; false when it is missing (the
// caller skips).
inline bool load_qwen3_5_golden(const std::string& name, nlohmann::json& g) {
  std::ifstream in(qwen3_5_golden_dir(name) / "golden.json");
  if (!in) return false;
  g = nlohmann::json::parse(in);
  return true;
}

// A golden's teacher-forced token sequences.
inline std::vector<std::vector<int>> golden_sequences(const nlohmann::json& g) {
  std::vector<std::vector<int>> seqs;
  for (const auto& q : g["sequences"]) seqs.push_back(q.get<std::vector<int>>());
  return seqs;
}

// Mean |logprob(variant a) - logprob(variant b)| over a golden's
// teacher-forced positions (all but each sequence's first); 0 without any.
inline double variant_gap(const nlohmann::json& g, const char* a, const char* b) {
  double sum = 0;
  int n = 0;
  for (size_t s = 0; s < g["sequences"].size(); ++s)
    for (size_t p = 1; p < g["sequences"][s].size(); ++p, ++n)
      sum += std::fabs(g["variants"][a][s]["logprobs"][p].get<double>() -
                       g["variants"][b][s]["logprobs"][p].get<double>());
  return n ? sum / n : 0.0;
}

struct GoldenOutcome {
  double mean_abs_vs_variant = 0.0;  // mean |lp - golden(variant)| over all scored positions
  double mean_abs_vs_fp32 = 0.0;     // mean |lp - golden(fp32)|
  double max_abs_vs_variant = 0.0;
  int64_t flips = 0;                 // layer-0 K/V elements rounded differently (fp8/bf16 variants)
};

// Longest reduction in the forward pass (the dot-product length bound).
inline int longest_reduction(const ModelConfig& c) {
  return std::max({c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size, c.head_dim});
}

// Layer-0 K/V bound for a backend with bf16 GEMM inputs (docs/design.md,
// "Numerics": fp32 RMSNorm, its output x rounded to bf16, bf16 weights, fp32
// accumulation), per token and element, against transformers' fp32 pass:
//   |dP_j| <= (u_x + u_w + (H + 2) 2^-24) S_j + u_b |b_j|,  S_j = sum_i |x_i W_ji|,
// with u_x = 2^-9 (x to bf16), u_w = 2^-9 when the checkpoint's weight is not
// bf16 (rounded at upload; 0 when it is), u_b likewise for a bias. RoPE mixes
// element j with its partner j +- D/2 with |cos|, |sin| <= 1, so K's bound is
// the sum of the two, plus 2^-16 (|K_j| + |K_partner|) for cos/sin computed
// differently in fp32 (position < 2^7, angle ulp ~2^-24 x 2^7). Computed in
// double from the checkpoint for families with plain RMSNorm, no QK-norm and
// no embedding scale (llama, mistral, qwen2); empty otherwise (the caller
// then keeps 2^-7 (1 + |K|), which qwen3 and gemma3 meet). Derivation and the
// run that motivated it: docs/cuda_backend.md "Run L".
struct KvBounds {
  std::vector<std::vector<double>> k, v;  // [token][kv_heads * head_dim]
};
// The layer-0 tensors kv_layer0_bounds reads, as fp32, loaded once per
// checkpoint directory (each golden case has several sequences; the file was
// re-read for every one). ok: the model has them all.
struct Layer0Tensors {
  bool ok = false;
  std::vector<float> emb, nw;
  struct Proj {
    std::vector<float> w, b;  // b: zeros when there is no bias
    bool has_b = false;
    double u_w = 0, u_b = 0;  // 2^-9 when the checkpoint dtype is not bf16
  } k, v;
};
inline const Layer0Tensors& layer0_tensors(const std::filesystem::path& dir, const ModelConfig& c) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Layer0Tensors>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[std::filesystem::weakly_canonical(dir).string()];
  if (slot) return *slot;
  slot = std::make_unique<Layer0Tensors>();
  Layer0Tensors& t = *slot;
  auto m = SafetensorsFile::open(dir / "model.safetensors");
  const std::string L0 = "model.layers.0.";
  for (const char* n : {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"})
    if (!m->find(n)) return t;
  const int P = c.num_kv_heads * c.head_dim;
  t.emb = m->to_f32("model.embed_tokens.weight");
  t.nw = m->to_f32(L0 + "input_layernorm.weight");
  auto rel = [&](const std::string& n) { return m->find(n)->dtype == DType::BF16 ? 0.0 : 0x1p-9; };
  for (auto [which, pr] : {std::pair{"k", &t.k}, std::pair{"v", &t.v}}) {
    const std::string wn = L0 + "self_attn." + which + "_proj.weight", bn = L0 + "self_attn." + which + "_proj.bias";
    pr->w = m->to_f32(wn);
    pr->has_b = m->find(bn) != nullptr;
    pr->b = pr->has_b ? m->to_f32(bn) : std::vector<float>(static_cast<size_t>(P), 0.0f);
    pr->u_w = rel(wn);
    pr->u_b = pr->has_b ? rel(bn) : 0.0;
  }
  t.ok = true;
  return t;
}

inline KvBounds kv_layer0_bounds(const std::filesystem::path& dir, const ModelConfig& c, const std::vector<int>& ids) {
  KvBounds out;
  if (c.qk_norm || c.gemma_norm_plus_one || c.sandwich_norms) return out;
  const Layer0Tensors& t = layer0_tensors(dir, c);
  if (!t.ok) return out;
  const int H = c.hidden_size, P = c.num_kv_heads * c.head_dim, D = c.head_dim;
  const double acc = (H + 2) * 0x1p-24;
  auto proj = [&](const Layer0Tensors::Proj& pr, bool rope, std::vector<std::vector<double>>& dst) {
    const std::vector<float>& w = pr.w;
    const std::vector<float>& b = pr.b;
    const double u = 0x1p-9 + pr.u_w + acc, ub = pr.u_b;
    for (int id : ids) {
      const float* e = &t.emb[static_cast<size_t>(id) * H];
      double ms = 0;
      for (int i = 0; i < H; ++i) ms += static_cast<double>(e[i]) * e[i];
      const double r = 1.0 / std::sqrt(ms / H + c.rms_norm_eps);
      std::vector<double> bound(P), val(P);
      for (int j = 0; j < P; ++j) {
        double sabs = 0, sv = b[j];
        for (int i = 0; i < H; ++i) {
          const double xw = e[i] * r * t.nw[i] * w[static_cast<size_t>(j) * H + i];
          sabs += std::abs(xw);
          sv += xw;
        }
        bound[j] = u * sabs + ub * std::abs(b[j]);
        val[j] = sv;
      }
      if (rope) {
        std::vector<double> mixed(P);
        for (int j = 0; j < P; ++j) {
          const int pj = (j % D) < D / 2 ? j + D / 2 : j - D / 2;
          mixed[j] = bound[j] + bound[pj] + 0x1p-16 * (std::abs(val[j]) + std::abs(val[pj]));
        }
        bound.swap(mixed);
      }
      dst.push_back(std::move(bound));
    }
  };
  proj(t.k, true, out.k);
  proj(t.v, false, out.v);
  return out;
}

// The KV scales a golden variant was made with: golden.json's "scales"
// (K per tensor, V per head, per layer) for the fp8 variants, unity otherwise.
inline KvScales golden_kv_scales(const nlohmann::json& g, const std::string& variant, int num_layers) {
  KvScales sc = KvScales::unity(num_layers);
  if (variant == "fp8_e4m3" || variant == "fp8_e5m2") {
    const nlohmann::json& s = g["scales"][variant];
    for (int l = 0; l < num_layers; ++l) {
      sc.layers[l].k.values = {s["k"][l].get<float>()};
      sc.layers[l].v.values = s["v"][l].get<std::vector<float>>();
    }
  }
  return sc;
}

// variant: fp32 | bf16 | fp8_e4m3 | fp8_e5m2 (fp32 runs with a bf16 cache).
inline GoldenOutcome check_hf_golden(const std::string& name, const std::string& variant, BackendChoice backend) {
  namespace fs = std::filesystem;
  using nlohmann::json;
  GoldenOutcome out;
  const fs::path dir = hd64_golden_dir(name);
  if (!fs::exists(dir / "golden.json") || !fs::exists(dir / "kv.safetensors")) {
    ADD_FAILURE() << "golden files missing in " << dir
                  << ": run `python3 tools/gen_model_goldens_hd64.py` from the repo root on the GPU machine";
    return out;
  }
  std::ifstream in(dir / "golden.json");
  const json g = json::parse(in);
  auto kvf = SafetensorsFile::open(dir / "kv.safetensors");
  const bool reference = backend == BackendChoice::cpu;

  EngineOptions o;
  o.kv_cache_dtype = variant == "fp32" ? "bf16" : variant;
  o.max_model_len = 128;
  o.kv_memory_bytes = 64u << 20;
  o.backend = backend;
  auto e = Engine::load(dir, o);
  const ModelConfig& c = e->config();
  EXPECT_TRUE(c.head_dim == 64 || c.head_dim == 256) << name << ": head_dim " << c.head_dim;
  const KvScales sc = golden_kv_scales(g, variant, c.num_layers);
  e->set_kv_scales(sc);
  const KvDtype d = e->kv_dtype();
  const double k_scale = std::max(1.0, longest_reduction(c) / 128.0);

  double sum_var = 0.0, sum_fp32 = 0.0, sum_fmt_fp32 = 0.0;
  int64_t count = 0;
  const auto& seqs = g["sequences"];
  for (size_t si = 0; si < seqs.size(); ++si) {
    const std::vector<int> ids = seqs[si].get<std::vector<int>>();
    const int T = static_cast<int>(ids.size());
    KvRecorder rec(c.num_layers);
    e->set_store_observer(&rec);
    const ScoreResult r = e->score(ids);
    e->set_store_observer(nullptr);

    // Layer-0 K/V before rounding vs transformers' fp32 pass (same inputs in
    // every variant only at layer 0), and where the two round differently.
    const KvBounds kvb = reference ? KvBounds{} : kv_layer0_bounds(dir, c, ids);
    int first_flip = T;
    for (const char* kv : {"k", "v"}) {
      const std::string tn = "seq" + std::to_string(si) + ".layer0." + kv;
      const std::vector<float> ref = kvf->to_f32(tn);
      const int per = c.num_kv_heads * c.head_dim;
      EXPECT_EQ(ref.size(), static_cast<size_t>(T) * per) << tn;
      const auto& got = kv[0] == 'k' ? rec.rec.k[0] : rec.rec.v[0];
      if (got.size() != static_cast<size_t>(T) || ref.size() != static_cast<size_t>(T) * per) {
        ADD_FAILURE() << tn << ": recorded " << got.size() << " tokens, want " << T;
        return out;
      }
      const StreamScale& ss = kv[0] == 'k' ? sc.layers[0].k : sc.layers[0].v;
      // bf16 GEMMs (non-reference backends) round K/V to ~2^-8 relative.
      const double kv_rel = reference ? 1e-4 * k_scale : 0x1p-7;
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < per; ++i) {
          const float a = got[t][i], b = ref[static_cast<size_t>(t) * per + i];
          const auto& derived = kv[0] == 'k' ? kvb.k : kvb.v;
          const double line = derived.empty() ? kv_rel * (1.0 + std::abs(b)) : derived[t][i];
          EXPECT_LE(std::abs(a - b), line) << tn << " token " << t << " elem " << i;
          const float s = ss.at(i / c.head_dim);
          if (variant != "fp32" && roundtrip(a, s, d) != roundtrip(b, s, d)) {
            ++out.flips;
            first_flip = std::min(first_flip, t);
          }
        }
    }
    const auto& ref_lp = g["variants"][variant][si]["logprobs"];
    const auto& fp32_lp = g["variants"]["fp32"][si]["logprobs"];
    const std::string fmt_variant = variant == "fp32" ? "bf16" : variant;
    const auto& fmt_lp = g["variants"][fmt_variant][si]["logprobs"];
    double fmt_effect = 0.0;
    for (int p = 1; p < T; ++p)
      fmt_effect = std::max(fmt_effect, std::abs(fmt_lp[p].get<double>() - fp32_lp[p].get<double>()));
    for (int p = 1; p < T; ++p) {
      if (!r.logprobs[p].has_value()) {
        ADD_FAILURE() << name << " " << variant << " seq " << si << " pos " << p << ": no logprob";
        return out;
      }
      const double got = *r.logprobs[p], want = ref_lp[p].get<double>(), f32 = fp32_lp[p].get<double>();
      if (reference) {
        double tol = 1e-4 * k_scale * (1.0 + std::abs(want));
        if (variant == "fp32" || p >= first_flip) tol += fmt_effect;
        EXPECT_NEAR(got, want, tol) << name << " " << variant << " seq " << si << " pos " << p
                                    << " (first flip at " << first_flip << ")";
      }
      sum_var += std::abs(got - want);
      sum_fp32 += std::abs(got - f32);
      sum_fmt_fp32 += std::abs(fmt_lp[p].get<double>() - f32);
      out.max_abs_vs_variant = std::max(out.max_abs_vs_variant, std::abs(got - want));
      ++count;
    }
  }
  out.mean_abs_vs_variant = sum_var / std::max<int64_t>(count, 1);
  out.mean_abs_vs_fp32 = sum_fp32 / std::max<int64_t>(count, 1);
  if (!reference) {
    const double limit = (variant == "fp32" || variant == "bf16")
                             ? std::min(1.5 * g["hf_bf16_gap"]["mean_abs"].get<double>(), 0.02)
                             : 1.5 * sum_fmt_fp32 / std::max<int64_t>(count, 1);
    EXPECT_LE(out.mean_abs_vs_fp32, limit) << name << " " << variant << " on " << backend_choice_name(backend);
  }
  std::fprintf(stderr, "%s %s [%s]: mean|dlp| vs golden %.2e (max %.2e), vs fp32 %.2e, %lld layer-0 flips\n",
               name.c_str(), variant.c_str(), std::string(backend_choice_name(backend)).c_str(),
               out.mean_abs_vs_variant, out.max_abs_vs_variant, out.mean_abs_vs_fp32,
               static_cast<long long>(out.flips));
  return out;
}

}  // namespace fp8kv::testing
