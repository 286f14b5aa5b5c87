#include "engine/model_runner.h"

#include <algorithm>
#include <stdexcept>

namespace fp8kv {

ModelRunner::ModelRunner(const ModelConfig& cfg, Backend& backend, std::shared_ptr<const ModelWeights> weights,
                         int max_num_batched_tokens, int max_num_seqs, TpShard tp)
    : tp_(tp),
      cfg_(tp.world > 1 ? shard_config(cfg, tp.world) : cfg),
      vocab_parallel_(vocab_parallel(cfg, tp.world)),
      be_(backend),
      weights_(backend.upload_weights(shard_weights(std::move(weights), cfg, tp))),
      fwd_(cfg_, be_, weights_),
      rs_(be_, cfg_, max_num_batched_tokens, backend.max_logits_rows(max_num_seqs), fwd_.fused_mlp(),
          fwd_.fused()) {
  if (tp.world > 1 && backend.tp_world() != tp.world)
    throw std::logic_error("ModelRunner: tensor parallel without a matching Communicator on the backend");
  max_num_batched_tokens_ = max_num_batched_tokens;
  if (vocab_parallel_)
    logits_local_ = be_.alloc(static_cast<size_t>(rs_.max_logits_rows) * (cfg_.vocab_size / tp.world) * 4);
  // vLLM's capture sizes: 1, 2, 4, then multiples of 8, up to max_num_seqs
  // (and the token budget: a decode row is a token).
  const int cap = std::min(max_num_seqs, max_num_batched_tokens);
  for (int b : {1, 2, 4})
    if (b <= cap) buckets_.push_back(b);
  for (int b = 8; b <= cap; b += 8) buckets_.push_back(b);
}

int ModelRunner::graph_bucket(int S) const {
  for (int b : buckets_)
    if (S <= b) return b;
  return 0;
}

int ModelRunner::warm_up_graphs() {
  if (!kv_ || pad_eager_ || tp_.world != 1 || !be_.supports_graphs() || buckets_.empty()) return 0;
  const KvPlan& plan = kv_->plan();
  const int B = plan.block_size, G = kv_->num_groups(), L = plan.max_model_len;
  const int max_seqs = buckets_.back();
  // The largest step: T = max_num_batched_tokens tokens (at most max_model_len
  // per sequence) in as many sequences as a step may hold (each >= 2 tokens,
  // so that none is a one-token "decode"), block tables max_model_len wide
  // and one sampled row per sequence: the step buffer then holds any real
  // step (a mixed step of 255 decodes and a prefill chunk included), so no
  // later begin_step grows it (which would drop every graph).
  be_.reserve_decode_scratch(max_seqs, L);
  const int T = std::min(max_num_batched_tokens_, max_seqs * L);
  const int S = std::min(max_seqs, T / 2);
  if (S > 0 && (T + S - 1) / S <= L) {
    StepBatch& b = batch_;
    b = StepBatch{};
    const int width = (L + B - 1) / B;
    b.num_tokens = T;
    b.num_seqs = S;
    b.num_groups = G;
    b.max_blocks_per_seq = width;
    b.query_start.assign(1, 0);
    b.slot_mapping.assign(G, std::vector<int64_t>(T, -1));  // no KV written
    b.block_tables.assign(G, std::vector<int32_t>(static_cast<size_t>(S) * width, 0));  // block 0 only
    for (int i = 0, t = 0; i < S; ++i) {
      const int n = T / S + (i < T % S ? 1 : 0);
      for (int j = 0; j < n; ++j, ++t) {
        b.token_ids.push_back(0);
        b.positions.push_back(j);
      }
      b.query_start.push_back(t);
      b.context_lens.push_back(n);
      b.is_decode.push_back(0);
      b.max_query_len = std::max(b.max_query_len, n);
      b.max_context_len = std::max(b.max_context_len, n);
      b.sample_rows.push_back(t - 1);  // sized in the step buffer; the forward pass below samples nothing
    }
    b.sample_params.resize(static_cast<size_t>(S));
    if (!plan.state.empty()) b.state_slots.assign(static_cast<size_t>(S), -1);  // no state read or written
    step_seqs_.clear();
    step_params_.clear();
    be_.begin_step(batch_);
    fwd_.run(batch_, rs_);
  }
  const int64_t before = graph_captures_;
  for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) {
    const int bucket = *it;
    build_batch(SchedulerOutput{});
    pad_batch(bucket);  // every row padding: context 0, slot -1
    step_seqs_.resize(static_cast<size_t>(bucket));
    for (int i = 0; i < bucket; ++i) step_seqs_[static_cast<size_t>(i)] = i;
    step_params_.assign(static_cast<size_t>(bucket), RowSampling{});  // greedy
    run_prepared();
  }
  sampled_in_step_ = false;
  batch_ = StepBatch{};
  return static_cast<int>(graph_captures_ - before);
}

