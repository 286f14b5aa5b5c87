#include "backend/cpu/cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend_gdn.h"
#include "backend/cpu/kv_ops.h"
#include "backend/cpu/op_checks.h"
#include "backend/cpu/ops.h"
#include "model/weights.h"

namespace fp8kv {

namespace {

using cpu_op::bad;
using cpu_op::f32;
using cpu_op::shape;

MatrixRef matrix(const Tensor& t, const char* op) {
  if (t.is_fp8_weight()) return MatrixRef{t.data, WeightType::f8_e4m3, t.rows, t.cols, t.fp8};
  if (t.dtype != ScalarType::f32 && t.dtype != ScalarType::bf16)
    bad(op, fmt::format("weight must be f32, bf16 or fp8 with scales, got {}", shape(t)));
  return MatrixRef{t.data, t.dtype == ScalarType::bf16 ? WeightType::bf16 : WeightType::f32, t.rows, t.cols};
}

Tensor matrix_tensor(const WeightMatrix& m, Fp8Compute compute) {
  if (m.fp8)
    return Tensor{const_cast<void*>(m.data), ScalarType::u8, m.rows, m.cols,
                  Fp8WeightScales{m.scales->data(), m.scale_granularity, compute}};
  return Tensor{const_cast<void*>(m.data), m.bf16 ? ScalarType::bf16 : ScalarType::f32, m.rows, m.cols};
}

// W8A8 (--fp8-weight-mode w8a8): the activations as the fp8 GEMM sees them,
// rounded to e4m3 per token or per 1x128 group (numerics/fp8_weights.h);
// `x` itself when W is not fp8 or runs W8A16.
const float* activations_for(const float* x, int64_t T, const MatrixRef& W, std::vector<float>& scratch) {
  if (W.type != WeightType::f8_e4m3 || W.scales.compute != Fp8Compute::w8a8) return x;
  scratch.assign(x, x + T * W.cols);
  round_activations_e4m3(scratch.data(), T, W.cols, fp8_activation_group(W.scales.granularity, W.cols));
  return scratch.data();
}

Tensor vector_tensor(const std::vector<float>& v) {
  if (v.empty()) return {};
  return Tensor{const_cast<float*>(v.data()), ScalarType::f32, 1, static_cast<int64_t>(v.size())};
}

void same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.rows != b.rows || a.cols != b.cols) bad(op, fmt::format("shapes differ: {} vs {}", shape(a), shape(b)));
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

CpuBackend::CpuBackend(const ModelConfig& cfg, const BackendOptions& opts)
    : cfg_(cfg),
      rope_full_(cfg.rope_full, cfg.head_dim, cfg.max_position_embeddings),
      rope_sliding_(cfg.rope_sliding, cfg.head_dim, cfg.max_position_embeddings) {
  set_cpu_threads(opts.num_threads);
}

MemoryInfo CpuBackend::memory_info() const {
  MemoryInfo m;
  const long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) m.total_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  if (avail > 0 && page > 0) m.free_bytes = static_cast<uint64_t>(avail) * static_cast<uint64_t>(page);
  return m;
}

DeviceBuffer CpuBackend::alloc(size_t bytes) {
  // calloc: zero-filled, and large blocks are backed lazily by the OS.
  void* p = std::calloc(std::max<size_t>(bytes, 1), 1);
  if (!p) throw std::bad_alloc();
  return DeviceBuffer(p, bytes, [](void* q) { std::free(q); });
}

