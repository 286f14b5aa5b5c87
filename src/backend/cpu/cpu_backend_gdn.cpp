// CpuBackend's Qwen3.5 ops (backend/backend.h) on the reference kernels of
// gdn.h, and its state pool (kv/state_plan.h).
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_backend_gdn.h"
#include "backend/cpu/gdn.h"
#include "backend/cpu/op_checks.h"

namespace fp8kv {

namespace {

using cpu_op::bad;
using cpu_op::f32;
using cpu_op::shape;

void expect_shape(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols) {
  op_checks::expect_shape("CpuBackend", op, name, t, rows, cols);
}

GdnStateType gdn_state_type(StateDtype d) { return d == StateDtype::bf16 ? GdnStateType::bf16 : GdnStateType::f32; }

Tensor view(const std::vector<float>& v, int64_t rows) {
  if (v.empty()) return {};
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor{const_cast<float*>(v.data()), ScalarType::f32, rows, n / rows};
}

}  // namespace

void bind_linear_attention_vectors(const LayerWeights& L, BackendLayerWeights& o) {
  o.A_log = view(L.A_log, 1);
  o.dt_bias = view(L.dt_bias, 1);
  o.gdn_norm = view(L.gdn_norm, 1);
  if (!L.conv1d.empty()) o.conv1d = view(L.conv1d, L.in_proj_qkv.rows);  // [C][K]
}

void CpuBackend::allocate_state(const StatePlan& plan) {
  state_index_ = op_checks::state_layer_index(plan, cfg_.num_layers);
  state_ = plan;
  op_checks::allocate_state_rows(plan, conv_state_, ssm_state_, [&](size_t n) { return alloc(n); });  // zero-filled
}

void CpuBackend::copy_state_slot(int src, int dst) {
  op_checks::copy_state_slot_rows(state_, conv_state_, ssm_state_, src, dst, "CpuBackend",
                                  [](char* to, const char* from, uint64_t n) { std::memcpy(to, from, n); });
}

void CpuBackend::split_q_gate(const Tensor& qg, int D, Tensor& q, Tensor& gate) {
  if (D <= 0 || qg.cols % (2 * D) != 0) bad("split_q_gate", fmt::format("qg {} for head_dim {}", shape(qg), D));
  const int Hq = static_cast<int>(qg.cols / (2 * D));
  expect_shape("split_q_gate", "q", q, qg.rows, static_cast<int64_t>(Hq) * D);
  expect_shape("split_q_gate", "gate", gate, qg.rows, static_cast<int64_t>(Hq) * D);
  split_q_gate_cpu(f32(qg, "split_q_gate", "qg"), qg.rows, Hq, D, f32(q, "split_q_gate", "q"),
                   f32(gate, "split_q_gate", "gate"));
}

void CpuBackend::mul_sigmoid(Tensor& x, const Tensor& gate) {
  expect_shape("mul_sigmoid", "gate", gate, x.rows, x.cols);
  mul_sigmoid_cpu(f32(x, "mul_sigmoid", "x"), f32(gate, "mul_sigmoid", "gate"), x.numel());
}

void CpuBackend::gated_delta_net(const StepBatch& b, int layer, const BackendLayerWeights& w, const Tensor& qkv,
                                 const Tensor& z, const Tensor& bt, const Tensor& at, float eps, Tensor& out) {
  const char* op = "gated_delta_net";
  const int li = op_checks::gdn_state_layer("CpuBackend", state_index_, layer);
  const GdnShape s{state_.num_k_heads, state_.num_v_heads, state_.k_head_dim, state_.v_head_dim, state_.conv_width + 1};
  const int64_t T = b.num_tokens, C = s.conv_dim(), Hv = s.num_v_heads, VD = s.value_dim();
  op_checks::check_gdn_shapes("CpuBackend", T, C, Hv, VD, s.conv_kernel, qkv, z, bt, at, out, w.conv1d);
  if (static_cast<int>(b.state_slots.size()) != b.num_seqs)
    bad(op, fmt::format("the step has {} state slots for {} sequences", b.state_slots.size(), b.num_seqs));
  const GdnStateType ct = gdn_state_type(state_.conv_dtype), st = gdn_state_type(state_.ssm_dtype);
  const uint64_t conv_bytes = state_.conv_bytes_per_layer(), ssm_bytes = state_.ssm_bytes_per_layer();
  std::vector<float> conv(static_cast<size_t>(T * C)), g(static_cast<size_t>(T * Hv)), beta(g.size()),
      core(static_cast<size_t>(T * VD));
  gdn_gates(f32(at, op, "a"), f32(bt, op, "b"), T, static_cast<int>(Hv), f32(w.A_log, op, "A_log"),
            f32(w.dt_bias, op, "dt_bias"), g.data(), beta.data());
  const float* x = f32(qkv, op, "qkv");
  for (int q = 0; q < b.num_seqs; ++q) {
    const int64_t t0 = b.query_start[q], n = b.query_len(q), pos0 = b.context_lens[q] - n;
    if (n <= 0) continue;
    const int slot = b.state_slots[q];
    if (slot < -1 || slot >= state_.num_slots)
      bad(op, fmt::format("state slot {} outside the pool of {} slots", slot, state_.num_slots));
    if (slot == -1) continue;  // a padding sequence (ModelRunner::pad_batch): zero rows, no state
    void* cs = static_cast<char*>(conv_state_[li].data()) + slot * conv_bytes;
    void* S = static_cast<char*>(ssm_state_[li].data()) + slot * ssm_bytes;
    // A new sequence (or a recompute after preemption) starts from zero
    // states: the conv state here, the recurrent one in gdn_rule_step.
    if (pos0 == 0) std::memset(cs, 0, conv_bytes);
    float* cv = conv.data() + t0 * C;
    gdn_causal_conv(x + t0 * C, n, C, s.conv_kernel, f32(w.conv1d, op, "conv1d"), cs, ct, cv);
    gdn_rule_step(s, pos0, cv, n, g.data() + t0 * Hv, beta.data() + t0 * Hv, S, st, core.data() + t0 * VD);
  }
  gdn_gated_rmsnorm(core.data(), f32(z, op, "z"), T, static_cast<int>(Hv), s.v_head_dim, f32(w.gdn_norm, op, "norm"),
                    eps, f32(out, op, "out"));
}

}  // namespace fp8kv