void ModelRunner::compute_logits(const Tensor& hidden, std::span<const int32_t> rows, Tensor& l) {
  if (!vocab_parallel_) {
    be_.logits(hidden, rows, weights_.output, l);
    return;
  }
  const int m = static_cast<int>(rows.size()), Vr = cfg_.vocab_size / tp_.world;
  Tensor local = logits_local_.view(ScalarType::f32, m, Vr);
  be_.logits(hidden, rows, weights_.output, local);
  // One gather per row: rank-major [world][Vr] is exactly the row's [V].
  for (int i = 0; i < m; ++i) {
    Tensor dst = l.rows_slice(i, 1);
    be_.all_gather(local.rows_slice(i, 1), dst);
  }
}

void ModelRunner::build_batch(const SchedulerOutput& out) {
  if (!kv_) throw std::logic_error("ModelRunner: no KvCacheManager (set_kv)");
  KvCacheManager& kv = *kv_;
  StepBatch& b = batch_;
  const int S = static_cast<int>(out.seqs.size()), T = out.num_tokens, G = kv.num_groups();
  const int B = kv.plan().block_size;
  b.num_tokens = T;
  b.num_seqs = S;
  b.num_decodes = out.num_decodes;
  b.num_groups = G;
  b.max_query_len = 0;
  b.max_context_len = 0;
  b.decode_plan_context = 0;
  b.token_ids.resize(T);
  b.positions.resize(T);
  b.query_start.assign(1, 0);
  b.context_lens.resize(S);
  b.is_decode.resize(S);
  // Linear-attention models: a sequence's state slot is its KV handle (at
  // most max_num_seqs live, kv/state_plan.h).
  b.state_slots.assign(kv.plan().state.empty() ? 0 : S, -1);
  b.slot_mapping.resize(G);
  b.block_tables.resize(G);
  int max_blocks = 1;
  for (const auto& s : out.seqs) max_blocks = std::max(max_blocks, (s.start + s.num_tokens + B - 1) / B);
  b.max_blocks_per_seq = max_blocks;
  for (int g = 0; g < G; ++g) {
    b.slot_mapping[g].resize(T);
    b.block_tables[g].assign(static_cast<size_t>(S) * max_blocks, -1);
  }
  int t = 0;
  for (int i = 0; i < S; ++i) {
    const ScheduledSeq& s = out.seqs[i];
    const SchedRequest& r = *s.req;
    if ((i < out.num_decodes) != (s.num_tokens == 1))
      throw std::logic_error("ModelRunner: the scheduler output is not ordered decodes first");
    for (int j = 0; j < s.num_tokens; ++j, ++t) {
      b.token_ids[t] = r.tokens[s.start + j];
      b.positions[t] = s.start + j;
      for (int g = 0; g < G; ++g) b.slot_mapping[g][t] = kv.slot(r.kv, g, s.start + j);
    }
    b.query_start.push_back(t);
    b.context_lens[i] = s.start + s.num_tokens;
    b.is_decode[i] = s.num_tokens == 1;
    if (!b.state_slots.empty()) {
      if (r.kv < 0 || r.kv >= kv.plan().state.num_slots)
        throw std::logic_error("ModelRunner: a KV handle outside the state pool (more live sequences than max_num_seqs)");
      b.state_slots[i] = r.kv;
    }
    b.max_query_len = std::max(b.max_query_len, s.num_tokens);
    b.max_context_len = std::max(b.max_context_len, b.context_lens[i]);
    for (int g = 0; g < G; ++g) {
      const auto& table = kv.block_table(r.kv, g);
      std::copy(table.begin(), table.end(), b.block_tables[g].begin() + static_cast<int64_t>(i) * max_blocks);
    }
  }
  if (t != T) throw std::logic_error("ModelRunner: token count does not match the scheduled sequences");
  state_restores_ = out.state_restores;
  state_saves_ = out.state_saves;
}

