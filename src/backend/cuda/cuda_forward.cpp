// CudaBackend's forward ops: embedding, the linears (GEMV routes /
// cuBLASLt), norms, RoPE, the QKV split (with the fused KV store), the gated
// activations, the KV store and the paged attention (decode and prefill rows
// of one step).
#include <algorithm>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "backend/cuda/attention/attention.h"
#include "backend/cuda/backend_checks.h"
#include "backend/cuda/cuda_backend.h"

namespace fp8kv {

using namespace cuda_checks;

// ---- ops -------------------------------------------------------------------------

const uint16_t* CudaBackend::to_bf16_input(const Tensor& x, const char* op) {
  if (x.dtype == ScalarType::bf16) return static_cast<const uint16_t*>(x.data);
  const float* xp = f32(x, op, "x");
  grow(x_bf16_, static_cast<size_t>(x.numel()) * 2);
  cuda::to_bf16_rows(xp, nullptr, x.rows, x.cols, x_bf16_.as<uint16_t>(), stream_);
  return x_bf16_.as<const uint16_t>();
}

void CudaBackend::embedding(const Tensor& table, float scale, Tensor& out) {
  OpScope op(this, "embedding", "embedding");
  const StepView& s = step("embedding");
  if (out.rows != s.T || out.cols != table.cols)
    bad("embedding", fmt::format("out {}, expected [{}][{}]", shape(out), s.T, table.cols));
  cuda::embedding(matrix(table, "embedding"), s.ids, s.T, scale, f32(out, "embedding", "out"), stream_);
}

namespace {
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace

bool CudaBackend::linear_takes_w8a8(const Tensor& x, const cuda::DeviceMatrix& W, const Tensor& y) const {
  return gemm_->takes_w8a8(x.rows, W) && (x.dtype == ScalarType::f32 || x.dtype == ScalarType::bf16) &&
         aligned16(x.data) && (y.dtype != ScalarType::f32 || aligned16(y.data));
}

void CudaBackend::linear_w8a8_into(const Tensor* x, const cuda::DeviceMatrix& W, const float* bp, Tensor& y) {
  if (y.dtype != ScalarType::f32 && y.dtype != ScalarType::bf16)
    bad("linear", fmt::format("y must be f32 or bf16, got {}", shape(y)));
  float* yf = static_cast<float*>(y.data);
  if (y.dtype == ScalarType::bf16) {
    grow(y_f32_, static_cast<size_t>(y.numel()) * 4);
    yf = y_f32_.as<float>();
  }
  if (x)
    gemm_->linear_w8a8(cuda::Gemm::W8a8Input{x->data, x->dtype == ScalarType::f32, nullptr}, y.rows, W, bp, yf, false,
                       false, w8a8_act_.get(), w8a8_act_.bytes(), stream_);
  else
    gemm_->linear_w8a8_codes(y.rows, W, bp, yf, false, false, w8a8_act_.get(), w8a8_act_.bytes(), stream_);
  if (y.dtype == ScalarType::bf16)
    cuda::to_bf16_rows(yf, nullptr, y.rows, y.cols, static_cast<uint16_t*>(y.data), stream_);
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) {
  if (x.cols != w.cols || y.rows != x.rows || y.cols != w.rows)
    bad("linear", fmt::format("x {}, W {}, y {}", shape(x), shape(w), shape(y)));
  const cuda::DeviceMatrix W = matrix(w, "linear");
  // W8A8 rows (ops.h Gemm::linear_w8a8): the codes come from x as it is
  // (bf16 from the producing op in the fused forward pass); no copy.
  const bool w8a8 = linear_takes_w8a8(x, W, y);
  OpScope op(this, "linear", w.rows, w.cols, gemm_key(prof_.get(), w, w8a8 ? " w8a8" : ""), gemm_flops(x.rows, w));
  const float* bp = opt_vec(bias, w.rows, "linear", "bias");
  if (w8a8) {
    const bool codes = take_norm_codes(x, W);  // the norm in front wrote them (add_rmsnorm_for)
    if (!codes) {
      writes_codes("linear");
      grow(w8a8_act_, cuda::Gemm::w8a8_scratch_bytes(x.rows, W.fp8_row_bytes(), W.block128()));
    }
    linear_w8a8_into(codes ? nullptr : &x, W, bp, y);
    return;
  }
  reads_input(x, "linear");
  const uint16_t* xb = to_bf16_input(x, "linear");
  if (y.dtype == ScalarType::f32) {
    gemm_->linear(xb, x.rows, W, bp, static_cast<float*>(y.data), false, stream_);
  } else if (y.dtype == ScalarType::bf16) {
    grow(y_f32_, static_cast<size_t>(y.numel()) * 4);
    gemm_->linear(xb, x.rows, W, bp, y_f32_.as<float>(), false, stream_);
    cuda::to_bf16_rows(y_f32_.as<float>(), nullptr, y.rows, y.cols, static_cast<uint16_t*>(y.data), stream_);
  } else {
    bad("linear", fmt::format("y must be f32 or bf16, got {}", shape(y)));
  }
}

void CudaBackend::rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  OpScope op(this, "rmsnorm", "rmsnorm");
  reads_input(x, "rmsnorm");
  norm_codes_ = {};
  same_shape("rmsnorm", x, y);
  if (y.dtype != ScalarType::f32 && y.dtype != ScalarType::bf16) bad("rmsnorm", "y must be f32 or bf16");
  const float* wp = opt_vec(w, x.cols, "rmsnorm", "w");
  if (!wp) bad("rmsnorm", "w is empty");
  // Without a delta the kernel only reads h.
  cuda::rmsnorm_residual(f32(x, "rmsnorm", "x"), nullptr, nullptr, wp, eps, x.rows, static_cast<int>(x.cols), y.data,
                         y.dtype == ScalarType::bf16, stream_);
}

void CudaBackend::add_rmsnorm(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  OpScope op(this, "add_rmsnorm", "add+rmsnorm");
  reads_input(x, "add_rmsnorm");
  norm_codes_ = {};
  same_shape("add_rmsnorm", h, x);
  same_shape("add_rmsnorm", h, y);
  if (y.dtype != ScalarType::f32 && y.dtype != ScalarType::bf16) bad("add_rmsnorm", "y must be f32 or bf16");
  const float* wp = opt_vec(w, h.cols, "add_rmsnorm", "w");
  if (!wp) bad("add_rmsnorm", "w is empty");
  cuda::rmsnorm_residual(f32(h, "add_rmsnorm", "h"), f32(x, "add_rmsnorm", "x"), nullptr, wp, eps, h.rows,
                         static_cast<int>(h.cols), y.data, y.dtype == ScalarType::bf16, stream_);
}

void CudaBackend::add_rmsnorm_for(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y,
                                  std::span<const Tensor> next_ws) {
  const int64_t T = h.rows;
  bool codes = !next_ws.empty() && next_ws.size() <= norm_codes_.w.size() && T > gemm_->gemv_max_rows() &&
               T % cuda::Gemm::kW8a8Rows == 0 && (y.dtype == ScalarType::bf16 || y.dtype == ScalarType::f32) &&
               h.cols % 16 == 0 && h.cols <= 8192 && h.dtype == ScalarType::f32 && x.dtype == ScalarType::f32 &&
               x.rows == T && x.cols == h.cols && y.rows == T && y.cols == h.cols && !w.empty();
  // Every reader's W8A8 branch: linear_takes_w8a8 (the gate|up GEMM's
  // gate_up_takes_w8a8 adds conditions on its other operands, checked when
  // it takes the codes) on e4m3 rows of n bytes, all with one code layout.
  std::array<cuda::DeviceMatrix, 4> Ws{};
  for (size_t i = 0; codes && i < next_ws.size(); ++i) {
    codes = next_ws[i].is_fp8_weight() && next_ws[i].cols == h.cols;
    if (!codes) break;
    Ws[i] = matrix(next_ws[i], "add_rmsnorm_for");
    codes = linear_takes_w8a8(y, Ws[i], Tensor{}) && !Ws[i].fp8_padded() &&
            (!Ws[i].block128() || h.cols % 128 == 0) && Ws[i].block128() == Ws[0].block128();
  }
  const cuda::DeviceMatrix& W = Ws[0];
  if (!codes) {
    add_rmsnorm(h, x, w, eps, y);
    return;
  }
  OpScope op(this, "add_rmsnorm", "add+rmsnorm+quant");
  reads_input(x, "add_rmsnorm_for");
  norm_codes_ = {};  // this norm's codes replace any earlier ones
  const float* wp = opt_vec(w, h.cols, "add_rmsnorm_for", "w");
  // Sized for the widest GEMM input of T rows: no op grows (reallocates) it
  // while the codes wait (linear_gated_act_linear sizes it for its down GEMM
  // before the gate|up GEMM takes them).
  int64_t kmax = std::max<int64_t>({cfg_.hidden_size, cfg_.intermediate_size,
                                    static_cast<int64_t>(cfg_.num_heads) * cfg_.head_dim});
  if (cfg_.gdn) kmax = std::max<int64_t>(kmax, cfg_.gdn->value_dim());
  grow(w8a8_act_, cuda::Gemm::w8a8_scratch_bytes(T, (kmax + 15) / 16 * 16, true));
  const cuda::Gemm::W8a8Codes c = gemm_->w8a8_codes(T, W, false, w8a8_act_.get());
  cuda::rmsnorm_residual_e4m3(f32(h, "add_rmsnorm_for", "h"), f32(x, "add_rmsnorm_for", "x"), wp, eps, T,
                              static_cast<int>(h.cols), y.dtype == ScalarType::bf16, c.group, c.codes, c.scales,
                              stream_);
  norm_codes_ = NormCodes{y.data, {}, static_cast<int>(next_ws.size()), T};
  for (size_t i = 0; i < next_ws.size(); ++i) norm_codes_.w[i] = Ws[i].fp8;
}

bool CudaBackend::take_norm_codes(const Tensor& x, const cuda::DeviceMatrix& W) {
  NormCodes& r = norm_codes_;
  if (!r.x || r.x != x.data) return false;
  const auto it = std::find(r.w.begin(), r.w.begin() + r.n, static_cast<const void*>(W.fp8));
  if (it == r.w.begin() + r.n || r.T != x.rows)
    throw std::logic_error(fmt::format("CudaBackend: the norm wrote W8A8 codes of its output ({} rows) for other "
                                       "GEMMs than the one reading it ({} rows of W [{}][{}])",
                                       r.T, x.rows, W.rows, W.cols));
  *it = r.w[--r.n];  // W leaves the list
  if (r.n == 0) r = {};
  return true;
}

void CudaBackend::writes_codes(const char* op) const {
  if (norm_codes_.x)
    throw std::logic_error(std::string("CudaBackend::") + op + ": would overwrite the W8A8 codes the norm wrote for " +
                           std::to_string(norm_codes_.n) + " GEMM(s) not yet run (add_rmsnorm_for)");
}

void CudaBackend::reads_input(const Tensor& x, const char* op) const {
  if (norm_codes_.x && norm_codes_.x == x.data)
    throw std::logic_error(std::string("CudaBackend::") + op +
                           ": its input holds only the W8A8 codes the norm wrote for a GEMM (add_rmsnorm_for)");
}

void CudaBackend::head_rmsnorm(Tensor& x, int head_dim, const Tensor& w, float eps) {
  if (head_dim <= 0 || x.cols % head_dim != 0) bad("head_rmsnorm", fmt::format("x {} with head_dim {}", shape(x), head_dim));
  const float* wp = opt_vec(w, head_dim, "head_rmsnorm", "w");
  if (!wp) bad("head_rmsnorm", "w is empty");
  float* xp = f32(x, "head_rmsnorm", "x");
  cuda::QkvPrepArgs a;
  a.T = static_cast<int>(x.rows);
  a.num_q_heads = static_cast<int>(x.cols / head_dim);
  a.head_dim = head_dim;
  a.q_in = xp;
  a.q_stride = x.cols;
  a.q_norm_w = wp;
  a.eps = eps;
  a.q_out = xp;  // in place: each warp reads its head before writing it
  cuda::qkv_prep(a, stream_);
}

void CudaBackend::rope(int layer, Tensor& q, Tensor& k) {
  const StepView& s = step("rope");
  const int D = cfg_.head_dim;
  if (q.rows != s.T || k.rows != s.T || q.cols != static_cast<int64_t>(cfg_.num_heads) * D ||
      k.cols != static_cast<int64_t>(cfg_.num_kv_heads) * D)
    bad("rope", fmt::format("q {}, k {} for {} tokens", shape(q), shape(k), s.T));
  const bool sliding = cfg_.is_sliding(layer);
  const RopeTable& rt = sliding ? rope_sliding_ : rope_full_;
  cuda::QkvPrepArgs a;
  a.T = s.T;
  a.num_q_heads = cfg_.num_heads;
  a.num_kv_heads = cfg_.num_kv_heads;
  a.head_dim = D;
  a.q_in = a.q_out = f32(q, "rope", "q");
  a.k_in = a.k_out = f32(k, "rope", "k");
  a.q_stride = q.cols;
  a.k_stride = k.cols;
  a.positions = s.positions;
  a.inv_freq = (sliding ? inv_freq_sliding_ : inv_freq_full_).as<float>();
  a.rot_dim = rt.rot_dim();
  a.attention_factor = rt.attention_factor();
  cuda::qkv_prep(a, stream_);
}

void CudaBackend::gated_act(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) {
  same_shape("gated_act", gate, up);
  same_shape("gated_act", gate, out);
  if (out.dtype != ScalarType::f32 && out.dtype != ScalarType::bf16) bad("gated_act", "out must be f32 or bf16");
  cuda::gated_act(act, f32(gate, "gated_act", "gate"), f32(up, "gated_act", "up"), gate.cols, gate.rows, gate.cols,
                  out.data, out.dtype == ScalarType::bf16, stream_);
}

void CudaBackend::qkv_split(int layer, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                            Tensor& q, Tensor& k, Tensor& v) {
  qkv_split_impl(layer, qkv, q_norm, k_norm, eps, q, k, v, nullptr);
}

void CudaBackend::qkv_split_store(const StepBatch& b, int layer, const Tensor& qkv, const Tensor& q_norm,
                                  const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v) {
  OpScope op(this, "qkv_split_store");
  // The separate store kernel where the fused one cannot serve: the observer
  // gets host copies of q/k/v at store_kv; per-token-head dtypes store
  // through store_kv too (a row's scale needs its amax first; the fused
  // store writes element by element).
  if (observer_ || kv_dtype_per_token_head(layout_.dtype)) {
    Backend::qkv_split_store(b, layer, qkv, q_norm, k_norm, eps, q, k, v);
    return;
  }
  const cuda::QkvPrepArgs::FusedStore fs = fused_store_target(b, layer, "qkv_split_store");
  qkv_split_impl(layer, qkv, q_norm, k_norm, eps, q, k, v, &fs);
}

cuda::QkvPrepArgs::FusedStore CudaBackend::fused_store_target(const StepBatch& b, int layer, const char* op) const {
  const StepView& s = step(op);
  if (b.num_tokens != s.T) bad(op, fmt::format("batch of {} tokens, step of {}", b.num_tokens, s.T));
  if (kv_storage_.empty()) throw std::logic_error(fmt::format("CudaBackend::{} before allocate_kv", op));
  if (scales_.size() != static_cast<size_t>(cfg_.num_layers))
    throw std::logic_error(fmt::format("CudaBackend::{} before set_kv_scales", op));
  const KvLayerStorage st = kv_layer(layer);
  const LayerScales& sc = scales_[layer];
  cuda::QkvPrepArgs::FusedStore fs;
  fs.k_cache = st.k_cache;
  fs.v_cache = st.v_cache;
  fs.dtype = layout_.dtype;
  fs.slots = s.slots.at(layer_group_.at(layer));
  fs.capacity = static_cast<int64_t>(layout_.num_blocks) * layout_.block_size;
  fs.k_scale = sc.k.as<float>();
  fs.v_scale = sc.v.as<float>();
  fs.k_scale_count = sc.k_count;
  fs.v_scale_count = sc.v_count;
  fs.clips = layer_clips(layer);
  return fs;
}

void CudaBackend::qkv_split_impl(int layer, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                                 Tensor& q, Tensor& k, Tensor& v, const cuda::QkvPrepArgs::FusedStore* store) {
  const cuda::QkvPrepArgs a = qkv_split_args(layer, qkv, q_norm, k_norm, eps, q, k, v, store);
  OpScope ps(this, nullptr, store ? "qkv prep+store" : "qkv prep");
  cuda::qkv_prep(a, stream_);
}

cuda::QkvPrepArgs CudaBackend::qkv_split_args(int layer, const Tensor& qkv, const Tensor& q_norm,
                                              const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v,
                                              const cuda::QkvPrepArgs::FusedStore* store) const {
  const StepView& s = step("qkv_split");
  const int D = cfg_.head_dim;
  const int64_t Q = static_cast<int64_t>(cfg_.num_heads) * D, KV = static_cast<int64_t>(cfg_.num_kv_heads) * D;
  // A gated q projection (attn_output_gate, Qwen3.5): each q head's D query
  // values, then its D gate values (left in qkv for attn_output_gate).
  const int64_t QG = cfg_.attn_output_gate ? 2 * Q : Q;
  if (qkv.rows != s.T || qkv.cols != QG + 2 * KV || q.rows != s.T || k.rows != s.T || v.rows != s.T || q.cols != Q ||
      k.cols != KV || v.cols != KV)
    bad("qkv_split", fmt::format("qkv {}, q {}, k {}, v {} for {} tokens", shape(qkv), shape(q), shape(k), shape(v), s.T));
  const bool sliding = cfg_.is_sliding(layer);
  const RopeTable& rt = sliding ? rope_sliding_ : rope_full_;
  const float* in = f32(qkv, "qkv_split", "qkv");
  cuda::QkvPrepArgs a;
  a.T = s.T;
  a.num_q_heads = cfg_.num_heads;
  a.num_kv_heads = cfg_.num_kv_heads;
  a.head_dim = D;
  a.q_in = in;
  a.k_in = in + QG;
  a.v_in = in + QG + KV;
  a.q_stride = a.k_stride = a.v_stride = QG + 2 * KV;
  a.q_head_stride = QG / cfg_.num_heads;
  a.q_norm_w = opt_vec(q_norm, D, "qkv_split", "q_norm");
  a.k_norm_w = opt_vec(k_norm, D, "qkv_split", "k_norm");
  a.eps = eps;
  a.positions = s.positions;
  a.inv_freq = (sliding ? inv_freq_sliding_ : inv_freq_full_).as<float>();
  a.rot_dim = rt.rot_dim();
  a.attention_factor = rt.attention_factor();
  a.q_out = f32(q, "qkv_split", "q");
  a.k_out = f32(k, "qkv_split", "k");
  a.v_out = f32(v, "qkv_split", "v");
  if (store) a.store = *store;
  return a;
}

void CudaBackend::gated_act_fused(Activation act, const Tensor& gate_up, Tensor& out) {
  if (gate_up.cols % 2 != 0 || out.rows != gate_up.rows || out.cols * 2 != gate_up.cols)
    bad("gated_act_fused", fmt::format("gate_up {}, out {}", shape(gate_up), shape(out)));
  if (out.dtype != ScalarType::f32 && out.dtype != ScalarType::bf16) bad("gated_act_fused", "out must be f32 or bf16");
  const float* g = f32(gate_up, "gated_act_fused", "gate_up");
  if (!out.data && out.numel() > 0) bad("gated_act_fused", "out is empty");
  OpScope ps(this, nullptr, "act (f32 in)");
  cuda::gated_act(act, g, g + out.cols, gate_up.cols, out.rows, out.cols, out.data, out.dtype == ScalarType::bf16,
                  stream_);
}

// At 1-2 rows on the SIMT GEMV route (and act=fused in the routes), one
// kernel computes the gate|up GEMV and the activation (ops.h
// gemv_gated_act_bf16: bitwise the two-kernel result); gate_up is not
// written. Otherwise the GEMM, then the activation kernel.
void CudaBackend::linear_gated_act(Activation act, const Tensor& x, const Tensor& w, const Tensor& bias,
                                   Tensor& gate_up, Tensor& out) {
  OpScope op(this, "linear_gated_act");
  const int64_t T = x.rows;
  // Codes the norm wrote for this GEMM (add_rmsnorm_for): taken by the W8A8
  // branch (gate_up_w8a8) or by linear (Backend::linear_gated_act); the
  // GEMV rows (never written as codes) and linear_bf16_out read x.
  if (T <= gemm_->gemv_max_rows()) reads_input(x, "linear_gated_act");
  // fp8 weights at 1-2 rows: the fp8 GEMV with the activation fused
  // (ops.h gemv_fp8_gated_act: bitwise the two-kernel result).
  if (w.is_fp8_weight() && out.dtype == ScalarType::bf16 &&
      x.dtype == ScalarType::bf16 && x.cols == w.cols && out.rows == T && out.cols * 2 == w.rows && out.data &&
      T <= gemm_->gemv_max_rows()) {
    const cuda::DeviceMatrix Wg = matrix(w, "linear_gated_act");
    const auto* xb = static_cast<const uint16_t*>(x.data);
    if (cuda::gemv_fp8_gated_act_fits(xb, T, Wg)) {
      cuda::gemv_fp8_gated_act(act, xb, T, Wg, opt_vec(bias, w.rows, "linear_gated_act", "bias"),
                               static_cast<uint16_t*>(out.data), stream_);
      return;
    }
  }
  // Other fp8 weights: the fp8 GEMV, then the activation kernel.
  bool fuse = !w.is_fp8_weight() && out.dtype == ScalarType::bf16 &&
              x.dtype == ScalarType::bf16 &&
              T >= 1 && T <= std::min<int64_t>(cuda::kGemvGatedActMaxRows, gemm_->gemv_max_rows()) &&
              x.cols == w.cols && w.rows % 2 == 0 && out.rows == T && out.cols * 2 == w.rows;
  if (fuse) {
    fuse = gemm_->route(T, w.rows, w.cols) == cuda::GemvKernel::simt_or_mma && T < cuda::kGemvMmaMinRows;
  }
  // W8A8 rows: the FP8 GEMM writes gate|up in bf16 and the activation reads
  // bf16, as past the GEMV rows below (the bf16-weight path's rounding of
  // gate and up before the activation, which transformers' bf16 W8A8 run has
  // too: docs/design.md "FP8-weight checkpoints"); out stays the dtype the
  // next GEMM reads.
  if (!fuse && gate_up_takes_w8a8(x, w, bias, gate_up, out)) {
    auto* gu = static_cast<uint16_t*>(gate_up.data);  // [T][2I] bf16 in the f32 buffer's first half
    gate_up_w8a8(x, w, matrix(w, "linear_gated_act"), gu);
    OpScope ps(this, nullptr, "act (bf16 in)");
    cuda::gated_act_bf16_in(act, gu, gu + out.cols, w.rows, T, out.cols, out.data, out.dtype == ScalarType::bf16,
                            stream_);
    return;
  }
  const cuda::DeviceMatrix W = fuse ? matrix(w, "linear_gated_act") : cuda::DeviceMatrix{};
  const uint16_t* xb = fuse ? static_cast<const uint16_t*>(x.data) : nullptr;
  if (!fuse || !cuda::gemv_bf16_fits(xb, T, W) || !out.data) {
    // Past the GEMV rows, the gate|up GEMM writes bf16 (half the bytes of
    // the widest GEMM output, written and read back once per layer) and the
    // activation reads bf16; gate and up are rounded to bf16 before the
    // activation, as in a bf16 transformers model. The residual stream and
    // q/k/v stay fp32. Only without a bias (Llama / Qwen / Gemma MLPs).
    // TTFT 8K 1.020x against the fp32 gate|up; accuracy: docs/cuda_backend.md
    // "Prefill/TTFT".
    if (bias.empty() && x.dtype == ScalarType::bf16 && T > gemm_->gemv_max_rows() && w.rows % 2 == 0 &&
        !matrix(w, "linear_gated_act").fp8_padded() &&
        out.rows == T && out.cols * 2 == w.rows && gate_up.data && gate_up.numel() == T * w.rows &&
        (out.dtype == ScalarType::bf16 || out.dtype == ScalarType::f32) && out.data) {
      reads_input(x, "linear_gated_act");
      auto* gu = static_cast<uint16_t*>(gate_up.data);  // [T][2I] bf16 in the f32 buffer's first half
      {
        OpScope ps(this, nullptr, gemm_key(prof_.get(), w, " bf16 out"), gemm_flops(T, w));
        gemm_->linear_bf16_out(static_cast<const uint16_t*>(x.data), T, matrix(w, "linear_gated_act"), gu, stream_);
      }
      OpScope ps(this, nullptr, "act (bf16 in)");
      cuda::gated_act_bf16_in(act, gu, gu + out.cols, w.rows, T, out.cols, out.data, out.dtype == ScalarType::bf16,
                              stream_);
      return;
    }
    Backend::linear_gated_act(act, x, w, bias, gate_up, out);
    return;
  }
  cuda::gemv_gated_act_bf16(act, xb, T, W, opt_vec(bias, w.rows, "linear_gated_act", "bias"),
                            static_cast<uint16_t*>(out.data), stream_);
}

bool CudaBackend::gate_up_takes_w8a8(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& gate_up,
                                     const Tensor& out) const {
  const int64_t T = x.rows;
  return w.is_fp8_weight() && bias.empty() && (x.dtype == ScalarType::f32 || x.dtype == ScalarType::bf16) &&
         aligned16(x.data) && x.cols == w.cols && w.rows % 16 == 0 && out.rows == T && out.cols * 2 == w.rows &&
         gate_up.data && gate_up.numel() == T * w.rows && out.data &&
         (out.dtype == ScalarType::bf16 || out.dtype == ScalarType::f32) &&
         gemm_->takes_w8a8(T, matrix(w, "linear_gated_act"));
}

void CudaBackend::gate_up_w8a8(const Tensor& x, const Tensor& w, const cuda::DeviceMatrix& Wg, uint16_t* gu) {
  const int64_t T = x.rows;
  const bool codes = take_norm_codes(x, Wg);  // the norm in front wrote them (add_rmsnorm_for)
  if (!codes) {
    writes_codes("linear_gated_act");
    grow(w8a8_act_, cuda::Gemm::w8a8_scratch_bytes(T, Wg.fp8_row_bytes(), Wg.block128()));
  }
  OpScope ps(this, nullptr, gemm_key(prof_.get(), w, codes ? " w8a8 bf16 out, codes in" : " w8a8 bf16 out"),
             gemm_flops(T, w));
  if (codes)
    gemm_->linear_w8a8_codes(T, Wg, nullptr, gu, false, true, w8a8_act_.get(), w8a8_act_.bytes(), stream_);
  else
    gemm_->linear_w8a8(cuda::Gemm::W8a8Input{x.data, x.dtype == ScalarType::f32, nullptr}, T, Wg, nullptr, gu, false,
                       true, w8a8_act_.get(), w8a8_act_.bytes(), stream_);
}

// The fused MLP on W8A8 rows: the gate|up GEMM of linear_gated_act's W8A8
// branch, then one kernel computes the activation and quantizes it into the
// down GEMM's codes and scales, where Gemm::linear_w8a8 would put them
// (ops.h gated_act_quantize_e4m3: bitwise gated_act_bf16_in into out's
// dtype + quantize_rows_e4m3), and the down GEMM runs on those codes
// (Gemm::linear_w8a8_codes): linear's W8A8 GEMM without out written and
// read back (2 bytes each way per element in bf16: ~0.47 GB per layer at
// 8K x 14336). The same conditions as the two ops' W8A8 branches (and
// past the fused-GEMV rows), else linear_gated_act then linear. Per-token
// and 1x128-group down weights alike (the kernel takes both groupings).
void CudaBackend::linear_gated_act_linear(Activation act, const Tensor& x, const Tensor& w, const Tensor& bias,
                                          Tensor& gate_up, Tensor& out, const Tensor& w_down,
                                          const Tensor& down_bias, Tensor& y) {
  const int64_t T = x.rows;
  bool fused = T > gemm_->gemv_max_rows() && w_down.is_fp8_weight() && out.cols == w_down.cols && y.rows == T &&
               y.cols == w_down.rows && (y.dtype == ScalarType::f32 || y.dtype == ScalarType::bf16) &&
               gate_up_takes_w8a8(x, w, bias, gate_up, out);
  const cuda::DeviceMatrix Wd = fused ? matrix(w_down, "linear") : cuda::DeviceMatrix{};
  fused = fused && linear_takes_w8a8(out, Wd, y) && reinterpret_cast<uintptr_t>(gate_up.data) % 16 == 0;
  if (!fused) {
    Backend::linear_gated_act_linear(act, x, w, bias, gate_up, out, w_down, down_bias, y);
    return;
  }
  const cuda::DeviceMatrix Wg = matrix(w, "linear_gated_act");
  // Both GEMMs' codes live in w8a8_act_ (stream order: the gate|up GEMM has
  // read its codes before the activation kernel writes the down GEMM's):
  // sized once for both, so no reallocation between them.
  grow(w8a8_act_, std::max(cuda::Gemm::w8a8_scratch_bytes(T, Wg.fp8_row_bytes(), Wg.block128()),
                           cuda::Gemm::w8a8_scratch_bytes(T, Wd.fp8_row_bytes(), Wd.block128())));
  {
    OpScope op(this, "linear_gated_act");
    auto* gu = static_cast<uint16_t*>(gate_up.data);  // [T][2I] bf16 in the f32 buffer's first half
    gate_up_w8a8(x, w, Wg, gu);
    OpScope ps(this, nullptr, "act+quant (bf16 in)");
    // linear_w8a8_into below runs the f32-out GEMM: out_bf16 false.
    const cuda::Gemm::W8a8Codes c = gemm_->w8a8_codes(T, Wd, false, w8a8_act_.get());
    cuda::gated_act_quantize_e4m3(act, gu, gu + out.cols, w.rows, out.dtype == ScalarType::bf16, c.T, c.T_pad, c.K,
                                  c.Kc, c.group, c.codes, c.scales, stream_);
  }
  OpScope op(this, "linear", w_down.rows, w_down.cols, gemm_key(prof_.get(), w_down, " w8a8 codes in"),
             gemm_flops(T, w_down));
  linear_w8a8_into(nullptr, Wd, opt_vec(down_bias, w_down.rows, "linear", "bias"), y);
}

void CudaBackend::add(Tensor& x, const Tensor& y) {
  same_shape("add", x, y);
  cuda::add_inplace(f32(x, "add", "x"), f32(y, "add", "y"), x.numel(), stream_);
}

void CudaBackend::store_kv(const StepBatch& b, int layer, const Tensor& q, const Tensor& k, const Tensor& v) {
  OpScope op(this, "store_kv");
  const StepView& s = step("store_kv");
  const int T = b.num_tokens, Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  if (T != s.T || q.rows != T || k.rows != T || v.rows != T || q.cols != static_cast<int64_t>(Hq) * D ||
      k.cols != static_cast<int64_t>(Hkv) * D || v.cols != k.cols)
    bad("store_kv", fmt::format("q {}, k {}, v {} for {} tokens", shape(q), shape(k), shape(v), T));
  if (kv_storage_.empty()) throw std::logic_error("CudaBackend::store_kv before allocate_kv");
  if (scales_.size() != static_cast<size_t>(cfg_.num_layers)) throw std::logic_error("CudaBackend::store_kv before set_kv_scales");
  const float* qp = f32(q, "store_kv", "q");
  const float* kp = f32(k, "store_kv", "k");
  const float* vp = f32(v, "store_kv", "v");
  if (observer_) {  // host copies at the store point (calibration is offline: the copy is fine)
    obs_q_.resize(static_cast<size_t>(q.numel()));
    obs_k_.resize(static_cast<size_t>(k.numel()));
    obs_v_.resize(static_cast<size_t>(v.numel()));
    download(obs_q_.data(), qp, q.bytes());
    download(obs_k_.data(), kp, k.bytes());
    download(obs_v_.data(), vp, v.bytes());
    observer_->observe(layer, obs_q_.data(), Hq, obs_k_.data(), obs_v_.data(), Hkv, D, T);
  }
  const int group = layer_group_.at(layer);
  const KvLayerStorage st = kv_layer(layer);
  const LayerScales& sc = scales_[layer];
  OpScope ps(this, nullptr, "store_kv");
  cuda::StoreKvArgs a;
  a.layout = layout_;
  a.k_cache = st.k_cache;
  a.v_cache = st.v_cache;
  a.k = kp;
  a.v = vp;
  a.input_dtype = cuda::ActDtype::f32;
  a.slot_mapping = s.slots.at(group);
  a.num_tokens = T;
  a.k_scale = {sc.k.as<float>(), sc.k_count};
  a.v_scale = {sc.v.as<float>(), sc.v_count};
  a.k_scale_pth = st.k_scale;
  a.v_scale_pth = st.v_scale;
  a.clips = layer_clips(layer);
  cuda::store_kv(a, stream_);
}


void CudaBackend::attention(const StepBatch& b, int layer, const Tensor& q, Tensor& out) {
  OpScope scope(this, "attention");
  const StepView& s = step("attention");
  const int Hq = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_dim;
  same_shape("attention", q, out);
  if (q.rows != b.num_tokens || q.rows != s.T || q.cols != static_cast<int64_t>(Hq) * D)
    bad("attention", fmt::format("q {} for {} tokens", shape(q), s.T));
  const int group = layer_group_.at(layer);
  const KvLayerStorage st = kv_layer(layer);
  const LayerScales& sc = scales_.at(layer);
  const float* qp = f32(q, "attention", "q");
  // out: f32, or bf16 when it only feeds the o_proj GEMM (fused forward).
  if (out.dtype != ScalarType::f32 && out.dtype != ScalarType::bf16) bad("attention", "out must be f32 or bf16");
  if (!out.data && out.numel() > 0) bad("attention", "out is empty");
  auto* op = static_cast<uint8_t*>(out.data);
  const cuda::ActDtype odt = out.dtype == ScalarType::bf16 ? cuda::ActDtype::bf16 : cuda::ActDtype::f32;
  const int64_t oeb = out.dtype == ScalarType::bf16 ? 2 : 4;
  const int window = cfg_.window_for_layer(layer);
  const float softcap = cfg_.attn_logit_softcapping ? static_cast<float>(*cfg_.attn_logit_softcapping) : 0.0f;

  cuda::PagedKv kv;
  kv.layout = layout_;
  kv.k_cache = st.k_cache;
  kv.v_cache = st.v_cache;
  kv.max_blocks_per_seq = std::max(1, s.B);
  kv.k_scale = {sc.k.as<float>(), sc.k_count};
  kv.v_scale = {sc.v.as<float>(), sc.v_count};
  kv.k_scale_pth = st.k_scale;
  kv.v_scale_pth = st.v_scale;

  // Decodes: sequences [0, nd), query rows [0, nd).
  if (s.num_decodes > 0) {
    cuda::DecodeArgs a;
    a.kv = kv;
    a.kv.block_tables = s.block_tables.at(group);
    a.kv.context_lens = s.context_lens;
    a.batch = s.num_decodes;
    a.num_heads = Hq;
    a.max_context_len = s.decode_plan_context;
    a.window = window;
    a.softmax_scale = cfg_.attention_scale();
    a.logit_softcap = softcap;
    a.q = qp;
    a.q_dtype = cuda::ActDtype::f32;
    a.out = op;
    a.out_dtype = odt;
    a.plan = cuda::plan_decode(s.num_decodes, Hq, Hkv, D, s.decode_plan_context, window, cuda::device_sm_count(),
                               /*split_tokens=*/0, /*ctas_per_sm=*/0, layout_.dtype);
    grow(decode_ws_, std::max<size_t>(a.plan.workspace_bytes, 16));
    a.workspace = decode_ws_.get();
    OpScope ps(this, nullptr, "attention (decode rows)");
    cuda::paged_decode(a, stream_);
  }
  // Prefill chunks: sequences [nd, S), query rows from query_start[nd].
  const int P = s.S - s.num_decodes;
  if (P > 0) {
    cuda::PrefillArgs a;
    a.kv = kv;
    a.kv.block_tables = s.block_tables.at(group) + static_cast<int64_t>(s.num_decodes) * s.B;
    a.kv.context_lens = s.context_lens + s.num_decodes;
    a.batch = P;
    a.num_heads = Hq;
    a.max_query_len = s.max_prefill_query;
    a.window = window;
    a.softmax_scale = cfg_.attention_scale();
    a.logit_softcap = softcap;
    a.q_start = s.prefill_q_start;
    a.q = qp + static_cast<int64_t>(s.prefill_row0) * Hq * D;
    a.q_dtype = cuda::ActDtype::f32;
    a.out = op + static_cast<int64_t>(s.prefill_row0) * Hq * D * oeb;
    a.out_dtype = odt;
    OpScope ps(this, nullptr, "attention (prefill)");
    cuda::paged_prefill(a, stream_);
  }
}


}  // namespace fp8kv
