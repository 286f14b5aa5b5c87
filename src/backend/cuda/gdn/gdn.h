// CUDA kernels of the Qwen3.5 Gated DeltaNet layer (docs/cuda_backend.md
// "Gated DeltaNet"), each mirroring one CPU reference function of
// backend/cpu/gdn.h with the same formula and rounding order (IEEE mul/add/
// div, no contraction, sequential sums where the CPU sums sequentially); only
// the transcendental functions (expf, log1pf) differ by a few ulps.
//
// All kernels run over the whole step: sequence s owns rows
// [q_start[s], q_start[s+1]) of the activations, starts at absolute position
// context_lens[s] - (its rows) (position 0: zero states) and keeps its states
// in pool slot slots[s] (-1: a padding sequence of a CUDA-graph bucket; its
// rows are written as zeros and no state is touched). These arrays live in
// device memory (the step upload), so a captured graph replays with the
// slots of each step.
//
// The delta rule runs in its recurrent form for every token count (decode
// and prefill): one CTA per (sequence, value head), the head's state
// [Dk][Dv] f32 in shared memory while the CTA walks the sequence's tokens,
// read from and written back to the pool once per step. The chunked form
// (the CPU's prefill form) is the stated next step (docs/cuda_backend.md).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace fp8kv::cuda {

// constexpr members: callable in kernels (--expt-relaxed-constexpr).
struct GdnDims {
  int num_k_heads = 0, num_v_heads = 0, k_head_dim = 0, v_head_dim = 0, conv_kernel = 0;
  constexpr int64_t key_dim() const { return static_cast<int64_t>(num_k_heads) * k_head_dim; }
  constexpr int64_t value_dim() const { return static_cast<int64_t>(num_v_heads) * v_head_dim; }
  constexpr int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// The step's sequences (device arrays).
struct GdnSeqs {
  int num_seqs = 0;
  const int32_t* q_start = nullptr;       // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* slots = nullptr;         // [num_seqs], -1: padding
};

// The largest conv kernel width the conv kernel takes.
inline constexpr int kGdnMaxConvKernel = 8;

// gdn_causal_conv per sequence: x [T][C] f32, w [C][K] f32, conv_state the
// layer's pool [slots][C][K-1] (bf16 bits when state_bf16, else f32), out
// [T][C] = silu(conv). Inputs are rounded to the state type first.
void gdn_conv(const GdnDims& d, const GdnSeqs& seqs, const float* x, const float* w, void* conv_state,
              bool state_bf16, float* out, cudaStream_t stream);

// gdn_gates + the recurrent gated delta rule per sequence and value head:
// conv output qkv [T][C] (q, k l2-normalized here, q scaled by 1/sqrt(Dk)),
// a, b [T][Hv], A_log, dt_bias [Hv], ssm_state the layer's pool
// [slots][Hv][Dk][Dv] f32; out [T][Hv*Dv] (before the gated norm). Throws
// std::invalid_argument when the state of one head does not fit in shared
// memory.
void gdn_rule(const GdnDims& d, const GdnSeqs& seqs, const float* qkv, const float* a, const float* b,
              const float* A_log, const float* dt_bias, float* ssm_state, float* out, cudaStream_t stream);

// gdn_gated_rmsnorm: y = w * rmsnorm(x) * silu(z) per (token, value head)
// over Dv; x, z, y [T][Hv*Dv]; y may alias x.
void gdn_gated_rmsnorm(const float* x, const float* z, int64_t T, int Hv, int Dv, const float* w, float eps,
                       float* y, cudaStream_t stream);

// split_q_gate_cpu: qg [T][Hq][2][D] -> q, gate [T][Hq*D].
void split_q_gate(const float* qg, int64_t T, int Hq, int D, float* q, float* gate, cudaStream_t stream);
// mul_sigmoid_cpu: x[i] *= sigmoid(gate[i]).
void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);

}  // namespace fp8kv::cuda
