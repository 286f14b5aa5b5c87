// CUDA kernels of the Qwen3.5 Gated DeltaNet layer (docs/cuda_backend.md
// "Gated DeltaNet"), each mirroring one CPU reference function of
// backend/cpu/gdn.h. The conv, the gated norm and the recurrent delta rule
// run the CPU's formula and rounding order (IEEE mul/add/div, no
// contraction, sequential sums where the CPU sums sequentially); only the
// transcendental functions (expf, log1pf) differ by a few ulps. The chunked
// delta rule runs the CPU's chunked algorithm with fused multiply-adds.
//
// All kernels run over the whole step: sequence s owns rows
// [q_start[s], q_start[s+1]) of the activations, starts at absolute position
// context_lens[s] - (its rows) (position 0: zero states) and keeps its states
// in pool slot slots[s] (-1: a padding sequence of a CUDA-graph bucket; its
// rows are written as zeros and no state is touched). These arrays live in
// device memory (the step upload), so a captured graph replays with the
// slots of each step.
//
// The delta rule's two forms, as the CPU backend picks them
// (cpu_backend_gdn.cpp): a sequence with one new row this step runs the
// recurrent form, one with two or more the chunked form.
//  - Recurrent (gdn_rule_kernel): one CTA per (value head, sequence), the
//    head's state [Dk][Dv] f32 in shared memory while the CTA walks the
//    sequence's rows one by one, read from and written back to the pool once
//    per step.
//  - Both rule kernels (recurrent, chunked) read the pool's state when a sequence's step starts and
//    write it when it ends, f32 or bf16 (--mamba-ssm-cache-dtype): a bf16
//    state is widened to f32 on the read and rounded to nearest even on the
//    write, so it is rounded once per step, as the CPU's gdn_rule_step.
//  - Chunked (the CPU's gdn_rule_chunked): chunks of kGdnCudaChunk = 64
//    rows ending at multiples of 64 in absolute positions (the first may be
//    shorter), the UT transform by forward substitution of (I + L), one pass
//    over the state per chunk (v_new = U - W S, the outputs exp(cum) (Q S) +
//    (masked decayed Q K^T) v_new, S = exp(last) S + sum_i exp(last - cum_i)
//    k_i v_new_i^T). The state-independent part in f32 on CUDA cores, the
//    state pass's products on TF32 tensor cores with f32 accumulators and
//    an f32 state (outputs within ~1e-3 relative of the CPU's f32 rule, as
//    FLA's bf16 kernels are of theirs; the tests' bound is statistical).
//    Two kernels: what does not depend
//    on the state (the gates, the l2 norms, L, A = the masked decayed Q K^T,
//    and W, U after the substitution) for every chunk of the step at once
//    (gdn_chunk_prep_kernel: one CTA per (64-row block of the step's rows,
//    value head), taking the chunks that start in its block) into a scratch
//    buffer (gdn_rule_scratch_bytes); then the walk through the state
//    (gdn_rule_chunked_kernel: one CTA per (value head, Dv slice, sequence),
//    S's slice in registers, per chunk v_new, the outputs and the state
//    update). gdn_chunk_plan splits Dv among `split` CTAs (the columns of
//    the state evolve independently given the prep's W, U and A) to fill
//    the SMs when sequences x Hv is small. Every column's arithmetic is the
//    same whatever the split, so the results are bitwise independent of it,
//    and a prefill split at a multiple of 64 gives the bits of the one-shot
//    one.
//  - Host rule (gdn_rule): a step with no sequence of two or more rows
//    (GdnSeqs::max_query_len <= 1: every decode step, the ones CUDA graphs
//    capture) launches the recurrent kernel only, so decode pays nothing for
//    the chunked form. Otherwise the recurrent kernel and the chunked
//    form's two are launched and each form skips, at run time, the
//    sequences the other owns (the lengths are read from device memory);
//    only such a step uses the scratch. Shapes the chunked kernels do not
//    take (Dk not a multiple of 16 or above 128, or no split of Dv into
//    multiples of 8 up to 64 whose buffers fit the shared memory of one
//    block; Dv = 128 takes split 2 and up) run every row in the recurrent
//    form.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fp8kv::cuda {

