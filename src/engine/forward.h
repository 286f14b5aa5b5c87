// The forward pass: one implementation for every family, built from shared
// builders (norm, attention, MLP) with a small per-family layer recipe
// (family_llama.cpp: pre-norm llama/mistral/qwen2/qwen3; family_gemma3.cpp:
// sandwich norms; family_qwen3_5.cpp: Gated DeltaNet + gated attention). It calls the Backend interface only (backend/backend.h),
// so the same graph runs on the CPU reference and on the GPU.
//
// A step runs several sequences at once (a StepBatch): their new tokens are
// concatenated ([T] ids) for the GEMMs; attention covers every sequence of
// the step in one backend call. K/V (and Q, for an observer) are written at
// one place: Backend::store_kv.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/config.h"

namespace fp8kv {

// Scratch of one step, allocated once by the backend for max_tokens rows
// (T <= max_tokens; views of the first T rows are used). H = hidden_size,
// Hq = num_heads, Hkv = num_kv_heads, D = head_dim, I = intermediate_size,
// V = vocab_size, act = Backend::activation_dtype().
// With fused projections (Backend::fuses_projections, the CUDA backend):
// fused_mlp: gate holds gate|up [T][2I], up holds act(gate) * up as bf16
// [T][I] (the down GEMM's input, scratch of
// Backend::linear_gated_act_linear: a backend that hands the down GEMM the
// activation in its own form leaves it unwritten), and x (only ever GEMM
// inputs) is bf16; fused_qkv (which implies fused_mlp): qkv
// [T][(Hq+2Hkv)*D] the fused QKV output, and attn is bf16 too (with
// attn_output_gate: qkv [T][(2Hq+2Hkv)*D], attn act, attn_gate the bf16
// gated output).
struct RunState {
  RunState(Backend& be, const ModelConfig& cfg, int max_tokens, int max_logits_rows, bool fused_mlp = false,
           bool fused_qkv = false);
  int max_tokens = 0;
  int max_logits_rows = 0;
  DeviceBuffer h;       // [T][H] f32: the residual stream; after run(), the final-normed hidden states
  DeviceBuffer x;       // [T][H] act: normed input of attention / MLP
  DeviceBuffer tmp;     // [T][H] act: attention or MLP output before the residual add
  DeviceBuffer q;       // [T][Hq*D] act
  DeviceBuffer k;       // [T][Hkv*D] act
  DeviceBuffer v;       // [T][Hkv*D] act
  DeviceBuffer attn;    // [T][Hq*D] act: attention output before o_proj
  DeviceBuffer gate;    // [T][I] act: gate projection, then act(gate) * up
  DeviceBuffer up;      // [T][I] act (fused: bf16)
  DeviceBuffer qkv;     // [T][(Hq+2Hkv)*D] act, fused only ([T][(2Hq+2Hkv)*D] with attn_output_gate)
  // qwen3_5 only (C = conv channels, VD = Hv*Dv, GatedDeltaNetConfig):
  DeviceBuffer lin_qkv;    // [T][C] act: in_proj_qkv's output
  DeviceBuffer lin_z;      // [T][VD] act: in_proj_z's output (the norm's gate)
  DeviceBuffer lin_b, lin_a;  // [T][Hv] act
  DeviceBuffer lin_out;    // [T][VD] act (fused_mlp: bf16): the token mixer's output (out_proj's input)
  DeviceBuffer q_gate;     // [T][2*Hq*D] act: q_proj's output with the output gate (not fused)
  DeviceBuffer attn_gate;  // [T][Hq*D] act: the output gate (fused: bf16, the gated attention output)
  DeviceBuffer logits;  // [max_logits_rows][V] f32
};

class ForwardPass {
 public:
  ForwardPass(const ModelConfig& cfg, Backend& backend, const BackendWeights& weights);
  // True when the backend fuses projections and uploaded fused weights:
  // gate|up of every layer (fused_mlp), and q|k|v too (fused: every
  // attention layer has qkv_proj; a Qwen3.5 linear_attention layer has
  // none, and its gated q_proj leaves the output gates in qkv).
  bool fused() const { return fused_; }
  bool fused_mlp() const { return fused_mlp_; }

