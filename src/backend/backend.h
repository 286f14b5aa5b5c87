// The Backend interface: every op the forward pass (engine/forward.cpp,
// family_*.cpp) runs goes through it, so one graph drives the CPU reference
// (backend/cpu/cpu_backend) and the GPU (backend/cuda/cuda_backend).
// docs/engine.md describes the split (Scheduler / ModelRunner / Backend).
//
// The interface changes additively only: an op a backend may fuse has a
// default body (e.g. qkv_split_store = qkv_split then store_kv,
// linear_add_rmsnorm = linear, all_reduce, add_rmsnorm), so a backend
// overrides only what it runs faster with the same bits.
//
// Memory model
//   The backend owns all memory the ops touch: weights (upload_weights), KV
//   storage (allocate_kv), scratch (alloc). A Tensor is a non-owning 2-D view
//   [rows][cols] (row-major, contiguous) into such memory: host memory on the
//   CPU backend, device memory on CUDA. The host never dereferences a Tensor's
//   data except through download() (or on the CPU backend, where it is host
//   memory anyway).
//
// Dtypes
//   Weights matrices: f32 or bf16 on CPU (as loaded); CUDA may convert at
//   upload (bf16). Norm weights and biases: f32 [1][n]. The residual stream
//   (the `h` the runner allocates) is always f32. Other activations (x, q, k,
//   v, attention output, gate, up) use activation_dtype(): f32 on CPU, bf16 or
//   f32 on CUDA. Every op must accept its inputs in these dtypes and write its
//   output in the dtype of the output Tensor it is given.
//
// Steps
//   The ModelRunner calls begin_step(batch) once per step; ops that need the
//   step's ids, positions, slot mappings or block tables (embedding, rope,
//   store_kv, attention) use that upload. store_kv/attention also receive the
//   host StepBatch for host-side shape decisions (max_query_len, ...); a
//   backend must not assume it lives past the step.
//
// Errors: bad shapes/dtypes -> std::invalid_argument naming the op and the
// expected vs actual shape; device failures -> std::runtime_error with the
// call and file:line. Ops may run asynchronously (one stream); download() and
// synchronize() wait.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend_choice.h"
#include "backend/comm.h"
#include "backend/kv_clips.h"
#include "backend/step_batch.h"
#include "backend/store_observer.h"
#include "backend/tensor.h"
#include "kv/kv_scales.h"
#include "kv/layout.h"
#include "kv/planner.h"
#include "model/config.h"