void ModelRunner::pad_batch(int bucket) {
  StepBatch& b = batch_;
  const int S = b.num_seqs, G = b.num_groups, Bk = kv_->plan().block_size;
  const int width = std::max(1, (kv_->plan().max_model_len + Bk - 1) / Bk);
  if (width < b.max_blocks_per_seq) throw std::logic_error("ModelRunner: a block table is wider than max_model_len");
  // Widen the block tables to the fixed width (rows keep their entries).
  for (int g = 0; g < G; ++g) {
    std::vector<int32_t>& bt = b.block_tables[g];
    std::vector<int32_t> wide(static_cast<size_t>(bucket) * width, -1);
    for (int s = 0; s < S; ++s)
      std::copy(bt.begin() + static_cast<int64_t>(s) * b.max_blocks_per_seq,
                bt.begin() + static_cast<int64_t>(s + 1) * b.max_blocks_per_seq,
                wide.begin() + static_cast<int64_t>(s) * width);
    bt.swap(wide);
    b.slot_mapping[g].resize(bucket, -1);  // padding rows store nothing
  }
  b.max_blocks_per_seq = width;
  b.token_ids.resize(bucket, 0);
  b.positions.resize(bucket, 0);
  b.context_lens.resize(bucket, 0);  // attention reads no key of a padding sequence
  b.is_decode.resize(bucket, 1);
  if (!kv_->plan().state.empty()) b.state_slots.resize(bucket, -1);  // padding sequences own no state slot
  for (int s = S; s < bucket; ++s) b.query_start.push_back(s + 1);
  b.num_tokens = b.num_seqs = b.num_decodes = bucket;
  b.decode_plan_context = kv_->plan().max_model_len;
}

void ModelRunner::execute(const SchedulerOutput& out, const StepSampling& sampling) {
  if (sampling.seqs.size() != sampling.params.size())
    throw std::logic_error("ModelRunner::execute: StepSampling seqs and params differ in size");
  build_batch(out);
  step_seqs_ = sampling.seqs;
  step_params_ = sampling.params;
  run_prepared();
}

std::vector<int32_t> ModelRunner::sample_rows(const StepSampling& s) const {
  std::vector<int32_t> rows(s.seqs.size());
  for (size_t j = 0; j < s.seqs.size(); ++j) rows[j] = batch_.query_start[static_cast<size_t>(s.seqs[j]) + 1] - 1;
  return rows;
}

void ModelRunner::run_prepared() {
  // Prefix snapshots (docs/design.md "Prefix snapshots of the linear-attention
  // state"): copies between the step's ops, never inside a captured graph.
  for (const auto& [src, dst] : state_restores_) be_.copy_state_slot(src, dst);
  state_restores_.clear();
  run_step();
  for (const auto& [src, dst] : state_saves_) be_.copy_state_slot(src, dst);
  state_saves_.clear();
}

