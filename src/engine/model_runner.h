// The ModelRunner: turns the Scheduler's output into one StepBatch per step
// (ids, positions, slot mapping per KV group, packed block tables, query
// starts, context lengths), hands it to the backend once (begin_step), runs
// the forward pass, and computes logits / samples for chosen rows. It owns
// the RunState (engine/forward.h) and the backend's weights.
#pragma once
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "engine/forward.h"
#include "engine/scheduler.h"
#include "engine/tp_shard.h"
#include "kv/kv_cache_manager.h"

namespace fp8kv {

class ModelWeights;
class Sampler;

// The rows a step samples, built once per step by the engine: the last row
// of each listed sequence. TpRunner::execute samples them and returns the ids.
struct StepSampling {
  std::vector<int> seqs;            // indices into SchedulerOutput::seqs, ascending
  std::vector<RowSampling> params;  // one per seq: Backend::sample's (seed, counter) stream
  std::vector<Sampler*> host;       // one per seq: the request's seeded stream, used when the
                                    // backend uses_host_memory() (engine/sampler.h)
  bool want_logits = false;         // also return the sampled rows' logits (per-token logprobs)
  bool empty() const { return seqs.empty(); }
};

// What a step returns: one id per StepSampling::seqs entry and, with
// want_logits (always on a host-memory backend), their logits [ids.size()][V].
struct StepOutput {
  std::vector<int32_t> ids;
  std::vector<float> logits;
};

class ModelRunner {
 public:
  // Rows of logits computed per LM-head call (bounds memory for large vocabularies).
  static constexpr int kLogitsRows = 16;

  // Uploads the weights and allocates the RunState (so that a device backend
  // can measure what is left for the KV cache before it is planned).
  // With tensor parallelism (tp.world > 1; engine/tp_shard.h), `cfg` and
  // `weights` are the full model: the runner uploads only rank tp.rank's
  // shard, and `backend` must be made with shard_config(cfg, tp.world) and
  // carry the rank's Communicator. max_num_seqs bounds the CUDA-graph buckets
  // and the logits rows computed per LM-head call on a device backend (one
  // call per decode step).
  ModelRunner(const ModelConfig& cfg, Backend& backend, std::shared_ptr<const ModelWeights> weights,
              int max_num_batched_tokens, int max_num_seqs = kLogitsRows, TpShard tp = {});

  // CUDA graphs (docs/cuda_backend.md "CUDA graphs"). A decode-only step of
  // S <= largest bucket sequences is padded to the bucket (1, 2, 4, 8, 16,
  // 24, 32, ... up to max_num_seqs, as vLLM) with sequences of context 0 and
  // slot -1, its block tables widened to max_model_len / block_size columns
  // and its decode plan made for max_model_len (StepBatch::
  // decode_plan_context), so one captured graph per bucket serves every
  // context length. Used when the backend supports_graphs() (CUDA without
  // --enforce-eager and without a store observer). pad_eager (tests) pads
  // the same way but runs the ops eagerly: the reference a replay must equal
  // bitwise.
  void set_pad_eager(bool on) { pad_eager_ = on; }
  // Tests: tensor-parallel ranks capture CUDA graphs too (each rank's decode
  // step with its collectives; NCCL and the one-shot all-reduce are
  // capture-safe). Off in production until a multi-GPU run has checked them
  // (docs/tp.md): TP ranks run eagerly.
  void set_tp_graphs(bool on) { tp_graphs_ = on; }
  // Bucket of a decode step of S sequences; 0 when S exceeds the largest.
  int graph_bucket(int S) const;
  // Startup warm-up, as vLLM captures its CUDA graphs before serving (after
  // set_kv and the KV scales): Backend::reserve_decode_scratch for every
  // decode batch size, one eager prefill as large as any step can be
  // (max_num_batched_tokens tokens in up to max_num_seqs sequences of at most
  // max_model_len, tables max_model_len wide, a sampled row per sequence;
  // every block-table entry block 0, every slot -1, so it reads block 0 and
  // writes no KV), which sizes the backend's scratch buffers, then one
  // capture per decode bucket, largest first, on all-padding batches (the
  // padding rows of pad_batch). A graph is dropped when a scratch buffer grows
  // later, so without the sizing the first real mixed step would discard them.
  // Does nothing (returns 0) unless the backend supports_graphs(), on one
  // rank, without pad_eager. Returns the graphs captured.
  int warm_up_graphs();
  int64_t graph_replays() const { return graph_replays_; }
  int64_t graph_captures() const { return graph_captures_; }
  // The KV bookkeeping the step's slot mappings and block tables come from.
  void set_kv(KvCacheManager& kv) { kv_ = &kv; }