void CpuBackend::upload(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::download(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

BackendWeights CpuBackend::upload_weights(std::shared_ptr<const ModelWeights> w) {
  BackendWeights b;
  const Fp8Compute fc = w->fp8_compute;
  b.embed = matrix_tensor(w->embed, fc);
  b.output = matrix_tensor(w->output(), fc);
  b.final_norm = vector_tensor(w->final_norm);
  b.embed_scale = w->embed_scale;
  b.layers.reserve(w->layers.size());
  for (const LayerWeights& L : w->layers) {
    BackendLayerWeights o;
    bind_layer_vectors(L, o, vector_tensor);
    o.q_proj = matrix_tensor(L.q_proj, fc);
    o.k_proj = matrix_tensor(L.k_proj, fc);
    o.v_proj = matrix_tensor(L.v_proj, fc);
    o.o_proj = matrix_tensor(L.o_proj, fc);
    o.gate_proj = matrix_tensor(L.gate_proj, fc);
    o.up_proj = matrix_tensor(L.up_proj, fc);
    o.down_proj = matrix_tensor(L.down_proj, fc);
    o.in_proj_qkv = matrix_tensor(L.in_proj_qkv, fc);
    o.in_proj_z = matrix_tensor(L.in_proj_z, fc);
    o.in_proj_b = matrix_tensor(L.in_proj_b, fc);
    o.in_proj_a = matrix_tensor(L.in_proj_a, fc);
    o.out_proj = matrix_tensor(L.out_proj, fc);
    bind_linear_attention_vectors(L, o);
    b.layers.push_back(o);
  }
  b.host_owner = std::move(w);
  return b;
}

void CpuBackend::allocate_kv(const KvPlan& plan, const KvCacheLayout& layout) {
  layout_ = layout;
  map_ = kv_layer_map(plan, cfg_.num_layers);
  clips_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(cfg_.num_layers) * 3);  // zeroed
  allocate_state(plan.state);
  kv_storage_.clear();
  kv_scale_storage_.clear();
  const size_t bytes = layout.cache_bytes(), scale_bytes = layout.scale_bytes();
  for (int i = 0; i < plan.group_size * 2; ++i) {
    kv_storage_.push_back(alloc(bytes));
    if (scale_bytes > 0) kv_scale_storage_.push_back(alloc(scale_bytes));
  }
}

KvLayerStorage CpuBackend::kv_layer(int layer) const {
  if (kv_storage_.empty()) throw std::logic_error("CpuBackend::kv_layer before allocate_kv");
  return kv_slot_storage(layout_, kv_storage_, kv_scale_storage_, map_.slot.at(layer));
}

void CpuBackend::begin_step(const StepBatch& b) {
  step_ = &b;
  const int T = b.num_tokens;
  if (static_cast<int>(b.positions.size()) != T || static_cast<int>(b.token_ids.size()) != T)
    throw std::invalid_argument("CpuBackend::begin_step: ids/positions do not have num_tokens entries");
  const int hf = rope_full_.rot_dim() / 2, hs = rope_sliding_.rot_dim() / 2;
  cos_full_.resize(static_cast<size_t>(T) * hf);
  sin_full_.resize(static_cast<size_t>(T) * hf);
  rope_full_.fill(b.positions.data(), T, cos_full_.data(), sin_full_.data());
  if (cfg_.num_sliding_layers() > 0) {
    cos_sliding_.resize(static_cast<size_t>(T) * hs);
    sin_sliding_.resize(static_cast<size_t>(T) * hs);
    rope_sliding_.fill(b.positions.data(), T, cos_sliding_.data(), sin_sliding_.data());
  }
}

void CpuBackend::embedding(const Tensor& table, float scale, Tensor& out) {
  if (!step_) throw std::logic_error("CpuBackend::embedding before begin_step");
  if (out.rows != step_->num_tokens || out.cols != table.cols)
    bad("embedding", fmt::format("out {}, expected [{}][{}]", shape(out), step_->num_tokens, table.cols));
  embedding_cpu(matrix(table, "embedding"), step_->token_ids.data(), out.rows, scale, f32(out, "embedding", "out"));
}

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  if (x.cols != w.cols || y.rows != x.rows || y.cols != w.rows)
    bad("linear", fmt::format("x {}, W {}, y {}", shape(x), shape(w), shape(y)));
  if (!bias.empty() && bias.numel() != w.rows) bad("linear", fmt::format("bias {} for W {}", shape(bias), shape(w)));
  const MatrixRef W = matrix(w, "linear");
  std::vector<float> xq;
  linear_cpu(activations_for(f32(x, "linear", "x"), x.rows, W, xq), x.rows, W,
             bias.empty() ? nullptr : f32(bias, "linear", "bias"), f32(y, "linear", "y"));
}

void CpuBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  same_shape("rmsnorm", x, y);
  if (w.numel() != x.cols) bad("rmsnorm", fmt::format("w {} for x {}", shape(w), shape(x)));
  rmsnorm_cpu(f32(x, "rmsnorm", "x"), x.rows, x.cols, f32(w, "rmsnorm", "w"), eps, f32(y, "rmsnorm", "y"));
}

void CpuBackend::add_rmsnorm(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  same_shape("add_rmsnorm", h, x);
  add(h, x);
  rmsnorm(h, w, eps, y);
}

void CpuBackend::head_rmsnorm(Tensor& x, int head_dim, const Tensor& w, float eps) {
  if (head_dim <= 0 || x.cols % head_dim != 0 || w.numel() != head_dim)
    bad("head_rmsnorm", fmt::format("x {}, head_dim {}, w {}", shape(x), head_dim, shape(w)));
  float* p = f32(x, "head_rmsnorm", "x");
  rmsnorm_cpu(p, x.rows * (x.cols / head_dim), head_dim, f32(w, "head_rmsnorm", "w"), eps, p);
}