void ModelRunner::run_step() {
  const bool decode_only = batch_.num_seqs > 0 && batch_.num_decodes == batch_.num_seqs;
  const int bucket = decode_only ? graph_bucket(batch_.num_seqs) : 0;
  // Tensor-parallel ranks run eagerly unless a test turns graphs on (engine/tp_shard.h; docs/tp.md).
  // The non-finite diagnosis checks each stage of an eager run.
  const bool graphs =
      bucket > 0 && be_.supports_graphs() && (tp_.world == 1 || tp_graphs_) && !fwd_.checking_stages();
  const int S = batch_.num_seqs;
  // Sampling inside the step: padded decode steps where every sequence
  // samples (its only row), on one rank (execute's StepSampling).
  bool in_step = bucket > 0 && (graphs || pad_eager_) && tp_.world == 1 && be_.samples_in_step() &&
                 bucket <= rs_.max_logits_rows && static_cast<int>(step_seqs_.size()) == S;
  for (int i = 0; in_step && i < S; ++i) in_step = step_seqs_[i] == i;
  batch_.sample_rows.clear();
  batch_.sample_params.clear();
  sampled_in_step_ = false;
  if (bucket > 0 && (graphs || pad_eager_)) pad_batch(bucket);
  if (in_step) {
    for (int r = 0; r < bucket; ++r) batch_.sample_rows.push_back(r);
    batch_.sample_params = step_params_;
    batch_.sample_params.resize(bucket);  // padding rows: greedy (RowSampling{}); their ids are dropped
  }
  step_seqs_.clear();
  step_params_.clear();
  be_.begin_step(batch_);
  auto forward = [&] {
    fwd_.run(batch_, rs_);
    if (!in_step) return;
    Tensor l = rs_.logits.view(ScalarType::f32, bucket, cfg_.vocab_size);
    be_.sample_step(ForwardPass::hidden(rs_, cfg_, batch_.num_tokens), weights_.output, l);
  };
  if (in_step) {
    sampled_in_step_ = true;
    sampled_rows_ = S;
  }
  if (!graphs || pad_eager_) {
    forward();
    return;
  }
  if (be_.op_profile_due()) {  // FP8KV_PROFILE=step: one op-timed eager copy of this step (same values)
    be_.op_profile(true);
    fwd_.run(batch_, rs_);
    be_.op_profile(false);
  }
  if (be_.replay_graph(bucket)) {
    ++graph_replays_;
    return;
  }
  // First step of this bucket (or after the backend dropped its graphs): an
  // eager run computes the step and sizes every scratch buffer, then the same
  // ops are captured (not run: the capture only records) for the next steps.
  forward();
  be_.begin_graph_capture(bucket);
  try {
    forward();
  } catch (...) {
    be_.abort_graph_capture();
    throw;
  }
  be_.end_graph_capture(bucket);
  ++graph_captures_;
}

void ModelRunner::logits_to_host(std::span<const int32_t> rows, std::vector<float>& out) {
  const int V = cfg_.vocab_size;
  out.resize(rows.size() * static_cast<size_t>(V));
  const Tensor hidden = ForwardPass::hidden(rs_, cfg_, batch_.num_tokens);
  for (size_t r = 0; r < rows.size(); r += kLogitsRows) {
    const int m = static_cast<int>(std::min<size_t>(kLogitsRows, rows.size() - r));
    Tensor l = rs_.logits.view(ScalarType::f32, m, V);
    compute_logits(hidden, rows.subspan(r, m), l);
    if (tp_.rank == 0) be_.download(out.data() + r * V, l.data, l.bytes());
  }
}

void ModelRunner::sample(std::span<const int32_t> rows, std::span<const RowSampling> params, std::span<int32_t> ids) {
  if (sampled_in_step_) {
    // The step sampled its StepSampling (every sequence's last row: row i of
    // sequence i); TpRunner passes the same rows here, so only fetch the ids.
    sampled_in_step_ = false;
    if (static_cast<int>(rows.size()) != sampled_rows_ || ids.size() != rows.size())
      throw std::logic_error("ModelRunner::sample: rows differ from the step's StepSampling");
    be_.step_sampled_ids(ids);
    return;
  }
  const int V = cfg_.vocab_size;
  const Tensor hidden = ForwardPass::hidden(rs_, cfg_, batch_.num_tokens);
  const size_t chunk = static_cast<size_t>(rs_.max_logits_rows);
  for (size_t r = 0; r < rows.size(); r += chunk) {
    const int m = static_cast<int>(std::min<size_t>(chunk, rows.size() - r));
    Tensor l = rs_.logits.view(ScalarType::f32, m, V);
    compute_logits(hidden, rows.subspan(r, m), l);
    if (tp_.rank == 0) be_.sample(l, params.subspan(r, m), ids.subspan(r, m));
  }
}

}  // namespace fp8kv