  // Builds the step's StepBatch from `out` (its order: decodes first), uploads
  // it and runs every layer. Row r of the step is token r of the
  // concatenation of out.seqs. `sampling`: the rows sample() will take. A
  // decode-only step run with a padded bucket (graphs or pad_eager) on a
  // backend that samples_in_step(), where every sequence samples, computes
  // the logits and samples inside the step (and its CUDA graph; padding rows
  // sample greedily and are dropped); sample() then only fetches the ids
  // (docs/cuda_backend.md "CUDA graphs").
  void execute(const SchedulerOutput& out, const StepSampling& sampling = {});
  const StepBatch& batch() const { return batch_; }
  // execute() in two halves, for multi-process tensor parallelism
  // (engine/tp_runner.h): rank 0 prepares the batch and sends it; a follower
  // process has no scheduler and takes rank 0's batch with set_prepared.
  void prepare(const SchedulerOutput& out) { build_batch(out); }
  // The state-slot copies (prefix snapshots) travel with the batch: every
  // rank holds its heads' states in the same slots.
  using StateCopies = std::vector<std::pair<int32_t, int32_t>>;
  void set_prepared(StepBatch b, StateCopies restores, StateCopies saves) {
    batch_ = std::move(b);
    step_seqs_.clear();
    step_params_.clear();
    state_restores_ = std::move(restores);
    state_saves_ = std::move(saves);
  }
  const StateCopies& state_restores() const { return state_restores_; }
  const StateCopies& state_saves() const { return state_saves_; }
  void run_prepared();
  // First row of out.seqs[i] in the step.
  int first_row(int i) const { return batch_.query_start[i]; }
  // The sampled rows of `s` in this step (the last row of each sequence).
  std::vector<int32_t> sample_rows(const StepSampling& s) const;

  // Logits of chosen rows of the last step, to the host: out [rows.size()][V].
  // (Tensor parallel: a collective; every rank calls it, rank 0 fills out.)
  void logits_to_host(std::span<const int32_t> rows, std::vector<float>& out);
  // Logits of chosen rows, sampled on the backend (ids to the host; tensor
  // parallel: every rank calls it, rank 0 samples and fills ids). After a
  // step that sampled inside itself (see execute), rows and params are that
  // step's (TpRunner passes the StepSampling it gave execute) and only the
  // ids are fetched.
  void sample(std::span<const int32_t> rows, std::span<const RowSampling> params, std::span<int32_t> ids);

  Backend& backend() { return be_; }
  // The non-finite diagnosis (ForwardPass::set_check_stages): the engine
  // re-runs a failed step with it on, on rank 0, and reads the first stage
  // whose output held NaN/inf. While on, steps run eagerly (no graph replay).
  void set_check_stages(bool on) { fwd_.set_check_stages(on); }
  int first_nonfinite_stage() const { return fwd_.first_nonfinite_stage(); }

 private:
  void build_batch(const SchedulerOutput& out);
  void run_step();  // run_prepared without the state copies
  // Logits of rows [m] into l [m][V] (vocab-parallel: local shard + all_gather).
  void compute_logits(const Tensor& hidden, std::span<const int32_t> rows, Tensor& l);
  // Pads batch_ (decode-only, S <= bucket) to `bucket` sequences (see above).
  void pad_batch(int bucket);

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
  std::vector<int> buckets_;  // ascending
  int max_num_batched_tokens_ = 0;
  bool pad_eager_ = false;
  bool tp_graphs_ = false;
  std::vector<int> step_seqs_;               // execute's StepSampling (sequences, parameters)
  std::vector<RowSampling> step_params_;
  // The step's state copies (SchedulerOutput::state_restores / state_saves).
  std::vector<std::pair<int32_t, int32_t>> state_restores_, state_saves_;
  bool sampled_in_step_ = false;             // this step's ids wait on the device
  int sampled_rows_ = 0;                     // real (unpadded) rows sampled in the step
  int64_t graph_replays_ = 0, graph_captures_ = 0;
};

}  // namespace fp8kv