namespace fp8kv {

class ModelWeights;  // model/weights.h

// ---- weights as the backend holds them -----------------------------------
// Shapes: H = hidden_size, Hq = num_heads, Hkv = num_kv_heads, D = head_dim,
// I = intermediate_size, V = vocab_size. Absent optional tensors are empty
// Tensors (data == nullptr). Matrices are [out][in] (y = x W^T).
struct BackendLayerWeights {
  Tensor input_norm;           // [1][H] f32
  Tensor q_proj;               // [Hq*D][H]
  Tensor k_proj;               // [Hkv*D][H]
  Tensor v_proj;               // [Hkv*D][H]
  Tensor o_proj;               // [H][Hq*D]
  Tensor q_bias, k_bias, v_bias;  // [1][Hq*D], [1][Hkv*D], [1][Hkv*D] f32 or empty
  Tensor o_bias;               // [1][H] f32 or empty
  Tensor q_norm, k_norm;       // [1][D] f32 or empty (qwen3, gemma3)
  Tensor post_attention_norm;  // [1][H]: llama pre-MLP norm; gemma3 post-attention norm
  Tensor pre_ffn_norm;         // [1][H] gemma3 only
  Tensor post_ffn_norm;        // [1][H] gemma3 only
  Tensor gate_proj, up_proj;   // [I][H]
  Tensor down_proj;            // [H][I]
  Tensor gate_bias, up_bias;   // [1][I] f32 or empty
  Tensor down_bias;            // [1][H] f32 or empty
  // Fused projections, set by a backend whose fuses_projections() is true
  // (CUDA); empty otherwise. The rows of q|k|v (gate|up) concatenated in one
  // allocation; q_proj/k_proj/v_proj (gate_proj/up_proj) are then views of
  // its row ranges. One GEMM each instead of three (two).
  Tensor qkv_proj;             // [(Hq+2Hkv)*D][H]
  Tensor qkv_bias;             // [1][(Hq+2Hkv)*D] f32 or empty
  Tensor gate_up_proj;         // [2I][H]
  Tensor gate_up_bias;         // [1][2I] f32 or empty
  // qwen3_5 (model/weights.h LayerWeights has the shapes): with
  // attn_output_gate q_proj is [2*Hq*D][H]; a linear_attention (Gated
  // DeltaNet) layer has these instead of the attention tensors.
  Tensor in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;  // [C][H], [Hv*Dv][H], [Hv][H], [Hv][H]
  Tensor out_proj;             // [H][Hv*Dv]
  Tensor conv1d;               // [C][K] f32
  Tensor A_log, dt_bias;       // [1][Hv] f32
  Tensor gdn_norm;             // [1][Dv] f32
};

// A layer's f32 vectors, norms and biases (the Gated DeltaNet ones aside),
// bound through vec(const std::vector<float>&) -> Tensor: the list both
// backends bind, in this order (Layer: model/weights.h LayerWeights).
template <class Layer, class Vec>
void bind_layer_vectors(const Layer& L, BackendLayerWeights& o, Vec&& vec) {
  const std::pair<Tensor*, const std::vector<float>*> vectors[] = {
      {&o.input_norm, &L.input_norm},       {&o.q_bias, &L.q_bias},
      {&o.k_bias, &L.k_bias},               {&o.v_bias, &L.v_bias},
      {&o.o_bias, &L.o_bias},               {&o.q_norm, &L.q_norm},
      {&o.k_norm, &L.k_norm},               {&o.post_attention_norm, &L.post_attention_norm},
      {&o.pre_ffn_norm, &L.pre_ffn_norm},   {&o.post_ffn_norm, &L.post_ffn_norm},
      {&o.gate_bias, &L.gate_bias},         {&o.up_bias, &L.up_bias},
      {&o.down_bias, &L.down_bias}};
  for (auto [t, v] : vectors) *t = vec(*v);
}

struct BackendWeights {
  Tensor embed;       // [V][H]
  Tensor output;      // [V][H] LM head (the same memory as embed when tied)
  Tensor final_norm;  // [1][H] f32
  float embed_scale = 1.0f;  // gemma3: sqrt(H) rounded to the embedding dtype
  std::vector<BackendLayerWeights> layers;
  // Keeps the memory behind the Tensors alive: device copies (CUDA) and/or
  // the host ModelWeights the views point into (CPU, zero-copy).
  std::vector<DeviceBuffer> storage;
  std::shared_ptr<const void> host_owner;
};

// One layer's KV storage (tests and tools read it back with download()).
struct KvLayerStorage {
  KvCacheLayout layout;
  void* k_cache = nullptr;  // [num_blocks][block_size][num_kv_heads][head_dim], layout.dtype
  void* v_cache = nullptr;
  float* k_scale = nullptr;  // [num_blocks][block_size][num_kv_heads] f32; per-token-head dtypes only
  float* v_scale = nullptr;
};

// The storage of KV slot `slot` in a backend that keeps per slot a K and a V
// buffer (caches[2 slot], caches[2 slot + 1]) and, for the per-token-head
// dtypes, their scale buffers likewise (scales empty otherwise).
template <class Buffer>
KvLayerStorage kv_slot_storage(const KvCacheLayout& layout, const std::vector<Buffer>& caches,
                               const std::vector<Buffer>& scales, int slot) {
  const size_t s = static_cast<size_t>(slot) * 2;
  KvLayerStorage st{layout, caches[s].data(), caches[s + 1].data()};
  if (!scales.empty()) {
    st.k_scale = static_cast<float*>(scales[s].data());
    st.v_scale = static_cast<float*>(scales[s + 1].data());
  }
  return st;
}

struct BackendOptions {
  int num_threads = 0;         // CPU: OpenMP threads (0: default)
  bool enforce_eager = false;  // CUDA: no CUDA graphs
  int device = 0;              // CUDA device ordinal
};

struct MemoryInfo {
  uint64_t total_bytes = 0;  // device memory (CUDA) or physical memory (CPU)
  uint64_t free_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string_view name() const = 0;  // "cpu" | "cuda": for logs and reports only