  // Runs every layer over the step's tokens (begin_step already called),
  // storing their K/V in the cache; leaves the final-normed hidden states
  // [T][H] in hidden(rs, T).
  void run(const StepBatch& batch, RunState& rs);
  static Tensor hidden(const RunState& rs, const ModelConfig& cfg, int T);

  const ModelConfig& config() const { return cfg_; }

  // The non-finite diagnosis (the engine re-runs a step whose logits were
  // NaN/inf with every weight finite): while on, run() downloads the
  // residual stream after the embedding, after each layer and after the
  // final norm, and records the first stage that holds a NaN or inf. Off on
  // every ordinary step (it costs a download per layer).
  static constexpr int kStageEmbedding = -1;  // then 0..num_layers-1: layer l; num_layers: the final norm
  void set_check_stages(bool on) {
    check_stages_ = on;
    first_nonfinite_stage_ = kNoStage;
  }
  // The first stage whose output held a NaN or inf in the last checked run;
  // kNoStage when every stage was finite (the logits overflowed in lm_head).
  static constexpr int kNoStage = -2;
  int first_nonfinite_stage() const { return first_nonfinite_stage_; }
  bool checking_stages() const { return check_stages_; }

 private:
  // check_stages_: records `stage` when t (or t2) holds a NaN or inf and no earlier stage did.
  void check_stage(int stage, const Tensor& t, const Tensor& t2 = {});
  struct Step;  // per-run views of the RunState
  void llama_layer(int layer, Step& st);
  void gemma3_layer(int layer, Step& st);
  void qwen3_5_layer(int layer, Step& st);
  // qwen3_5 token mixers: x (normed) -> the input of the residual projection
  // (out_proj / o_proj), returned.
  const Tensor& gated_delta_net(int layer, Step& st);
  const Tensor& gated_attention(int layer, Step& st);
  // The first norm of a layer: h (layer 0) or h += tmp (the previous layer's
  // MLP output), then x = norm(h).
  void residual_norm(int layer, const Tensor& w, Step& st);
  // x [T][H] (already normed) -> attention output [T][H] (after o_proj) in tmp.
  void attention(int layer, Step& st);
  // attention without o_proj: x -> attn [T][Hq*D].
  void attention_core(int layer, Step& st);
  // x [T][H] (already normed) -> MLP output [T][H] in tmp (summed over the
  // tensor-parallel ranks).
  void mlp(int layer, Step& st);
  // mlp before the all_reduce: Backend::linear_gated_act_linear with fused
  // gate|up, else mlp_core then linear.
  void mlp_down(int layer, Step& st);
  // mlp, then h += tmp; y = norm(h) (norm_w): the residual projection's
  // op (Backend::linear_add_rmsnorm, or its ops around the fused MLP).
  // next_ws: the weights of the GEMMs that read y next (Backend::add_rmsnorm_for;
  // empty: none, or another reader).
  void mlp_add_rmsnorm(int layer, const Tensor& norm_w, Tensor& y, Step& st, std::span<const Tensor> next_ws);
  // The unfused MLP without down_proj: x -> act(gate) * up in gate, returned.
  const Tensor& mlp_core(int layer, Step& st);

  ModelConfig cfg_;
  Backend& be_;
  const BackendWeights& w_;
  Activation act_;
  float eps_;
  bool fused_ = false;
  bool fused_mlp_ = false;
  bool check_stages_ = false;
  int first_nonfinite_stage_ = kNoStage;
};

struct ForwardPass::Step {
  const StepBatch* batch = nullptr;
  int T = 0;
  Tensor h, x, tmp, q, k, v, attn, gate, up;
  Tensor qkv, gate_up, act_bf16;  // fused projections only (act_bf16: the down GEMM's bf16 input)
  Tensor lin_qkv, lin_z, lin_b, lin_a, lin_out, q_gate, attn_gate;  // qwen3_5 only
};

// The gated activation of a config's hidden_act; InputError when unsupported.
Activation activation_for(const std::string& hidden_act);

}  // namespace fp8kv