void CpuBackend::rope(int layer, Tensor& q, Tensor& k) {
  if (!step_) throw std::logic_error("CpuBackend::rope before begin_step");
  const int D = cfg_.head_dim;
  if (q.rows != step_->num_tokens || k.rows != q.rows || q.cols % D || k.cols % D)
    bad("rope", fmt::format("q {}, k {}", shape(q), shape(k)));
  const bool sliding = cfg_.is_sliding(layer);
  const RopeTable& r = sliding ? rope_sliding_ : rope_full_;
  const float* c = sliding ? cos_sliding_.data() : cos_full_.data();
  const float* s = sliding ? sin_sliding_.data() : sin_full_.data();
  rope_cpu(f32(q, "rope", "q"), q.rows, static_cast<int>(q.cols / D), D, r.rot_dim(), c, s);
  rope_cpu(f32(k, "rope", "k"), k.rows, static_cast<int>(k.cols / D), D, r.rot_dim(), c, s);
}

void CpuBackend::gated_act(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) {
  same_shape("gated_act", gate, up);
  same_shape("gated_act", gate, out);
  gated_act_cpu(act, f32(gate, "gated_act", "gate"), f32(up, "gated_act", "up"), f32(out, "gated_act", "out"),
                gate.numel());
}

void CpuBackend::add(Tensor& x, const Tensor& y) {
  same_shape("add", x, y);
  add_inplace_cpu(f32(x, "add", "x"), f32(y, "add", "y"), x.numel());
}

void CpuBackend::store_kv(const StepBatch& b, int layer, const Tensor& q, const Tensor& k, const Tensor& v) {
  const int Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim, T = b.num_tokens;
  if (q.rows != T || q.cols != static_cast<int64_t>(Hq) * D || k.rows != T ||
      k.cols != static_cast<int64_t>(Hkv) * D)
    bad("store_kv", fmt::format("q {}, k {} for {} tokens", shape(q), shape(k), T));
  same_shape("store_kv", k, v);
  const float* kp = f32(k, "store_kv", "k");
  const float* vp = f32(v, "store_kv", "v");
  if (observer_) observer_->observe(layer, f32(q, "store_kv", "q"), Hq, kp, vp, Hkv, D, T);
  const int group = map_.group.at(layer);
  const KvLayerStorage st = kv_layer(layer);
  const LayerKvScales& sc = scales_.layers.at(layer);
  KvClipCounts c;
  store_kv_cpu(layout_, st.k_cache, st.v_cache, kp, vp, b.slot_mapping.at(group).data(), T, sc.k.ref(), sc.v.ref(),
               st.k_scale, st.v_scale, &c);
  std::atomic<uint64_t>* l = &clips_[static_cast<size_t>(layer) * 3];
  if (c.k) l[0].fetch_add(c.k, std::memory_order_relaxed);
  if (c.v) l[1].fetch_add(c.v, std::memory_order_relaxed);
  l[2].fetch_add(c.stored, std::memory_order_relaxed);
}

std::optional<std::vector<KvClipCounts>> CpuBackend::kv_clip_counts() const {
  std::vector<KvClipCounts> r(static_cast<size_t>(cfg_.num_layers));
  if (!clips_) return r;  // before allocate_kv: nothing stored
  for (size_t i = 0; i < r.size(); ++i) {
    r[i].k = clips_[i * 3].load(std::memory_order_relaxed);
    r[i].v = clips_[i * 3 + 1].load(std::memory_order_relaxed);
    r[i].stored = clips_[i * 3 + 2].load(std::memory_order_relaxed);
  }
  return r;
}

void CpuBackend::attention(const StepBatch& b, int layer, const Tensor& q, Tensor& out) {
  const int Hq = cfg_.num_heads, D = cfg_.head_dim;
  same_shape("attention", q, out);
  if (q.rows != b.num_tokens || q.cols != static_cast<int64_t>(Hq) * D) bad("attention", fmt::format("q {}", shape(q)));
  const int group = map_.group.at(layer);
  const KvLayerStorage st = kv_layer(layer);
  const LayerKvScales& sc = scales_.layers.at(layer);
  PagedAttentionArgs a;
  a.layout = layout_;
  a.k_cache = st.k_cache;
  a.v_cache = st.v_cache;
  a.window = cfg_.window_for_layer(layer);
  a.softmax_scale = cfg_.attention_scale();
  a.logit_softcap = cfg_.attn_logit_softcapping ? static_cast<float>(*cfg_.attn_logit_softcapping) : 0.0f;
  a.k_scale = sc.k.ref();
  a.v_scale = sc.v.ref();
  a.k_scale_pth = st.k_scale;
  a.v_scale_pth = st.v_scale;
  const float* qp = f32(q, "attention", "q");
  float* op = f32(out, "attention", "out");
  for (int s = 0; s < b.num_seqs; ++s) {
    const int t0 = b.query_start[s], n = b.query_len(s);
    a.block_table = b.block_table(group, s);
    a.context_len = b.context_lens[s];
    paged_attention_cpu(a, qp + static_cast<size_t>(t0) * Hq * D, b.positions.data() + t0, n, Hq,
                        op + static_cast<size_t>(t0) * Hq * D);
  }
}