// constexpr members: callable in kernels (--expt-relaxed-constexpr).
struct GdnDims {
  int num_k_heads = 0, num_v_heads = 0, k_head_dim = 0, v_head_dim = 0, conv_kernel = 0;
  constexpr int64_t key_dim() const { return static_cast<int64_t>(num_k_heads) * k_head_dim; }
  constexpr int64_t value_dim() const { return static_cast<int64_t>(num_v_heads) * v_head_dim; }
  constexpr int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// The step's sequences (device arrays), and two host-side hints from the
// StepBatch for gdn_rule's launch decisions.
struct GdnSeqs {
  int num_seqs = 0;
  const int32_t* q_start = nullptr;       // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* slots = nullptr;         // [num_seqs], -1: padding
  // The most rows of one sequence this step (StepBatch::max_query_len), or
  // -1: unknown. <= 1 (a decode step): gdn_rule launches the recurrent
  // kernel alone, for every row (what a captured decode graph holds).
  int max_query_len = -1;
  // Sequences [0, num_decodes) have one row each (StepBatch::num_decodes):
  // the chunked kernel's grid starts after them, and the plan counts only
  // the rest. 0 when unknown.
  int num_decodes = 0;
  // The step's rows, q_start[num_seqs] (StepBatch::num_tokens), or -1:
  // unknown. Required (and must be exact) when the chunked form runs: it
  // sizes the prep kernel's grid and the scratch's layout.
  int64_t num_tokens = -1;
};

// Rows per chunk of the chunked delta rule: the CPU's kGdnChunk
// (backend/cpu/gdn.h; tests/cuda_ops/test_gdn_cuda.cpp checks they agree).
inline constexpr int kGdnCudaChunk = 64;

// The chunked kernels' launch plan: split = sequential CTAs sharing one
// value head's Dv columns (each takes Dv / split of them), smem = its
// dynamic shared memory in bytes, ctas_per_sm = how many of its CTAs one SM
// holds (1: its registers); prep_ld_t = the row stride of the prep kernel's
// transposed [Dk][64] buffers (72: padded so that its tensor-core fragment
// loads are free of bank conflicts, where it fits; else 64), prep_smem its
// shared memory (neither depends on the split). split 0: the chunked
// kernels do not take the shape.
struct GdnChunkPlan {
  int split = 0;
  size_t smem = 0;
  int ctas_per_sm = 0;
  int prep_ld_t = 0;
  size_t prep_smem = 0;
  bool ok() const { return split > 0; }
};

// The plan for dims d at a given split (0: not valid, i.e. Dk or Dv / split
// not a multiple of 4, or over max_smem bytes of shared memory).
GdnChunkPlan gdn_chunk_plan_at(const GdnDims& d, int split, size_t max_smem);
// The automatic plan for `multi_seqs` sequences of two or more rows on a
// device with num_sms SMs and max_smem bytes of opt-in shared memory per
// block (a pure function of the shapes): among the splits 1, 2, 4, 8 that
// leave at least 32 columns per CTA (split 1 always counts) and fit, the
// least estimated time of the sequential kernel. An SM gets m = ceil(CTAs /
// SMs) CTAs and runs them r = ctas_per_sm (1) at a time; one CTA's time
// per chunk is its multiply-adds (per column of its slice W S, Q S,
// A v_new and the state update, at the tensor cores' rate, plus one unit
// per loaded element of q, W, k and A) plus a fixed per-chunk latency in
// the same units (gdn.cu chunk_cost). So the estimate is ceil(m / r) x
// (1 + (min(r, m) - 1) / 2) x cost; ties go to the smaller split. For
// Qwen3.5-27B's heads (Hv 48, Dk = Dv = 128) on an H100 (132 SMs, 227 KB):
// split 2 (195 KB) for one to four prefills; split 4 at TP 2 (24 heads).
GdnChunkPlan gdn_chunk_plan(const GdnDims& d, int multi_seqs, int num_sms, size_t max_smem);

// The largest conv kernel width the conv kernel takes.
inline constexpr int kGdnMaxConvKernel = 8;

// gdn_causal_conv per sequence: x [T][C] f32, w [C][K] f32, conv_state the
// layer's pool [slots][C][K-1] (bf16 bits when state_bf16, else f32), out
// [T][C] = silu(conv). Inputs are rounded to the state type first.
void gdn_conv(const GdnDims& d, const GdnSeqs& seqs, const float* x, const float* w, void* conv_state,
              bool state_bf16, float* out, cudaStream_t stream);

// Overrides of gdn_rule's choices, for tests and benchmarks.
struct GdnRuleOptions {
  bool recurrent_only = false;  // every row in the recurrent form
  int chunk_split = 0;          // > 0: the chunked kernel at this split (else gdn_chunk_plan's)
};

// gdn_gates + the gated delta rule per sequence and value head (the
// recurrent form for sequences of one row, the chunked form for longer
// ones: the header comment): conv output qkv [T][C] (q, k l2-normalized
// here, q scaled by 1/sqrt(Dk)), a, b [T][Hv], A_log, dt_bias [Hv],
// ssm_state the layer's pool [slots][Hv][Dk][Dv] (bf16 bits when
// state_bf16, else f32; the rule runs in f32 either way); out [T][Hv*Dv]
// (before the gated norm). scratch: scratch_bytes of device memory, at
// least gdn_rule_scratch_bytes(d, seqs.num_tokens) when the chunked form
// runs (a step with a sequence of two or more rows after the decodes, a
// shape it takes); a decode step (max_query_len <= 1) does not touch it
// (nullptr is fine). Throws std::invalid_argument when the state of one
// head does not fit in shared memory (the recurrent kernel's need), when
// opt.chunk_split is not a valid split for the shape (gdn_chunk_plan_at),
// or when the chunked form runs without num_tokens or enough scratch.
void gdn_rule(const GdnDims& d, const GdnSeqs& seqs, const float* qkv, const float* a, const float* b,
              const float* A_log, const float* dt_bias, void* ssm_state, bool state_bf16, float* out, void* scratch,
              size_t scratch_bytes, cudaStream_t stream, const GdnRuleOptions& opt = {});

// The chunked form's scratch for T rows: per value head and row, the prep
// kernel's W [Dk], U [Dv] (after the substitution), a row of A^T's pairs
// [64], KD's pairs [Dk] and 2 row vectors (exp(cum), exp(last)); per key
// head and row q's pairs [Dk / 2]; 32-bit words, as six 256-byte aligned
// pieces: 4 T (Hv (2 Dk + Dv + 66) + Hk Dk / 2) bytes plus the alignment
// (Qwen3.5-27B, Hv 48, Hk 16, Dk = Dv = 128: 90.5 KB per row).
size_t gdn_rule_scratch_bytes(const GdnDims& d, int64_t T);

// gdn_gated_rmsnorm: y = w * rmsnorm(x) * silu(z) per (token, value head)
// over Dv; x, z, y [T][Hv*Dv]; y f32 (may alias x) or, y_bf16, bf16 rounded
// once from the f32 result (out_proj's input).
void gdn_gated_rmsnorm(const float* x, const float* z, int64_t T, int Hv, int Dv, const float* w, float eps,
                       void* y, bool y_bf16, cudaStream_t stream);

// split_q_gate_cpu: qg [T][Hq][2][D] -> q, gate [T][Hq*D].
void split_q_gate(const float* qg, int64_t T, int Hq, int D, float* q, float* gate, cudaStream_t stream);
// mul_sigmoid_cpu: x[i] *= sigmoid(gate[i]).
void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);
// The same per head: y [rows][cols] = x * sigmoid(gate), column c = h D + i
// taking gate[r * gate_row_stride + h * gate_head_stride + i] (the gated q
// projection's gates inside the fused q|k|v rows: gate = qkv + D, row stride
// 2 Hq D + 2 Hkv D, head stride 2 D); y f32 (may be x) or bf16 (y_bf16,
// rounded to nearest).
void mul_sigmoid_heads(const float* x, int64_t rows, int cols, int D, const float* gate, int64_t gate_row_stride,
                       int64_t gate_head_stride, void* y, bool y_bf16, cudaStream_t stream);

}  // namespace fp8kv::cuda
