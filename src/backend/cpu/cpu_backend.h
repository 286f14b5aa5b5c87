// CpuBackend: the Backend interface (backend/backend.h) on the CPU reference
// kernels (ops.h, kv_ops.h). Every op is exactly one or two of those kernels,
// so the arithmetic is bitwise what the reference computes: results do not
// depend on the thread count, on how tokens are chunked, or on which other
// sequences share a step (docs/engine.md).
//
// Memory is host memory; weights are zero-copy views of the ModelWeights
// (kept alive by BackendWeights::host_owner). Activations are f32.
#pragma once
#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache_manager.h"
#include "model/rope.h"

namespace fp8kv {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& cfg, const BackendOptions& opts);

  std::string_view name() const override { return "cpu"; }
  bool uses_host_memory() const override { return true; }
  // 16-row chunks: the host sampler reads the rows one by one anyway.
  int max_logits_rows(int /*max_num_seqs*/) const override { return kMinLogitsRows; }
  ScalarType activation_dtype() const override { return ScalarType::f32; }
  MemoryInfo memory_info() const override;

  DeviceBuffer alloc(size_t bytes) override;
  void upload(void* dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* src, size_t bytes) override;
  void synchronize() override {}

  BackendWeights upload_weights(std::shared_ptr<const ModelWeights> weights) override;

  void allocate_kv(const KvPlan& plan, const KvCacheLayout& layout) override;
  KvLayerStorage kv_layer(int layer) const override;
  int kv_group_of_layer(int layer) const override { return map_.group.at(layer); }
  void set_kv_scales(const KvScales& scales) override { scales_ = scales; }
  void set_store_observer(StoreObserver* observer) override { observer_ = observer; }
  std::optional<std::vector<KvClipCounts>> kv_clip_counts() const override;

  void begin_step(const StepBatch& batch) override;

  void embedding(const Tensor& table, float scale, Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y) override;
  void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override;
  void add_rmsnorm(Tensor& h, const Tensor& x, const Tensor& w, float eps, Tensor& y) override;
  void head_rmsnorm(Tensor& x, int head_dim, const Tensor& w, float eps) override;
  void rope(int layer, Tensor& q, Tensor& k) override;
  void gated_act(Activation act, const Tensor& gate, const Tensor& up, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void store_kv(const StepBatch& batch, int layer, const Tensor& q, const Tensor& k, const Tensor& v) override;
  void attention(const StepBatch& batch, int layer, const Tensor& q, Tensor& out) override;
  void logits(const Tensor& hidden, std::span<const int32_t> rows, const Tensor& output, Tensor& out) override;
  void sample(const Tensor& logits, std::span<const RowSampling> params, std::span<int32_t> host_ids) override;

  // Qwen3.5 (cpu_backend_gdn.cpp, on the reference kernels of gdn.h).
  void split_q_gate(const Tensor& qg, int head_dim, Tensor& q, Tensor& gate) override;
  void mul_sigmoid(Tensor& x, const Tensor& gate) override;
  void gated_delta_net(const StepBatch& batch, int layer, const BackendLayerWeights& w, const Tensor& qkv,
                       const Tensor& z, const Tensor& b, const Tensor& a, float eps, Tensor& out) override;
  void copy_state_slot(int src, int dst) override;

 private:
  ModelConfig cfg_;
  RopeTable rope_full_, rope_sliding_;
  KvCacheLayout layout_;
  KvLayerMap map_;
  std::vector<DeviceBuffer> kv_storage_;  // [slot][k|v]
  std::vector<DeviceBuffer> kv_scale_storage_;  // [slot][k|v] f32 scales; per-token-head dtypes only
  KvScales scales_;
  StoreObserver* observer_ = nullptr;
  // Per layer: K clipped, V clipped, stored (kv_clip_counts); one relaxed
  // atomic add each per store_kv call, readable from any thread.
  std::unique_ptr<std::atomic<uint64_t>[]> clips_;
  const StepBatch* step_ = nullptr;
  // cos/sin of the step's positions: [T][rot_dim/2] each, full and sliding.
  std::vector<float> cos_full_, sin_full_, cos_sliding_, sin_sliding_;
  std::vector<float> gather_;  // logits rows gathered when not contiguous: [n][H]
  // The state pool of the linear-attention layers (cpu_backend_gdn.cpp):
  // per such layer i (state_index_[layer] = i, else -1) the conv states
  // [slots][C][K-1] (state_.conv_dtype) and the recurrent states
  // [slots][Hv][Dk][Dv] f32.
  void allocate_state(const StatePlan& plan);
  StatePlan state_;
  std::vector<int> state_index_;
  std::vector<DeviceBuffer> conv_state_, ssm_state_;
};

}  // namespace fp8kv