void CpuBackend::logits(const Tensor& hidden, std::span<const int32_t> rows, const Tensor& output, Tensor& out) {
  const int64_t n = static_cast<int64_t>(rows.size()), H = hidden.cols, V = output.rows;
  if (output.cols != H || out.rows != n || out.cols != V)
    bad("logits", fmt::format("hidden {}, output {}, out {} for {} rows", shape(hidden), shape(output), shape(out), n));
  const float* h = f32(hidden, "logits", "hidden");
  bool contiguous = true;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= hidden.rows) bad("logits", fmt::format("row {} outside hidden {}", rows[i], shape(hidden)));
    if (rows[i] != rows[0] + i) contiguous = false;
  }
  if (n == 0) return;
  const float* x = h + static_cast<size_t>(rows[0]) * H;
  if (!contiguous) {
    gather_.resize(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(gather_.data() + i * H, h + static_cast<size_t>(rows[i]) * H, sizeof(float) * H);
    x = gather_.data();
  }
  float* y = f32(out, "logits", "out");
  // Each token's row is computed alone (fixed token tile, ops.cpp), so a
  // gathered row equals the same row in place.
  const MatrixRef W = matrix(output, "logits");
  std::vector<float> xq;
  linear_cpu(activations_for(x, n, W, xq), n, W, nullptr, y);
  if (cfg_.final_logit_softcapping) {
    const float cap = static_cast<float>(*cfg_.final_logit_softcapping);
    const int64_t count = n * V;
    for (int64_t i = 0; i < count; ++i) y[i] = std::tanh(y[i] / cap) * cap;
  }
}

void CpuBackend::sample(const Tensor& logits, std::span<const RowSampling> params, std::span<int32_t> ids) {
  const int64_t n = logits.rows, V = logits.cols;
  if (static_cast<int64_t>(params.size()) != n || static_cast<int64_t>(ids.size()) != n)
    bad("sample", fmt::format("params/ids do not have one entry per logits row {}", shape(logits)));
  const float* l = f32(logits, "sample", "logits");
  std::vector<std::pair<float, int>> cand;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = l + r * V;
    const RowSampling& p = params[r];
    if (!(p.temperature > 0.0f)) {  // greedy, ties -> lowest id
      int best = 0;
      for (int64_t i = 1; i < V; ++i)
        if (row[i] > row[best]) best = static_cast<int>(i);
      ids[r] = best;
      continue;
    }
    // Softmax over the top-k (or all) logits at the temperature, then the
    // top-p nucleus; one uniform from (seed, counter).
    cand.clear();
    for (int64_t i = 0; i < V; ++i) cand.emplace_back(row[i], static_cast<int>(i));
    std::stable_sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (p.top_k > 0 && static_cast<int64_t>(cand.size()) > p.top_k) cand.resize(static_cast<size_t>(p.top_k));
    const double m = cand[0].first;
    std::vector<double> prob(cand.size());
    double sum = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) sum += prob[i] = std::exp((cand[i].first - m) / p.temperature);
    size_t keep = cand.size();
    double mass = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) {
      mass += prob[i] / sum;
      if (mass >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    double kept = 0.0;
    for (size_t i = 0; i < keep; ++i) kept += prob[i];
    const uint64_t bits = splitmix64(p.seed ^ splitmix64(p.counter));
    const double u = static_cast<double>(bits >> 11) * 0x1.0p-53 * kept;
    double acc = 0.0;
    ids[r] = cand[keep - 1].second;
    for (size_t i = 0; i < keep; ++i) {
      acc += prob[i];
      if (u < acc) {
        ids[r] = cand[i].second;
        break;
      }
    }
  }
}

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& cfg, const BackendOptions& opts) {
  return std::make_unique<CpuBackend>(cfg, opts);
}

}  // namespace fp8kv
