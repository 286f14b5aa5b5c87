// CudaBackend: the Backend interface (backend/backend.h) on one CUDA device.
// docs/cuda_backend.md has the decisions and the measured numbers. The
// implementation: cuda_backend.cpp (construction, memory, begin_step, the
// profiling scope), cuda_weights.cpp (weights, KV pool), cuda_forward.cpp
// (the forward ops and attention), cuda_sample.cpp (LM head, sampling),
// cuda_graphs.cpp (CUDA graphs, scratch growth).
//
// Memory: weights are uploaded once as bf16 (fp32 checkpoints are rounded to
// bf16 at upload); the residual stream and every activation are fp32 (the
// activation dtype), GEMM inputs are converted to bf16 on the fly
// (cuBLASLt bf16 x bf16 -> fp32). The KV pool lives on the device
// (allocate_kv). One stream; the StepBatch is uploaded once per step
// (begin_step: one copy of one packed buffer), and store / decode / prefill
// kernels run batched over the whole step.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attention/attention.h"
#include "backend/cuda/gdn/gdn.h"
#include "backend/cuda/ops/ops.h"
#include "backend/cuda/prefill_profile.h"
#include "backend/cuda/step_profile.h"
#include "kv/state_plan.h"
#include "model/rope.h"

namespace fp8kv {

class CudaBackend final : public Backend {
 public:
  // Throws InputError when no device is present or the model's head_dim is
  // not one the attention kernels take (64, 128, 256).
  CudaBackend(const ModelConfig& cfg, const BackendOptions& opts);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  void* comm_stream() const override { return stream_; }  // collectives on the op stream (#17)
  ScalarType activation_dtype() const override { return ScalarType::f32; }
  MemoryInfo memory_info() const override;

  DeviceBuffer alloc(size_t bytes) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override;

  BackendWeights upload_weights(std::shared_ptr<const ModelWeights> weights) override;

  void allocate_kv(const KvPlan& plan, const KvCacheLayout& layout) override;
  KvLayerStorage kv_layer(int layer) const override;
  int kv_group_of_layer(int layer) const override { return layer_group_.at(layer); }
  void set_kv_scales(const KvScales& scales) override;
  void set_store_observer(StoreObserver* observer) override { observer_ = observer; }
  // Both store kernels (store_kv and the store fused into qkv_split) count
  // their clipped elements into clips_dev_; the stored elements are counted
  // here from the step's slot mappings (docs/robustness.md "KV clipping").
  // Reads the device counters (one small synchronous copy).
  std::optional<std::vector<KvClipCounts>> kv_clip_counts() const override;

  void begin_step(const StepBatch& batch) override;