  // ---- what the backend can do (the engine asks these, never name()) ----
  // Its tensors live in host memory: the KV budget comes from the machine's
  // RAM (there is no device memory to measure, so --gpu-memory-utilization
  // does not apply), the host weights are the ones it computes with (the
  // engine keeps them for the non-finite diagnosis), and logits are already
  // on the host, so the engine samples them there with each request's
  // seeded stream (engine/sampler.h) instead of Backend::sample.
  virtual bool uses_host_memory() const { return false; }
  // Rows of logits one LM-head call computes, for steps of up to
  // max_num_seqs sequences. A device backend computes every sampled row of
  // a step in one call (the head is read once per step; 256 rows of a 128K
  // vocabulary are 131 MB).
  virtual int max_logits_rows(int max_num_seqs) const {
    return std::clamp(max_num_seqs, kMinLogitsRows, kMaxLogitsRows);
  }
  static constexpr int kMinLogitsRows = 16, kMaxLogitsRows = 256;
  virtual ScalarType activation_dtype() const = 0;
  virtual MemoryInfo memory_info() const = 0;

  // ---- memory ----
  virtual DeviceBuffer alloc(size_t bytes) = 0;  // contents undefined
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;  // waits for pending ops
  virtual void synchronize() = 0;

  // ---- weights (once, at load) ----
  virtual BackendWeights upload_weights(std::shared_ptr<const ModelWeights> weights) = 0;

  // ---- KV storage (the bookkeeping stays in kv/KvCacheManager) ----
  // Allocates plan.num_blocks pages: for each group slot i (0 <= i <
  // plan.group_size) one K and one V tensor of layout (num_blocks =
  // plan.num_blocks); layer l of group g uses slot index_of(l in
  // plan.groups[g].layers). Memory = plan.pool_bytes(). Zero-filled.
  // When plan.state is not empty (linear-attention layers, kv/state_plan.h)
  // it also allocates the state pool, plan.state.total_slots() slots (the
  // running sequences' and the prefix snapshots'): slot s of layer l holds a
  // conv state and a recurrent state (gated_delta_net).
  virtual void allocate_kv(const KvPlan& plan, const KvCacheLayout& layout) = 0;
  virtual KvLayerStorage kv_layer(int layer) const = 0;
  virtual int kv_group_of_layer(int layer) const = 0;
  // Per-layer scales (validated by the engine); uploaded once per change.
  virtual void set_kv_scales(const KvScales& scales) = 0;
  // Not owned; nullptr detaches. Called from store_kv with host fp32 arrays.
  virtual void set_store_observer(StoreObserver* observer) = 0;
  // KV store saturation (docs/robustness.md "KV clipping"; backend/kv_clips.h):
  // per layer ([num_layers]; a layer without a KV cache stays 0), the K and V
  // elements stored since allocate_kv and how many of them saturated.
  // nullopt: this backend does not count. Counting never changes a stored
  // byte. May be read from another thread; on a device backend a read is a
  // synchronous copy (callers on the step path rate-limit it).
  virtual std::optional<std::vector<KvClipCounts>> kv_clip_counts() const { return std::nullopt; }

  // ---- step ----
  virtual void begin_step(const StepBatch& batch) = 0;

