// CPU reference of the Qwen3.5 Gated DeltaNet layer (transformers'
// Qwen3_5GatedDeltaNet; FLA's chunk_gated_delta_rule and
// fused_recurrent_gated_delta_rule): fp32 math, one sequence at a time.
//
// Shapes: C = conv channels (q | k | v: 2*Hk*Dk + Hv*Dv), K = conv kernel,
// Hk / Hv = key / value heads (Hv a multiple of Hk: key head h serves value
// heads [h*Hv/Hk, (h+1)*Hv/Hk), transformers' repeat_interleave), Dk / Dv
// the head dims. The recurrent state of a sequence is S [Hv][Dk][Dv]; the
// conv state is the last K-1 conv inputs [C][K-1] (oldest first). The rule
// itself runs in f32 (gdn_rule_recurrent, gdn_rule_chunked); the pool may keep
// either state in bf16 (gdn_causal_conv, gdn_rule_step).
#pragma once
#include <cstdint>

namespace fp8kv {

// Element type of a state in the pool (--mamba-cache-dtype for the conv
// state, --mamba-ssm-cache-dtype for the recurrent state). The conv inputs
// are rounded to the conv state's type before the conv reads them, in prefill
// as in decode, so chunked and one-shot prefill see the same values (bf16:
// what a bf16 model's in_proj_qkv writes anyway). A bf16 recurrent state is
// widened to f32 when a step starts and rounded back (round to nearest even)
// once when it ends (gdn_rule_step).
enum class GdnStateType : uint8_t { f32, bf16 };

struct GdnShape {
  int num_k_heads = 0, num_v_heads = 0, k_head_dim = 0, v_head_dim = 0, conv_kernel = 0;
  int64_t key_dim() const { return static_cast<int64_t>(num_k_heads) * k_head_dim; }
  int64_t value_dim() const { return static_cast<int64_t>(num_v_heads) * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t conv_state_elems() const { return conv_dim() * (conv_kernel - 1); }
  int64_t ssm_state_elems() const { return static_cast<int64_t>(num_v_heads) * k_head_dim * v_head_dim; }
};

// Tokens per chunk of the chunked form (FLA's and transformers' 64). Chunks
// are aligned to absolute positions (multiples of kGdnChunk), so a prefill
// split at a multiple of 64 gives the bits of the one-shot prefill.
inline constexpr int kGdnChunk = 64;

// Depthwise causal conv1d + SiLU over T tokens of one sequence, carrying the
// conv state: x [T][C] (f32, rounded to `st` first), w [C][K], state
// [C][K-1] of type `st` (updated to the last K-1 inputs), out [T][C].
void gdn_causal_conv(const float* x, int64_t T, int64_t C, int K, const float* w, void* state, GdnStateType st,
                     float* out);

// Per-token gates: g[t][h] = -exp(A_log[h]) * softplus(a[t][h] + dt_bias[h])
// (torch's softplus, threshold 20), beta[t][h] = sigmoid(b[t][h]).
void gdn_gates(const float* a, const float* b, int64_t T, int Hv, const float* A_log, const float* dt_bias, float* g,
               float* beta);

// The gated delta rule over T tokens of one sequence starting at absolute
// position `pos0`, from conv output qkv [T][C] (q and k are l2-normalized
// here, eps 1e-6, and q scaled by 1/sqrt(Dk)), gates g, beta [T][Hv]; state
// S [Hv][Dk][Dv] f32 updated in place; out [T][Hv*Dv].
// Recurrent form (decode): per token, S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
void gdn_rule_recurrent(const GdnShape& s, const float* qkv, int64_t T, const float* g, const float* beta, float* S,
                        float* out);
// Chunked form (prefill): the same recurrence by chunks of kGdnChunk tokens
// aligned to absolute positions: the UT transform (I + L)^{-1} of the
// chunk's strictly lower beta k k^T decays, then one state read and one
// state update per chunk (transformers' torch_chunk_gated_delta_rule).
void gdn_rule_chunked(const GdnShape& s, int64_t pos0, const float* qkv, int64_t T, const float* g,
                      const float* beta, float* S, float* out);

// One step of one sequence (its T >= 1 new rows from absolute position pos0)
// on its pool state `state` [Hv][Dk][Dv] of type st, as the CPU backend runs
// it: pos0 == 0 starts from a zero state; one row runs the recurrent form,
// more the chunked form. A bf16 state is widened to f32 first, the step runs
// in f32 exactly as on an f32 state, and the result is rounded to bf16 (round
// to nearest even) once, when it is stored back: so the outputs of the step
// equal those of an f32 state holding the same values, and the stored state
// is the f32 step's rounded to bf16.
void gdn_rule_step(const GdnShape& s, int64_t pos0, const float* qkv, int64_t T, const float* g, const float* beta,
                   void* state, GdnStateType st, float* out);

// Gated RMSNorm per (token, value head) over Dv: y = w * rmsnorm(x) * silu(z)
// (Qwen3_5RMSNormGated: a plain weight, not 1 + w). x, z, y [T][Hv*Dv]; y may alias x.
void gdn_gated_rmsnorm(const float* x, const float* z, int64_t T, int Hv, int Dv, const float* w, float eps, float* y);

// Gated attention's output gate: x[i] *= sigmoid(gate[i]).
void mul_sigmoid_cpu(float* x, const float* gate, int64_t n);
// q_proj output [T][Hq][2][D] (per head: query then gate) -> q, gate [T][Hq*D].
void split_q_gate_cpu(const float* qg, int64_t T, int Hq, int D, float* q, float* gate);

}  // namespace fp8kv
