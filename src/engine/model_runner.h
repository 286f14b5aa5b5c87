// The ModelRunner: turns the Scheduler's output into one StepBatch per step
// (ids, positions, slot mapping per KV group, packed block tables, query
// starts, context lengths), hands it to the backend once (begin_step), runs
// the forward pass, and computes logits / samples for chosen rows. It owns
// the RunState (engine/forward.h) and the backend's weights.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/scheduler.h"
#include "engine/tp_shard.h"
#include "kv/kv_cache_manager.h"

namespace fp8kv {

class ModelWeights;

class ModelRunner {
 public:
  // Rows of logits computed per LM-head call (bounds memory for large vocabularies).
  static constexpr int kLogitsRows = 16;

  // Uploads the weights and allocates the RunState (so that a device backend
  // can measure what is left for the KV cache before it is planned).
  // With tensor parallelism (tp.world > 1; engine/tp_shard.h), `cfg` and
  // `weights` are the full model: the runner uploads only rank tp.rank's
  // shard, and `backend` must be made with shard_config(cfg, tp.world) and
  // carry the rank's Communicator.
  ModelRunner(const ModelConfig& cfg, Backend& backend, std::shared_ptr<const ModelWeights> weights,
              int max_num_batched_tokens, TpShard tp = {});
  // The KV bookkeeping the step's slot mappings and block tables come from.
  void set_kv(KvCacheManager& kv) { kv_ = &kv; }

  // Builds the step's StepBatch from `out` (its order: decodes first), uploads
  // it and runs every layer. Row r of the step is token r of the
  // concatenation of out.seqs.
  void execute(const SchedulerOutput& out);
  const StepBatch& batch() const { return batch_; }
  // First row of out.seqs[i] in the step.
  int first_row(int i) const { return batch_.query_start[i]; }

  // Logits of chosen rows of the last step, to the host: out [rows.size()][V].
  // (Tensor parallel: a collective; every rank calls it, rank 0 fills out.)
  void logits_to_host(std::span<const int32_t> rows, std::vector<float>& out);
  // Logits of chosen rows, sampled on the backend (ids to the host; tensor
  // parallel: every rank calls it, rank 0 samples and fills ids).
  void sample(std::span<const int32_t> rows, std::span<const RowSampling> params, std::span<int32_t> ids);

  Backend& backend() { return be_; }

 private:
  void build_batch(const SchedulerOutput& out);
  // Logits of rows [m] into l [m][V] (vocab-parallel: local shard + all_gather).
  void compute_logits(const Tensor& hidden, std::span<const int32_t> rows, Tensor& l);

  TpShard tp_;
  ModelConfig cfg_;  // the rank's config (engine/tp_shard.h shard_config); vocab_size is the full V
  bool vocab_parallel_ = false;
  Backend& be_;
  KvCacheManager* kv_ = nullptr;
  BackendWeights weights_;
  ForwardPass fwd_;
  RunState rs_;
  StepBatch batch_;
  DeviceBuffer logits_local_;  // [kLogitsRows][V / world] f32, vocab-parallel only
};

}  // namespace fp8kv
