// CudaBackend's Qwen3.5 ops (backend/backend.h) on the kernels of
// gdn/gdn.h, and its device state pool (kv/state_plan.h): the CUDA
// counterpart of backend/cpu/cpu_backend_gdn.cpp, with the same argument
// checks.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "backend/cuda/backend_checks.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"
#include "io/errors.h"

namespace fp8kv {

using namespace cuda_checks;

namespace {
void expect_shape(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols) {
  op_checks::expect_shape("CudaBackend", op, name, t, rows, cols);
}
}  // namespace

void CudaBackend::allocate_state(const StatePlan& plan) {
  state_index_ = op_checks::state_layer_index(plan, cfg_.num_layers);
  state_ = plan;
  op_checks::allocate_state_rows(plan, conv_state_, ssm_state_, [&](size_t n) {
    DeviceBuffer b = alloc(n);
    // Zeroed for tidiness only: a sequence's first step (position 0) starts
    // from zero states inside the kernels, whatever the slot held.
    FP8KV_CU(cudaMemsetAsync(b.data(), 0, n, stream_));
    return b;
  });
  FP8KV_CU(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_state_slot(int src, int dst) {
  // Device-to-device on the step stream: ordered after the step that wrote
  // the source and before the next one that reads the destination.
  op_checks::copy_state_slot_rows(state_, conv_state_, ssm_state_, src, dst, "CudaBackend",
                                  [&](char* to, const char* from, uint64_t n) {
                                    FP8KV_CU(cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToDevice, stream_));
                                  });
}

void CudaBackend::split_q_gate(const Tensor& qg, int D, Tensor& q, Tensor& gate) {
  OpScope op(this, "split_q_gate", "split_q_gate");
  if (D <= 0 || qg.cols % (2 * D) != 0) bad("split_q_gate", fmt::format("qg {} for head_dim {}", shape(qg), D));
  const int Hq = static_cast<int>(qg.cols / (2 * D));
  expect_shape("split_q_gate", "q", q, qg.rows, static_cast<int64_t>(Hq) * D);
  expect_shape("split_q_gate", "gate", gate, qg.rows, static_cast<int64_t>(Hq) * D);
  cuda::split_q_gate(f32(qg, "split_q_gate", "qg"), qg.rows, Hq, D, f32(q, "split_q_gate", "q"),
                     f32(gate, "split_q_gate", "gate"), stream_);
}

void CudaBackend::mul_sigmoid(Tensor& x, const Tensor& gate) {
  OpScope op(this, "mul_sigmoid", "mul_sigmoid");
  expect_shape("mul_sigmoid", "gate", gate, x.rows, x.cols);
  cuda::mul_sigmoid(f32(x, "mul_sigmoid", "x"), f32(gate, "mul_sigmoid", "gate"), x.numel(), stream_);
}

void CudaBackend::mul_sigmoid_qkv_gate(const Tensor& x, const Tensor& qkv, int D, Tensor& y) {
  const char* op = "mul_sigmoid_qkv_gate";
  OpScope scope(this, op, "mul_sigmoid");
  const int64_t Q = static_cast<int64_t>(cfg_.num_heads) * D, KV = static_cast<int64_t>(cfg_.num_kv_heads) * D;
  if (D != cfg_.head_dim || !cfg_.attn_output_gate) bad(op, fmt::format("head_dim {} of a model without its gated q", D));
  expect_shape(op, "x", x, qkv.rows, Q);
  expect_shape(op, "qkv", qkv, x.rows, 2 * Q + 2 * KV);
  expect_shape(op, "y", y, x.rows, Q);
  if (y.dtype != ScalarType::f32 && y.dtype != ScalarType::bf16) bad(op, "y must be f32 or bf16");
  if (!y.data) bad(op, "y is empty");
  cuda::mul_sigmoid_heads(f32(x, op, "x"), x.rows, static_cast<int>(Q), D, f32(qkv, op, "qkv") + D, qkv.cols, 2 * D,
                          y.data, y.dtype == ScalarType::bf16, stream_);
}

void CudaBackend::gated_delta_net(const StepBatch& b, int layer, const BackendLayerWeights& w, const Tensor& qkv,
                                  const Tensor& z, const Tensor& bt, const Tensor& at, float eps, Tensor& out) {
  const char* op = "gated_delta_net";
  OpScope scope(this, op, "gated_delta_net");
  const StepView& sv = step(op);
  const int li = op_checks::gdn_state_layer("CudaBackend", state_index_, layer);
  const cuda::GdnDims d{state_.num_k_heads, state_.num_v_heads, state_.k_head_dim, state_.v_head_dim,
                        state_.conv_width + 1};
  const int64_t T = sv.T, C = d.conv_dim(), Hv = d.num_v_heads, VD = d.value_dim();
  if (b.num_tokens != sv.T || b.num_seqs != sv.S) bad(op, "the batch is not the one of begin_step");
  op_checks::check_gdn_shapes("CudaBackend", T, C, Hv, VD, d.conv_kernel, qkv, z, bt, at, out, w.conv1d);
  if (!sv.state_slots) bad(op, fmt::format("the step has no state slots for its {} sequences", sv.S));
  // Slots are checked on the host (the kernels trust them); -1 marks a
  // padding sequence of a graph bucket.
  for (int s = 0; s < b.num_seqs; ++s) {
    const int slot = b.state_slots[s];
    if (slot < -1 || slot >= state_.num_slots)
      bad(op, fmt::format("state slot {} outside the pool of {} slots", slot, state_.num_slots));
  }
  const float* A_log = opt_vec(w.A_log, Hv, op, "A_log");
  const float* dt_bias = opt_vec(w.dt_bias, Hv, op, "dt_bias");
  const float* norm = opt_vec(w.gdn_norm, d.v_head_dim, op, "norm");
  if (!A_log || !dt_bias || !norm) bad(op, "A_log, dt_bias or norm is empty");
  // The host hints decide the delta rule's launches (gdn.h): a decode step
  // (every sequence one row: what CUDA graphs capture) runs the recurrent
  // kernel alone; otherwise the chunked kernel takes the sequences of two or
  // more rows after the decodes (begin_step checked that those have one row
  // each).
  const int max_rows = std::max(sv.num_decodes > 0 ? 1 : 0, sv.max_prefill_query);
  const cuda::GdnSeqs seqs{sv.S, sv.q_start, sv.context_lens, sv.state_slots, max_rows, sv.num_decodes, T};
  grow(gdn_conv_out_, static_cast<size_t>(std::max<int64_t>(T * C, 1)) * 4);
  // The chunked form's scratch (a step with a sequence of two or more rows;
  // a decode step, what graphs capture, neither needs nor touches it).
  if (max_rows >= 2) grow(gdn_rule_scratch_, cuda::gdn_rule_scratch_bytes(d, T));
  float* conv = gdn_conv_out_.as<float>();
  cuda::gdn_conv(d, seqs, f32(qkv, op, "qkv"), f32(w.conv1d, op, "conv1d"), conv_state_[li].data(),
                 state_.conv_dtype == StateDtype::bf16, conv, stream_);
  // out f32: the rule writes it and the norm runs in place; out bf16
  // (out_proj's input with fused projections): the rule writes f32 scratch
  // and the norm rounds its result once into out.
  const bool out_bf16 = out.dtype == ScalarType::bf16;
  if (!out_bf16 && out.dtype != ScalarType::f32) bad(op, "out must be f32 or bf16");
  if (!out.data) bad(op, "out is empty");
  float* o = nullptr;
  if (out_bf16) {
    grow(gdn_core_out_, static_cast<size_t>(std::max<int64_t>(T * VD, 1)) * 4);
    o = gdn_core_out_.as<float>();
  } else {
    o = f32(out, op, "out");
  }
  cuda::gdn_rule(d, seqs, conv, f32(at, op, "a"), f32(bt, op, "b"), A_log, dt_bias, ssm_state_[li].data(),
                 state_.ssm_dtype == StateDtype::bf16, o, gdn_rule_scratch_.get(), gdn_rule_scratch_.bytes(),
                 stream_);
  cuda::gdn_gated_rmsnorm(o, f32(z, op, "z"), T, static_cast<int>(Hv), d.v_head_dim, norm, eps, out.data, out_bf16,
                          stream_);
}

}  // namespace fp8kv