  // ---- ops (T = rows of the activations = batch.num_tokens) ----
  // out [T][H] = table[ids[t]] * scale, ids from begin_step. out f32.
  virtual void embedding(const Tensor& table, float scale, Tensor& out) = 0;
  // y [T][out] = x [T][in] * W^T (+ bias). W [out][in]. fp32 accumulation.
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) = 0;
  // y = x * rsqrt(mean(x^2) + eps) * w per row (w [1][cols]); y may alias x.
  virtual void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) = 0;
  // Fused residual: h += x; y = rmsnorm(h) * w. h f32; y may alias h.
  virtual void add_rmsnorm(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y) = 0;
  // add_rmsnorm whose y is read next by linear-family ops on the weights
  // next_ws (linear, linear_qkv_split_store, linear_gated_act(_linear)), one
  // each, before any other op that quantizes activations, and by nothing
  // else. A backend may hand those GEMMs y in its own form, with the same
  // bits in their outputs (CUDA's W8A8 rows: the norm kernel writes the
  // GEMMs' e4m3 codes and scales, not y); y's contents are then undefined,
  // and another reader is a logic_error. next_ws empty: add_rmsnorm.
  virtual void add_rmsnorm_for(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y,
                               std::span<const Tensor> /*next_ws*/) {
    add_rmsnorm(h, x, w, eps, y);
  }
  // In place, per head: x [T][heads*head_dim] normalized over each head's
  // head_dim elements with w [1][head_dim] (Qwen3 / Gemma 3 QK-norm).
  virtual void head_rmsnorm(Tensor& x, int head_dim, const Tensor& w, float eps) = 0;
  // RoPE (rotate_half / NeoX, as Hugging Face) on q [T][Hq*D] and k
  // [T][Hkv*D] in place, at the step's positions, with the rope table of
  // `layer` (full or sliding rope parameters; the backend builds its cos/sin
  // tables from the ModelConfig it was made with).
  virtual void rope(int layer, Tensor& q, Tensor& k) = 0;
  // out = act(gate) * up, elementwise over [T][I]; out may alias gate.
  virtual void gated_act(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // x += y elementwise (same shape).
  virtual void add(Tensor& x, const Tensor& y) = 0;
  // Stores k, v [T][Hkv*D] of `layer` into the cache at the step's slot
  // mapping of the layer's group (quantized with the layer's scales), and
  // first hands q [T][Hq*D], k, v to the observer (if any) as host fp32.
  virtual void store_kv(const StepBatch& batch, int layer, const Tensor& q, const Tensor& k, const Tensor& v) = 0;
  // Causal paged attention of every sequence of the step (decodes and prefill
  // chunks in one call) for `layer`: q [T][Hq*D] -> out [T][Hq*D]. Window,
  // softmax scale and logit softcap come from the ModelConfig.
  virtual void attention(const StepBatch& batch, int layer, const Tensor& q, Tensor& out) = 0;
  // out [n][V] f32 = hidden[rows[i]] * output^T, then the final logit
  // softcap (if the config has one). rows are host indices into hidden's rows.
  virtual void logits(const Tensor& hidden, std::span<const int32_t> rows, const Tensor& output, Tensor& out) = 0;
  // Samples one id per row of logits [n][V] (f32) into host_ids [n].
  // Greedy rows (temperature 0) take the argmax, ties to the lowest id, on
  // every backend. Seeded random streams are backend-specific.
  virtual void sample(const Tensor& logits, std::span<const RowSampling> params, std::span<int32_t> host_ids) = 0;
  // Sampling inside the step (optional; docs/cuda_backend.md "CUDA graphs").
  // When samples_in_step(), the runner may put rows and
  // parameters into the StepBatch (sample_rows / sample_params), call
  // sample_step after the forward's ops (inside a CUDA graph capture too:
  // logits of those rows into `logits` [n][V], then one id per row on the
  // device), and fetch the ids with step_sampled_ids (the first ids.size()
  // rows; throws on a NaN row, as sample does). Same math as logits + sample.
  virtual bool samples_in_step() const { return false; }
  virtual void sample_step(const Tensor& /*hidden*/, const Tensor& /*output*/, Tensor& /*logits*/) {
    throw std::logic_error("Backend::sample_step: not supported by this backend");
  }
  virtual void step_sampled_ids(std::span<int32_t> /*host_ids*/) {
    throw std::logic_error("Backend::step_sampled_ids: not supported by this backend");
  }

  // ---- fused projections (optional; used when fuses_projections()) ----
  // The forward pass then runs linear(x, qkv_proj) into qkv [T][(Hq+2Hkv)*D]
  // and qkv_split; linear(x, gate_up_proj) into gate_up [T][2I] and
  // gated_act_fused.
  virtual bool fuses_projections() const { return false; }
  // q [T][Hq*D], k, v [T][Hkv*D] from the row ranges of qkv, with the per-head
  // norms (empty: none) and RoPE of `layer` applied to q and k, as
  // head_rmsnorm + rope would.
  virtual void qkv_split(int /*layer*/, const Tensor& /*qkv*/, const Tensor& /*q_norm*/, const Tensor& /*k_norm*/,
                         float /*eps*/, Tensor& /*q*/, Tensor& /*k*/, Tensor& /*v*/) {
    throw std::logic_error("Backend::qkv_split: this backend does not fuse projections");
  }
  // qkv_split, then store_kv(batch, layer, q, k, v): what the fused forward
  // pass runs. A backend may store K/V from the split itself (CUDA without
  // an observer), the same cache bytes store_kv writes; k and v are then
  // scratch whose contents are unspecified afterwards.
  virtual void qkv_split_store(const StepBatch& batch, int layer, const Tensor& qkv, const Tensor& q_norm,
                               const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v) {
    qkv_split(layer, qkv, q_norm, k_norm, eps, q, k, v);
    store_kv(batch, layer, q, k, v);
  }
  // The fused QKV projection and its split: linear(x, w, bias) into qkv,
  // then qkv_split_store(batch, layer, qkv, ...). What the fused forward pass
  // runs. A backend may run the split inside the GEMM, with the same bits
  // (none does: CUDA's GEMV-fused prep measured slower, docs/cuda_backend.md
  // "Deleted variants"; the op stays, the interface being additive only).
  virtual void linear_qkv_split_store(const StepBatch& batch, int layer, const Tensor& x, const Tensor& w,
                                      const Tensor& bias, Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                      float eps, Tensor& q, Tensor& k, Tensor& v) {
    linear(x, w, bias, qkv);
    qkv_split_store(batch, layer, qkv, q_norm, k_norm, eps, q, k, v);
  }
  // out [T][I] = act(gate) * up with gate = gate_up[:, :I], up = gate_up[:, I:];
  // out may be bf16 (the next GEMM's input) or f32.
  virtual void gated_act_fused(Activation /*act*/, const Tensor& /*gate_up*/, Tensor& /*out*/) {
    throw std::logic_error("Backend::gated_act_fused: this backend does not fuse projections");
  }
  // The fused MLP input: gate_up = linear(x, w, bias), then out =
  // gated_act_fused(act, gate_up). A backend may compute out without writing
  // gate_up (the CUDA decode GEMV with the activation fused); gate_up is then
  // scratch whose contents are undefined.
  virtual void linear_gated_act(Activation act, const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& gate_up,
                                Tensor& out) {
    linear(x, w, bias, gate_up);
    gated_act_fused(act, gate_up, out);
  }
  // The fused MLP: linear_gated_act(act, x, w, bias, gate_up, out), then
  // y = linear(out, w_down, down_bias) (before any all_reduce). What the
  // fused forward pass runs. A backend may hand the down GEMM the
  // activation in another form than out, with the same bits in y (CUDA's
  // W8A8 rows: the activation kernel writes the down GEMM's e4m3 codes, not
  // out); gate_up and out are then scratch whose contents are undefined.
  virtual void linear_gated_act_linear(Activation act, const Tensor& x, const Tensor& w, const Tensor& bias,
                                       Tensor& gate_up, Tensor& out, const Tensor& w_down, const Tensor& down_bias,
                                       Tensor& y) {
    linear_gated_act(act, x, w, bias, gate_up, out);
    linear(out, w_down, down_bias, y);
  }

  // A residual projection (o_proj, down_proj) and the residual add + norm
  // that follows it: tmp = linear(x, w, bias), summed over the tensor-
  // parallel ranks (all_reduce), then add_rmsnorm(h, tmp, norm_w, eps, y):
  // h += tmp; y = rmsnorm(h) * norm_w (y may alias h); with next_ws,
  // add_rmsnorm_for(..., next_ws). tmp holds the projection's output
  // afterwards. A backend may fuse the three with the
  // same bits (none does: CUDA's norm in the decode GEMV's last block measured
  // slower, docs/cuda_backend.md "Deleted variants"; the op stays, the
  // interface being additive only).
  virtual void linear_add_rmsnorm(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& tmp, Tensor& h,
                                  const Tensor& norm_w, float eps, Tensor& y, std::span<const Tensor> next_ws = {}) {
    linear(x, w, bias, tmp);
    all_reduce(tmp);
    add_rmsnorm_for(h, tmp, norm_w, eps, y, next_ws);
  }

  // ---- CUDA graphs (optional; the defaults mean "not supported") ----
  // The runner brackets the ops of a decode-only step whose StepBatch is
  // padded to a bucket (padding sequences have context_len 0, slots -1,
  // block tables max_model_len / block_size wide, decode_plan_context =
  // max_model_len) so that every pointer and shape is the same at each replay:
  //   backend.begin_step(batch);   // uploads into fixed buffers
  //   if (!backend.replay_graph(key)) {
  //     <the forward's ops, eagerly: the step's result; sizes all scratch>
  //     backend.begin_graph_capture(key); <the same ops>; backend.end_graph_capture(key);
  //   }
  // Capture records only (end_graph_capture does not launch). replay_graph
  // returns false when no valid graph exists for key (never captured, or a
  // buffer it uses was reallocated since). After an exception inside the
  // capture the runner calls abort_graph_capture.
  // Not called under enforce_eager or when supports_graphs() is false.
  virtual bool supports_graphs() const { return false; }
  // Startup (ModelRunner::warm_up_graphs): size the scratch that depends on
  // the decode plan for every decode batch of up to max_seqs sequences at up
  // to max_context tokens, so that no later step grows it (a growth drops
  // every graph). A no-op where nothing is planned per step.
  virtual void reserve_decode_scratch(int /*max_seqs*/, int /*max_context*/) {}
  virtual bool replay_graph(int64_t /*key*/) { return false; }
  virtual void begin_graph_capture(int64_t /*key*/) {}
  virtual void end_graph_capture(int64_t /*key*/) {}
  // Step profiling (CUDA: FP8KV_PROFILE=step). op_profile_due: the runner
  // should run one extra eager copy of this decode step's forward, bracketed
  // by op_profile(true) / op_profile(false), before replaying its graph (the
  // copy recomputes the same values: the replay overwrites them bitwise).
  virtual bool op_profile_due() { return false; }
  virtual void op_profile(bool /*on*/) {}

  // ---- tensor parallelism (docs/design.md, "Tensor parallelism") ----
  // The rank's Communicator (not owned; nullptr = a single rank, the
  // collectives below are then no-ops / copies).
  virtual void set_communicator(Communicator* comm) { comm_ = comm; }
  Communicator* communicator() const { return comm_; }
  int tp_rank() const { return comm_ ? comm_->rank() : 0; }
  int tp_world() const { return comm_ ? comm_->world_size() : 1; }
  // The stream a collective is ordered on (a cudaStream_t on CUDA).
  virtual void* comm_stream() const { return nullptr; }
  // In place: x = the sum of every rank's x (f32 or bf16), identical on every
  // rank. Follows the row-parallel o_proj and down_proj.
  virtual void all_reduce(Tensor& x) {
    if (comm_ && comm_->world_size() > 1)
      comm_->all_reduce_sum(x.data, static_cast<size_t>(x.numel()), x.dtype, comm_stream());
  }
  // out = the concatenation of every rank's x in rank order (out.numel() =
  // world * x.numel(), same dtype). Gathers the vocab-parallel logits.
  virtual void all_gather(const Tensor& x, Tensor& out) {
    const int64_t w = tp_world();
    if (out.dtype != x.dtype || out.numel() != w * x.numel())
      throw std::invalid_argument("Backend::all_gather: out must hold world x the input elements, same dtype");
    if (!comm_) throw std::logic_error("Backend::all_gather: no communicator (set_communicator)");
    comm_->all_gather(x.data, out.data, static_cast<size_t>(x.numel()), x.dtype, comm_stream());
  }
  virtual void abort_graph_capture() {}

  // ---- Qwen3.5 (docs/design.md "Qwen3.5 hybrids"; a backend that does not
  // run the family keeps these defaults, and the engine refuses it first) ----
  // q_proj's output qg [T][Hq*2*D] (per head: D query values, then D gate
  // values) -> q [T][Hq*D] and gate [T][Hq*D].
  virtual void split_q_gate(const Tensor& /*qg*/, int /*head_dim*/, Tensor& /*q*/, Tensor& /*gate*/) {
    throw std::logic_error("Backend::split_q_gate: this backend does not run qwen3_5");
  }
  // x *= sigmoid(gate), elementwise (the gated attention's output gate).
  virtual void mul_sigmoid(Tensor& /*x*/, const Tensor& /*gate*/) {
    throw std::logic_error("Backend::mul_sigmoid: this backend does not run qwen3_5");
  }
  // The same with the gates inside the fused q|k|v projection's rows (a
  // backend that fuses projections): qkv [T][2 Hq D + 2 Hkv D], per q head D
  // query values then D gate values, then k and v, as qkv_split read them;
  // y [T][Hq D] = x * sigmoid(gate), f32 (may alias x) or bf16 (the o_proj
  // GEMM's input, rounded once). split_q_gate + mul_sigmoid's values.
  virtual void mul_sigmoid_qkv_gate(const Tensor& /*x*/, const Tensor& /*qkv*/, int /*head_dim*/, Tensor& /*y*/) {
    throw std::logic_error("Backend::mul_sigmoid_qkv_gate: this backend does not fuse projections");
  }
  // The token mixer of Gated DeltaNet layer `layer` for every sequence of
  // the step, from the projections of the normed input: qkv [T][C], z
  // [T][Hv*Dv], b and a [T][Hv]; out [T][Hv*Dv] (before out_proj; f32, or
  // bf16 rounded once on a backend that fuses projections). Per
  // sequence s, in the state slot batch.state_slots[s]: the causal conv
  // (its state carried), SiLU, l2-normalized q and k, the gates, the delta
  // rule (one new token: the recurrent form; more: the chunked form), the
  // gated RMSNorm. A sequence whose first new token is at position 0 starts
  // from zero states.
  virtual void gated_delta_net(const StepBatch& /*batch*/, int /*layer*/, const BackendLayerWeights& /*w*/,
                               const Tensor& /*qkv*/, const Tensor& /*z*/, const Tensor& /*b*/, const Tensor& /*a*/,
                               float /*eps*/, Tensor& /*out*/) {
    throw std::logic_error("Backend::gated_delta_net: this backend does not run qwen3_5");
  }
  // Prefix snapshots (docs/design.md "Prefix snapshots of the linear-attention
  // state"): copies the whole state of pool slot src (every linear_attention
  // layer's conv and recurrent state) to slot dst, slots in [0,
  // plan.state.total_slots()), ordered after the ops issued before it. The
  // runner calls it between steps, never inside a captured graph.
  virtual void copy_state_slot(int /*src*/, int /*dst*/) {
    throw std::logic_error("Backend::copy_state_slot: this backend does not run qwen3_5");
  }

 protected:
  Communicator* comm_ = nullptr;
};