  void embedding(const Tensor& table, float scale, Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) override;
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override;
  void add_rmsnorm(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y) override;
  // W8A8 rows of every next_ws weight (past the GEMV rows, T % 4 == 0,
  // Hopper's FP8 GEMM would quantize y; one code layout for all: the same K
  // and scale grouping): the norm kernel writes the GEMMs' codes and scales
  // into w8a8_act_ (ops.h rmsnorm_residual_e4m3: bitwise add_rmsnorm +
  // quantize_rows_e4m3), not y, and leaves a hand-over record (norm_codes_)
  // that each of those GEMMs takes once (take_norm_codes). Otherwise
  // add_rmsnorm.
  void add_rmsnorm_for(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y,
                       std::span<const Tensor> next_ws) override;
  void head_rmsnorm(Tensor& x, int head_dim, const Tensor& w, float eps) override;
  void rope(int layer, Tensor& q, Tensor& k) override;
  void gated_act(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void store_kv(const StepBatch& batch, int layer, const Tensor& q, const Tensor& k, const Tensor& v) override;
  void attention(const StepBatch& batch, int layer, const Tensor& q, Tensor& out) override;
  void logits(const Tensor& hidden, std::span<const int32_t> rows, const Tensor& output, Tensor& out) override;
  void sample(const Tensor& logits, std::span<const RowSampling> params, std::span<int32_t> host_ids) override;
  // Logits rows + sampling inside the step (and its CUDA graph): one replay
  // and one small D2H copy per decode step.
  bool samples_in_step() const override;
  void sample_step(const Tensor& hidden, const Tensor& output, Tensor& logits) override;
  void step_sampled_ids(std::span<int32_t> host_ids) override;

  // Fused QKV and gate|up GEMMs (weights concatenated at upload).
  bool fuses_projections() const override { return true; }
  void qkv_split(int layer, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps, Tensor& q,
                 Tensor& k, Tensor& v) override;
  // qkv_split's argument checks and kernel arguments; store: fused store target (or null).
  cuda::QkvPrepArgs qkv_split_args(int layer, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm,
                                   float eps, Tensor& q, Tensor& k, Tensor& v,
                                   const cuda::QkvPrepArgs::FusedStore* store) const;
  // The fused KV store's target for the step's tokens of `layer` (checks the step and the KV pool).
  cuda::QkvPrepArgs::FusedStore fused_store_target(const StepBatch& b, int layer, const char* op) const;
  void qkv_split_impl(int layer, const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps, Tensor& q,
                      Tensor& k, Tensor& v, const cuda::QkvPrepArgs::FusedStore* store);
  void gated_act_fused(Activation act, const Tensor& gate_up, Tensor& out) override;
  void linear_gated_act(Activation act, const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& gate_up,
                        Tensor& out) override;
  // W8A8 rows on both GEMMs: the activation kernel writes the down GEMM's
  // e4m3 codes (ops.h gated_act_quantize_e4m3), not out; otherwise
  // linear_gated_act, then linear.
  void linear_gated_act_linear(Activation act, const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& gate_up,
                               Tensor& out, const Tensor& w_down, const Tensor& down_bias, Tensor& y) override;
  // Without an observer: the store fused into the split kernel (ops.h
  // QkvPrepArgs::FusedStore), one launch per layer less.
  void qkv_split_store(const StepBatch& batch, int layer, const Tensor& qkv, const Tensor& q_norm,
                       const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v) override;

  // Qwen3.5 (cuda_gdn.cpp; kernels in gdn/gdn.h; docs/cuda_backend.md
  // "Gated DeltaNet"): the state pool lives on the device (allocate_kv with
  // plan.state), the step's state slots come with the step upload.
  void split_q_gate(const Tensor& qg, int head_dim, Tensor& q, Tensor& gate) override;
  void mul_sigmoid(Tensor& x, const Tensor& gate) override;
  void mul_sigmoid_qkv_gate(const Tensor& x, const Tensor& qkv, int head_dim, Tensor& y) override;
  void gated_delta_net(const StepBatch& batch, int layer, const BackendLayerWeights& w, const Tensor& qkv,
                       const Tensor& z, const Tensor& b, const Tensor& a, float eps, Tensor& out) override;
  // Prefix snapshots: cudaMemcpyAsync per layer on the step stream (outside any graph).
  void copy_state_slot(int src, int dst) override;

  // CUDA graphs per decode bucket (docs/cuda_backend.md "CUDA graphs").
  bool supports_graphs() const override { return !enforce_eager_ && observer_ == nullptr; }
  void reserve_decode_scratch(int max_seqs, int max_context) override;
  bool replay_graph(int64_t key) override;
  void begin_graph_capture(int64_t key) override;
  void end_graph_capture(int64_t key) override;
  void abort_graph_capture() override;

  // The step profile (FP8KV_PROFILE=step[=N], step_profile.h): per replayed
  // step, event times of the graph, the logits/sample tail and the device
  // idle time between steps, printed to stderr; and one eager, op-timed copy
  // of the N-th replayed step.
  bool op_profile_due() override;
  void op_profile(bool on) override;

 private:
  // Pinned host staging for the per-step copies (truly async: no staging
  // through pageable memory). Reuse waits for the copy that last read or
  // wrote it (an event), so a step never overwrites data still in flight.
  struct Pinned {
    void* p = nullptr;
    size_t n = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
    Pinned() = default;
    Pinned(const Pinned&) = delete;
    Pinned& operator=(const Pinned&) = delete;
    ~Pinned();
    void* get(size_t bytes);            // waits for the last copy, grows
    void copied(cudaStream_t stream);   // after enqueueing a copy of it
  };
  // One op's profiling scope, feeding whichever profile of FP8KV_PROFILE is
  // active (docs/cuda_backend.md "Profiling: FP8KV_PROFILE"):
  //  - the step profile (its op-timed eager step): an event at the scope's
  //    end, labelled step_op ("linear 4096x4096" with n x k); null step_op:
  //    not a step-profile op;
  //  - the prefill profile (an active prefill step):
  //    start / stop events around the scope under prefill_key (GEMMs with
  //    their flops for the TFLOP/s column); null / empty key: not a prefill op
  //    (a nested scope's key times the inner part instead).
  // Neither active: a flag test, no event, no string.
  class OpScope {
   public:
    OpScope(CudaBackend* b, const char* step_op, const char* prefill_key = nullptr, double flops = 0);
    OpScope(CudaBackend* b, const char* step_op, int64_t n, int64_t k, const std::string& prefill_key = {},
            double flops = 0);
    OpScope(CudaBackend* b, const char* step_op, const std::string& prefill_key, double flops = 0);
    ~OpScope();
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;

   private:
    void start(const char* prefill_key, double flops);
    CudaBackend* be_;
    const char* op_;
    int64_t n_ = 0, k_ = 0;
    cuda::PrefillProfile* prefill_ = nullptr;  // started there (stopped by the destructor)
  };
  // Device views of the current step (pointers into step_dev_).
  struct StepView {
    int T = 0, S = 0, num_decodes = 0, B = 0;
    int max_decode_context = 0;  // over decode sequences
    int decode_plan_context = 0; // the decode plan's context (StepBatch::decode_plan_context or the above)
    int max_prefill_query = 0;   // over prefill sequences
    int prefill_row0 = 0;        // query_start[num_decodes]
    const int32_t* ids = nullptr;        // [T]
    const int32_t* positions = nullptr;  // [T]
    const int32_t* context_lens = nullptr;     // [S]
    const int32_t* prefill_q_start = nullptr;  // [S - num_decodes + 1], relative to prefill_row0
    const int32_t* q_start = nullptr;          // [S + 1] StepBatch::query_start
    const int32_t* state_slots = nullptr;      // [S] StepBatch::state_slots (null: the step has none)
    std::vector<const int64_t*> slots;         // [G] -> [T]
    std::vector<const int32_t*> block_tables;  // [G] -> [S][B]
    int n_sample = 0;                          // StepBatch::sample_rows.size()
    const int32_t* sample_rows = nullptr;      // [n_sample]
    const cuda::SampleParams* sample_params = nullptr;  // [n_sample]
  };
  struct LayerScales {
    cuda::DeviceBuffer k, v;
    int k_count = 1, v_count = 1;
  };

  const StepView& step(const char* op) const;
  const uint16_t* to_bf16_input(const Tensor& x, const char* op);
  // W8A8 (ops.h Gemm::linear_w8a8). linear_takes_w8a8: linear(x, W, y)
  // runs the W8A8 GEMM. linear_w8a8_into: that GEMM into y (f32, or bf16
  // through y_f32_) with bias bp, quantizing x into w8a8_act_ (sized by the
  // caller), or with x null on the codes already there (Gemm::w8a8_codes).
  bool linear_takes_w8a8(const Tensor& x, const cuda::DeviceMatrix& W, const Tensor& y) const;
  void linear_w8a8_into(const Tensor* x, const cuda::DeviceMatrix& W, const float* bp, Tensor& y);
  // linear_gated_act's W8A8 branch: its conditions (past the fused-GEMV
  // rows), and its gate|up GEMM into gate_up's first half as bf16 [T][2I].
  bool gate_up_takes_w8a8(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& gate_up,
                          const Tensor& out) const;
  void gate_up_w8a8(const Tensor& x, const Tensor& w, const cuda::DeviceMatrix& Wg, uint16_t* gu);
  // add_rmsnorm_for's hand-over: the codes in w8a8_act_ are y's (x: y's
  // data) for the W8A8 GEMMs of the weights w[0, n) (their e4m3 bytes) on T
  // rows. take_norm_codes(x, W): true when x holds such codes for this GEMM
  // (W leaves the list; the record is spent when the list is empty); throws
  // std::logic_error when x's codes were written for other GEMMs.
  // reads_input(x, op): an op about to read x's values; throws while x holds
  // codes only. writes_codes(op): an op about to quantize into w8a8_act_;
  // throws while codes wait for a GEMM. Cleared by begin_step and the norms.
  struct NormCodes {
    const void* x = nullptr;
    std::array<const void*, 4> w{};
    int n = 0;
    int64_t T = 0;
  };
  NormCodes norm_codes_;
  bool take_norm_codes(const Tensor& x, const cuda::DeviceMatrix& W);
  void reads_input(const Tensor& x, const char* op) const;
  void writes_codes(const char* op) const;
  // Grows a scratch buffer that captured graphs may point into: a
  // reallocation invalidates every graph (buffers_gen_), and is refused
  // while capturing (the runner's eager warm-up sizes everything first).
  void grow(cuda::DeviceBuffer& buf, size_t bytes);
  void drop_graphs();
  // The device state pool (allocate_kv with a non-empty plan.state).
  void allocate_state(const StatePlan& plan);

  ModelConfig cfg_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::Gemm> gemm_;
  RopeTable rope_full_, rope_sliding_;
  cuda::DeviceBuffer inv_freq_full_, inv_freq_sliding_;  // [rot_dim / 2] each
  // KV pool: for each group slot i, one K and one V tensor ([slot][k|v]).
  KvCacheLayout layout_;
  std::vector<int> layer_group_, layer_slot_;
  std::vector<DeviceBuffer> kv_storage_;
  std::vector<DeviceBuffer> kv_scale_storage_;  // per-token-head dtypes: [slot][k|v] scale arrays, else empty
  std::vector<LayerScales> scales_;
  StoreObserver* observer_ = nullptr;
  // KV clipping (kv_clip_counts): [num_layers][k|v] u64 on the device, added
  // to by the store kernels (per-tensor fp8 caches only); per KV group the
  // tokens stored since allocate_kv (slots >= 0 of every step).
  DeviceBuffer clips_dev_;
  std::unique_ptr<std::atomic<uint64_t>[]> stored_tokens_;  // [groups]; read from other threads
  size_t stored_groups_ = 0;
  unsigned long long* layer_clips(int layer) const;
  // Gated DeltaNet state pool (kv/state_plan.h): per linear_attention layer
  // (state_index_[layer] >= 0) one conv-state and one recurrent-state buffer
  // of plan.num_slots slots each. Fixed addresses after allocate_kv, so
  // captured graphs may point into them.
  StatePlan state_;
  std::vector<int> state_index_;
  std::vector<DeviceBuffer> conv_state_, ssm_state_;
  cuda::DeviceBuffer gdn_conv_out_;             // [T][C] f32 conv output (grown with grow())
  cuda::DeviceBuffer gdn_core_out_;             // [T][VD] f32 delta-rule output when out is bf16 (grown)
  cuda::DeviceBuffer gdn_rule_scratch_;         // the chunked delta rule's (gdn_rule_scratch_bytes; grown with grow())
  // Step upload: one host staging buffer, one device buffer.
  std::vector<uint8_t> step_host_;
  Pinned rows_host_, params_host_, ids_host_;  // logits rows, sample params, sampled ids
  cuda::DeviceBuffer step_dev_;
  StepView step_;
  bool have_step_ = false;
  // Scratch.
  cuda::DeviceBuffer x_bf16_;        // GEMM input [rows][in] bf16
  cuda::DeviceBuffer y_f32_;         // GEMM output staging when y is bf16
  cuda::DeviceBuffer w8a8_act_;      // W8A8 activation codes + scales (Gemm::w8a8_scratch_bytes; grown with grow())
  cuda::DeviceBuffer logits_w8a8_;   // the same for logits() (never in a graph: reserve())
  cuda::DeviceBuffer decode_ws_;     // paged_decode workspace
  cuda::DeviceBuffer rows_dev_;      // logits row indices
  cuda::DeviceBuffer logits_x_bf16_; // LM-head input [n][H] bf16
  cuda::DeviceBuffer sample_params_; // [n] SampleParams
  cuda::DeviceBuffer sample_ids_;    // [n] int32
  // sample_step's buffers (graphs point into them: grown with grow()).
  cuda::DeviceBuffer step_logits_x_;   // [n][H] bf16
  cuda::DeviceBuffer step_sample_ids_; // [n] int32
  void download_ids(const void* dev, std::span<int32_t> ids);  // ids D2H + sync + NaN check
  std::vector<float> obs_q_, obs_k_, obs_v_;  // host copies for the observer
  // Graphs: one executable graph per bucket key, valid while buffers_gen_
  // (bumped by every reallocation of memory a graph may use) is unchanged.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t gen = 0;
  };
  bool enforce_eager_ = false;
  bool capturing_ = false;
  uint64_t buffers_gen_ = 0;
  std::map<int64_t, Graph> graphs_;
  // FP8KV_PROFILE's prefill and step parts (prefill_profile.h,
  // step_profile.h); null when off.
  std::unique_ptr<cuda::PrefillProfile> prof_;
  std::unique_ptr<cuda::StepProfile> sprof_;
};

}  // namespace fp8kv