// ---- construction (one place: engine/backend_factory.cpp) ----------------

// Builds the backend `choice` resolves to (require_backend's checks first:
// InputError, one clear line, for cuda without a CUDA build or without a GPU).
std::unique_ptr<Backend> make_backend(BackendChoice choice, const ModelConfig& cfg, const BackendOptions& opts);
// The same for a resolved backend (engine/tp_runner.cpp resolves once, then
// builds one per rank).
std::unique_ptr<Backend> make_backend(BackendKind kind, const ModelConfig& cfg, const BackendOptions& opts);
// What `choice` resolves to on this machine: auto_ -> cuda when the build has
// the CUDA backend and a GPU is present, else cpu. No checks.
BackendKind resolve_backend(BackendChoice choice);
// resolve_backend, then the checks make_backend does before it builds
// one (a CUDA device is present, the build has the backend): InputError
// naming --backend otherwise. The engine calls it before it loads or makes
// weights, so `--backend cuda` on a machine without a GPU fails at once.
BackendKind require_backend(BackendChoice choice);

// Per-backend factories (defined in backend/cpu/cpu_backend.cpp and, in CUDA
// builds, backend/cuda/cuda_backend.cpp).
std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& cfg, const BackendOptions& opts);
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& cfg, const BackendOptions& opts);
// True when a usable CUDA device is present (CUDA builds; false otherwise).
bool cuda_device_available();
// The CUDA devices this process sees (CUDA builds; 0 otherwise, or when the
// runtime cannot tell).
int cuda_device_count();

}  // namespace fp8kv
