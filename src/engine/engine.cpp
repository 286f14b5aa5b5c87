#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "backend/backend.h"
#include "backend/startup_profile.h"
#include "engine/dummy_weights.h"
#include "engine/model_runner.h"
#include "engine/tp_runner.h"
#include "engine/tp_shard.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "io/checkpoint.h"
#include "io/errors.h"
#include "io/host_memory.h"
#include "kv/kv_cache_manager.h"
#include "kv/scale_loader.h"
#include "model/weights.h"

namespace fp8kv {

namespace {

std::shared_ptr<spdlog::logger> engine_log() {
  auto l = spdlog::get("fp8kv");
  if (!l) l = spdlog::stderr_color_mt("fp8kv");  // logs go to stderr, never stdout
  return l;
}

bool json_declares_fp8_kv(const std::filesystem::path& p, bool hf_quant) {
  std::ifstream in(p);
  if (!in) return false;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (hf_quant) {
    // ModelOpt: {"quantization": {"kv_cache_quant_algo": "FP8"}} (also seen at top level).
    for (const auto* o : {&j, j.contains("quantization") ? &j["quantization"] : nullptr}) {
      if (o && o->is_object() && o->contains("kv_cache_quant_algo") && (*o)["kv_cache_quant_algo"].is_string()) {
        std::string a = (*o)["kv_cache_quant_algo"].get<std::string>();
        std::transform(a.begin(), a.end(), a.begin(), ::toupper);
        if (a.rfind("FP8", 0) == 0) return true;
      }
    }
    return false;
  }
  if (!j.contains("quantization_config") || !j["quantization_config"].is_object()) return false;
  const auto& q = j["quantization_config"];
  return q.contains("kv_cache_scheme") && !q["kv_cache_scheme"].is_null();
}

uint64_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

KvDtype resolve_kv_cache_dtype(const KvCacheDtypeSetting& requested, const std::filesystem::path& model_dir) {
  if (requested.dtype) return *requested.dtype;
  const bool fp8 = json_declares_fp8_kv(model_dir / "config.json", false) ||
                   json_declares_fp8_kv(model_dir / "hf_quant_config.json", true);
  return fp8 ? KvDtype::fp8_e4m3 : KvDtype::bf16;
}

namespace {

std::shared_ptr<const ModelWeights> maybe_widen(std::shared_ptr<const ModelWeights> w);

// The engine: a Scheduler (admission, budget, preemption), a ModelRunner
// (StepBatch + forward pass) and a Backend (the ops and the memory).
class EngineImpl final : public Engine {
 public:
  // rank_weights given (tensor parallelism over a checkpoint): `w` is the
  // whole mapped model, kept for the non-finite diagnosis; each rank makes
  // its own shard with rank_weights.
  EngineImpl(ModelConfig cfg, std::shared_ptr<const ModelWeights> w, const EngineOptions& o, KvDtype dtype,
             RankWeightsFn rank_weights = {})
      : cfg_(std::move(cfg)), opts_(o), dtype_(dtype) {
    if (o.max_num_seqs < 1) throw InputError("max_num_seqs must be >= 1");
    if (o.max_num_batched_tokens < 1) throw InputError("max_num_batched_tokens must be >= 1");
    if (o.num_threads < 0) throw InputError("threads must be >= 0");
    if (o.gpu_memory_utilization != 0.0 && !(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0))
      throw InputError("gpu_memory_utilization must be in (0, 1]");
    BackendOptions bo;
    bo.num_threads = o.num_threads;
    bo.enforce_eager = o.enforce_eager;
    // One rank, or N ranks of one tensor-parallel group (engine/tp_runner.h):
    // weights and scratch first, so a device backend sizes the KV cache from what is left.
    // Kept for the non-finite diagnosis (step()) on the CPU, whose backend
    // reads these very matrices; a device backend's host copy is not held.
    weights_ = w;
    if (rank_weights) w.reset();
    // No weights: `--load-format dummy` with N > 1, each rank makes its own
    // shard (engine/tp_shard.h dummy_weights_shard; docs/tp.md).
    if (!w && !rank_weights)
      rank_weights = [c = cfg_, mode = o.fp8_weight_mode](const TpShard& t) {
        std::shared_ptr<ModelWeights> s = dummy_weights_shard(c, t);
        s->fp8_compute = mode;
        return maybe_widen(std::move(s));
      };
    StartupPhase ph_runner("backend + weights upload + activation buffers (all ranks)");
    runner_ = std::make_unique<TpRunner>(cfg_, std::move(w), o.backend, bo, o.tensor_parallel_size,
                                         o.max_num_batched_tokens, o.max_num_seqs,
                                         TpMultiProcess{o.nnodes, o.node_rank, o.master_addr, o.master_port,
                                                        o.collective_timeout_s},
                                         rank_weights);
    ph_runner.done();
    backend_ = &runner_->backend();  // rank 0's
    // A device backend holds its own copy: the host weights are let go (an
    // in-memory caller's stay reachable while the caller holds them, and
    // load() hands a re-open of the checkpoint: diagnosis_weights()).
    if (!backend_->uses_host_memory()) {
      caller_weights_ = weights_;
      weights_.reset();
    }
    if (o.gpu_memory_utilization > 0.0 && backend_->uses_host_memory())
      throw InputError("--gpu-memory-utilization applies to the cuda backend only (use --kv-memory on the CPU)");
    if (o.gpu_memory_utilization > 0.0 && o.kv_memory_bytes > 0)
      throw InputError("give --kv-memory or --gpu-memory-utilization, not both");

    runner_->set_pad_eager(o.pad_decode_eager);
    runner_->set_tp_graphs(o.tp_cuda_graphs);

    KvPlanSettings s;
    s.max_model_len = o.max_model_len;
    s.max_num_seqs = o.max_num_seqs;
    s.max_num_batched_tokens = o.max_num_batched_tokens;
    s.block_size = o.block_size;
    s.dtype = dtype_;
    s.tensor_parallel_size = o.tensor_parallel_size;  // per-rank bytes, total tokens
    s.prefix_caching = o.enable_prefix_caching;        // a state pool's snapshots share the budget
    s.state_snapshot_interval = o.state_snapshot_interval;
    s.conv_state_dtype = o.conv_state_dtype;  // the state pool's bytes (linear-attention models)
    s.ssm_state_dtype = o.ssm_state_dtype;
    const KvBudget budget = kv_budget(o, s);
    s.kv_memory_bytes = budget.kv_memory_bytes;
    s.budget_source = budget.source;
    StartupPhase ph_kv("KV plan + pool (all ranks)");
    plan_ = plan_kv_cache(cfg_, s);
    kv_ = std::make_unique<KvCacheManager>(cfg_, plan_);
    runner_->allocate_kv(plan_, kv_->layout());
    runner_->set_kv(*kv_);
    scales_ = KvScales::unity(cfg_.num_layers);
    runner_->set_kv_scales(scales_);
    SchedulerLimits lim;
    lim.max_num_seqs = o.max_num_seqs;
    lim.max_num_batched_tokens = o.max_num_batched_tokens;
    lim.max_model_len = plan_.max_model_len;
    sched_ = std::make_unique<Scheduler>(*kv_, lim, cfg_.eos_token_ids);
    kv_->set_prefix_caching(prefix_caching_on(o.enable_prefix_caching));
    if (o.enable_prefix_caching && !plan_.prefix_caching_off_reason.empty())
      engine_log()->info("prefix caching is off for {}: {}; every prompt is prefilled in full", cfg_.architecture,
                         plan_.prefix_caching_off_reason);
    ph_kv.done();
    engine_log()->info("{}", kv_plan_log_line(plan_));
  }

  // Prefix caching needs every layer's state at a block boundary: models
  // with a state pool (linear_attention layers) have it where the plan has
  // state snapshots (docs/design.md "Prefix snapshots of the linear-attention
  // state"), else it stays off (the plan says why).
  bool prefix_caching_on(bool requested) const {
    return requested && (plan_.state.empty() || plan_.state.snapshots());
  }

  // --kv-memory when given; on a GPU, --gpu-memory-utilization (vLLM's
  // meaning: that fraction of total memory, minus what the weights and the
  // preallocated activations already use); on the CPU, default_kv_budget.
  // The arithmetic is kv/planner's, shared with `fp8kv capacity` (docs/capacity.md).
  KvBudget kv_budget(const EngineOptions& o, const KvPlanSettings& s) const {
    if (o.kv_memory_bytes > 0) return KvBudget{o.kv_memory_bytes};
    if (backend_->uses_host_memory()) {
      const HostMemoryLimit m = host_memory_limit();
      return default_cpu_kv_budget(cfg_, s, m.bytes, m.what);
    }
    const MemoryInfo m = backend_->memory_info();
    GpuMemoryInputs in;
    in.gpu_memory_bytes = m.total_bytes;
    in.gpu_memory_what = "the GPU's memory";
    in.utilization = o.gpu_memory_utilization > 0 ? o.gpu_memory_utilization : kDefaultGpuMemoryUtilization;
    // Measured: weights and the preallocated activations are already in use.
    in.weights_bytes_per_rank = m.total_bytes - std::min(m.free_bytes, m.total_bytes);
    in.weights_source = "measured: weights + activations in use";
    KvBudget b = kv_budget_from_gpu(in, cfg_);
    // The budget in bytes, so that `fp8kv capacity --kv-memory <bytes>` with
    // the same settings can be checked against the KV cache line that follows.
    engine_log()->info("KV budget: {} bytes (--gpu-memory-utilization {} of {} total, {} in use by weights and "
                       "activations)",
                       b.kv_memory_bytes, in.utilization, format_bytes(m.total_bytes),
                       format_bytes(in.weights_bytes_per_rank));
    return b;
  }

  const ModelConfig& config() const override { return cfg_; }
  KvDtype kv_dtype() const override { return dtype_; }
  const KvPlan& kv_plan() const override { return plan_; }
  int max_model_len() const override { return plan_.max_model_len; }
  std::string_view backend_name() const override { return backend_->name(); }
  int64_t graph_replays() const override { return runner_->graph_replays(); }
  int64_t graph_captures() const override { return runner_->graph_captures(); }
  // Startup: the decode CUDA graphs of every bucket, captured before the
  // first request (ModelRunner::warm_up_graphs), after the KV scales are set
  // (setting them drops every graph).
  void warm_up() {
    if (!backend_->supports_graphs()) return;
    StartupPhase ph("CUDA graphs (max prefill + every decode bucket)");
    const int n = runner_->warm_up_graphs();
    ph.set_detail(fmt::format(", {} decode graphs", n));
    ph.done();
    if (n > 0) engine_log()->info("CUDA graphs: captured {} decode buckets in {:.2f} s", n, ph.seconds());
  }

  void set_kv_scales(KvScales s) override {
    // The shared validator (kv/scale_loader.h): the same rule and wording as at load.
    validate_kv_scales(s, kv_scale_shape(cfg_));
    scales_ = std::move(s);
    runner_->set_kv_scales(scales_);
    kv_->reset_prefix_cache();  // cached K/V were stored with the old scales
  }
  const KvScales& kv_scales() const override { return scales_; }
  // A multi-process follower's whole life after construction (engine/tp_runner.h).
  void follow() { runner_->follow(); }
  // How a device-backend engine gets host weights back for the non-finite
  // diagnosis: load() re-opens the checkpoint (mapped views; only after a
  // failure).
  void set_weights_reload(std::function<std::shared_ptr<const ModelWeights>()> f) { reload_weights_ = std::move(f); }
  void set_store_observer(StoreObserver* o) override {
    runner_->set_store_observer(o);
    kv_->set_prefix_caching(prefix_caching_on(opts_.enable_prefix_caching) && o == nullptr);  // the observer sees every token
  }
  int64_t free_kv_blocks() const override { return kv_->num_free_blocks(); }
  int64_t num_preemptions() const override { return sched_->num_preemptions(); }
  std::optional<std::vector<KvClipCounts>> kv_clip_counts() const override { return runner_->kv_clip_counts(); }
  PrefixCacheStats prefix_cache_stats() const override {
    return {sched_->prefix_cache_queries(), sched_->prefix_cache_hits(), sched_->num_computed_tokens(),
            kv_->num_cached_blocks()};
  }

  // ---- validation ----
  void check_tokens(std::span<const int> t, const char* what) const {
    if (t.empty()) throw InputError(fmt::format("{}: empty token sequence", what));
    if (static_cast<int>(t.size()) > plan_.max_model_len)
      throw InputError(fmt::format("{}: {} tokens exceed max_model_len {}", what, t.size(), plan_.max_model_len));
    for (size_t i = 0; i < t.size(); ++i)
      if (t[i] < 0 || t[i] >= cfg_.vocab_size)
        throw InputError(fmt::format("{}: token id {} at index {} is outside the vocabulary [0, {})", what, t[i], i,
                                     cfg_.vocab_size));
  }
  int chunk_for(int requested) const {
    if (requested < 0) throw InputError("chunk size must be >= 0");
    return requested == 0 ? opts_.max_num_batched_tokens : std::min(requested, opts_.max_num_batched_tokens);
  }

  // ---- scoring ----
  ScoreResult score(std::span<const int> tokens, const ScoreOptions& o, const LogitsCallback& cb) override {
    std::vector<std::vector<int>> one{std::vector<int>(tokens.begin(), tokens.end())};
    BatchLogitsCallback bcb;
    if (cb) bcb = [&](int, int pos, std::span<const float> l) { cb(pos, l); };
    return std::move(score_batch(one, o, bcb)[0]);
  }

  std::vector<ScoreResult> score_batch(std::span<const std::vector<int>> seqs, const ScoreOptions& o,
                                       const BatchLogitsCallback& cb) override {
    if (!idle()) throw std::logic_error("score_batch while generation requests are running");
    for (const auto& s : seqs) check_tokens(s, "score");
    const int chunk = chunk_for(o.chunk_size);
    std::vector<ScoreResult> results(seqs.size());
    score_cb_ = &cb;
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto r = std::make_unique<SchedRequest>();
      r->id = next_id_++;
      r->scoring = true;
      r->tokens = seqs[i];
      r->num_prompt = static_cast<int>(r->tokens.size());
      r->chunk = chunk;
      r->score_index = static_cast<int>(i);
      r->result = &results[i];
      r->result->token_ids = r->tokens;
      r->result->logprobs.assign(r->tokens.size(), std::nullopt);
      r->result->top1_ids.assign(r->tokens.size(), std::nullopt);
      sched_->add(std::move(r));
    }
    try {
      while (!idle()) step();
    } catch (...) {
      sched_->abort_all();
      score_cb_ = nullptr;
      throw;
    }
    score_cb_ = nullptr;
    return results;
  }

  // ---- generation ----
  GenerateResult generate(std::span<const int> prompt, const GenerateOptions& o, const TokenCallback& cb) override {
    if (!idle()) throw std::logic_error("generate while other requests are running");
    const auto t0 = std::chrono::steady_clock::now();
    const RequestId id = submit(Request{std::vector<int>(prompt.begin(), prompt.end()), o});
    GenerateResult r;
    r.prompt_tokens = static_cast<int>(prompt.size());
    std::optional<std::chrono::steady_clock::time_point> first;
    try {
      while (!idle()) {
        for (const auto& ev : step()) {
          if (ev.id != id) continue;
          if (!first) first = std::chrono::steady_clock::now();
          if (ev.token >= 0) {
            r.tokens.push_back(ev.token);
            if (cb && !cb(ev.token) && !ev.finished) cancel(id);
          }
          if (ev.finished) r.finish = *ev.finished;
        }
      }
    } catch (...) {
      sched_->abort_all();
      throw;
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (first) {
      r.prefill_seconds = std::chrono::duration<double>(*first - t0).count();
      r.decode_seconds = std::chrono::duration<double>(t1 - *first).count();
    }
    return r;
  }

  RequestId submit(Request req) override {
    check_tokens(req.prompt, "prompt");
    if (static_cast<int>(req.prompt.size()) >= plan_.max_model_len)
      throw InputError(fmt::format("prompt: {} tokens leave no room to generate within max_model_len {}",
                                   req.prompt.size(), plan_.max_model_len));
    if (req.options.max_tokens < 1) throw InputError("max_tokens must be >= 1");
    auto r = std::make_unique<SchedRequest>();
    r->id = next_id_++;
    r->tokens = std::move(req.prompt);
    r->num_prompt = static_cast<int>(r->tokens.size());
    r->chunk = chunk_for(req.options.chunk_size);
    r->gen = std::move(req.options);
    r->sampler.emplace(r->gen.sampling);
    const RequestId id = r->id;
    sched_->add(std::move(r));
    return id;
  }

  void cancel(RequestId id) override { sched_->cancel(id); }
  bool idle() const override { return sched_->idle(); }
  int num_running() const override { return sched_->num_running(); }
  int num_waiting() const override { return sched_->num_waiting(); }

  // Non-finite logits or logprobs: name the first weight tensor (hence
  // layer) holding NaN/inf, found by a scan done only now (issue 15 item 6).
  // A damaged checkpoint is the input's fault: exit 2 naming the tensor.
  std::vector<StepEvent> step() override {
    try {
      return step_impl();
    } catch (const InputError&) {
      throw;
    } catch (const std::runtime_error& e) {
      if (std::string_view(e.what()).find("non-finite") == std::string_view::npos) throw;
      const std::shared_ptr<const ModelWeights> w = diagnosis_weights();
      if (const std::optional<std::string>& bad = first_bad_weight())
        throw InputError(fmt::format("{}: {} (the first non-finite weight in forward order: that layer's output is "
                                     "where the values go non-finite; `fp8kv inspect --check-values` lists such "
                                     "tensors)",
                                     e.what(), *bad));
      if (overflow_stage_ != kNotDiagnosed) throw InputError(overflow_message(e.what(), overflow_stage_, w.get()));
      if (!w) throw;
      throw std::runtime_error(fmt::format("{} (every weight is finite: the activations overflowed)", e.what()));
    }
  }

  std::vector<StepEvent> step_impl() {
    SchedulerOutput out = sched_->schedule();
    std::vector<StepEvent> events = std::move(out.events);
    if (out.seqs.empty()) {
      if (!sched_->idle())
        throw InputError(fmt::format("KV cache too small: no request can proceed ({} free blocks); raise "
                                     "--kv-memory or lower --max-model-len",
                                     kv_->num_free_blocks()));
      return events;
    }
    // The step's sampling, built once: the last row of every generating
    // sequence, with its request's parameters (a device backend's stream) and
    // seeded host stream (a host-memory backend's; engine/sampler.h).
    StepSampling sampling;
    for (size_t i = 0; i < out.seqs.size(); ++i) {
      if (!out.seqs[i].samples) continue;
      SchedRequest& r = *out.seqs[i].req;
      sampling.seqs.push_back(static_cast<int>(i));
      sampling.params.push_back(RowSampling{r.gen.sampling.temperature, r.gen.sampling.top_p, r.gen.sampling.top_k,
                                            r.gen.sampling.seed, static_cast<uint64_t>(r.generated)});
      sampling.host.push_back(&*r.sampler);
      sampling.want_logits |= r.gen.logprobs >= 0;
    }
    overflow_stage_ = kNotDiagnosed;
    StepOutput res;
    try {
      res = runner_->execute(out, sampling);
      warn_kv_clipping();
      // Scoring rows (every row, in order, skipping rows a preempted request
      // already reported).
      for (size_t i = 0; i < out.seqs.size(); ++i) {
        const ScheduledSeq& s = out.seqs[i];
        if (s.req->scoring) score_rows(*s.req, runner_->first_row(static_cast<int>(i)), s.start, s.num_tokens);
      }
    } catch (const std::runtime_error& e) {
      if (std::string_view(e.what()).find("non-finite") != std::string_view::npos) diagnose_overflow(out, sampling);
      throw;
    }
    std::vector<int> sampled(out.seqs.size(), -1);
    // Per-token logprobs (the server asks for them): from the raw distribution
    // of the row that was sampled, only for requests that ask.
    std::vector<std::pair<RequestId, int>> want_lp;  // (request, row j in res.logits)
    std::vector<int> want_top;
    for (size_t j = 0; j < sampling.seqs.size(); ++j) {
      const SchedRequest& r = *out.seqs[static_cast<size_t>(sampling.seqs[j])].req;
      sampled[static_cast<size_t>(sampling.seqs[j])] = res.ids[j];
      if (r.gen.logprobs >= 0) {
        want_lp.emplace_back(r.id, static_cast<int>(j));
        want_top.push_back(r.gen.logprobs);
      }
    }
    for (const auto& ev : sched_->update(out, sampled)) {
      events.push_back(ev);
      if (ev.token < 0) continue;
      for (size_t k = 0; k < want_lp.size(); ++k)
        if (want_lp[k].first == ev.id) {
          const size_t V = static_cast<size_t>(cfg_.vocab_size);
          add_logprobs(events.back(),
                       std::span<const float>(res.logits.data() + static_cast<size_t>(want_lp[k].second) * V, V),
                       want_top[k]);
        }
    }
    return events;
  }

 private:
  void score_rows(SchedRequest& r, int row0, int start, int n) {
    const int V = cfg_.vocab_size;
    const int skip = std::clamp(r.rows_reported - start, 0, n);  // rows reported before a preemption
    if (skip == n) return;
    std::vector<int32_t> rows(static_cast<size_t>(n - skip));
    for (int i = skip; i < n; ++i) rows[i - skip] = row0 + i;
    for (size_t c = 0; c < rows.size(); c += ModelRunner::kLogitsRows) {
      const size_t m = std::min<size_t>(ModelRunner::kLogitsRows, rows.size() - c);
      runner_->logits_to_host(std::span<const int32_t>(rows).subspan(c, m), logits_);
      for (size_t i = 0; i < m; ++i) {
        const int pos = start + skip + static_cast<int>(c + i);
        std::span<const float> row(logits_.data() + i * static_cast<size_t>(V), V);
        const int top = argmax_lowest(row);
        if (pos + 1 < static_cast<int>(r.tokens.size())) {
          const double lp = log_softmax_at(row, r.tokens[pos + 1]);
          if (!std::isfinite(lp)) throw std::runtime_error(fmt::format("non-finite logprob at position {}", pos + 1));
          r.result->logprobs[pos + 1] = lp;
          r.result->top1_ids[pos + 1] = top;
        }
        if (score_cb_ && *score_cb_) (*score_cb_)(r.score_index, pos, row);
        r.rows_reported = pos + 1;
      }
    }
  }

  // Non-finite logits with every weight finite (step() names a NaN/inf
  // weight first): the step is run again, eagerly (no CUDA graph), with the
  // forward pass checking the residual stream after every stage
  // (ForwardPass::set_check_stages: a download per stage, so a device
  // backend's stages are checked too), and the first stage that held NaN/inf
  // is kept for step()'s message. Only after a failure, so ordinary steps
  // pay nothing; the re-run's KV writes are those of the failed step (the
  // engine stops here anyway). Without host weights (dummy weights on a
  // device) the stage is still named, without its largest weight.
  void diagnose_overflow(const SchedulerOutput& out, const StepSampling& sampling) {
    if (first_bad_weight()) return;  // a NaN/inf weight to name
    ModelRunner& r0 = runner_->runner(0);
    r0.set_check_stages(true);
    try {
      runner_->execute(out, sampling);
    } catch (const std::exception&) {  // the same failure again: only the record matters
    }
    overflow_stage_ = r0.first_nonfinite_stage();
    r0.set_check_stages(false);
  }

  // The host weights the non-finite diagnosis reads: the CPU backend's own,
  // an in-memory caller's while it still holds them, or the checkpoint
  // re-opened once (set_weights_reload); null when there are none (dummy
  // weights made for a device) or the checkpoint cannot be read again.
  std::shared_ptr<const ModelWeights> diagnosis_weights() {
    if (weights_) return weights_;
    if (auto w = caller_weights_.lock()) return w;
    if (!reloaded_ && reload_weights_) {
      reloaded_ = true;
      try {
        reload_ = reload_weights_();
      } catch (const std::exception& e) {
        engine_log()->warn("the non-finite diagnosis could not re-open the checkpoint: {}", e.what());
      }
    }
    return reload_;
  }

  // diagnosis_weights()' first NaN/inf weight in forward order (a full
  // scan, done once), or nullopt.
  const std::optional<std::string>& first_bad_weight() {
    if (!bad_weight_scanned_) {
      if (const std::shared_ptr<const ModelWeights> w = diagnosis_weights()) {
        bad_weight_ = w->first_non_finite();
        bad_weight_scanned_ = true;
      }
    }
    return bad_weight_;
  }

  std::string overflow_message(const std::string& what, int stage, const ModelWeights* w) const {
    const int L = cfg_.num_layers;
    const std::string largest =
        w ? fmt::format("; its largest weight: {}", w->largest_value(stage == ForwardPass::kNoStage ? L + 1 : stage))
          : "";
    std::string where;
    if (stage == ForwardPass::kStageEmbedding)
      where = fmt::format("every weight is finite, but the embedding's output{} overflowed float32",
                          weights_->embed_scale != 1.0f ? " (x the embedding scale)" : "");
    else if (stage >= 0 && stage < L)
      where = fmt::format("every weight is finite, but layer {}'s output overflowed float32 (the first layer whose "
                          "output holds NaN or inf)",
                          stage);
    else if (stage == L)
      where = "every weight and every layer's output is finite, but the final norm's output overflowed float32";
    else
      where = "every weight and the final norm's output are finite, but the output projection overflowed float32";
    return fmt::format("{}: {}{}. The checkpoint's values are out of range: fix or re-export it", what, where,
                       largest);
  }

  static void add_logprobs(StepEvent& ev, std::span<const float> row, int top) {
    double m = -INFINITY;
    for (float x : row) m = std::max(m, static_cast<double>(x));
    double sum = 0.0;
    for (float x : row) sum += std::exp(static_cast<double>(x) - m);
    const double lse = m + std::log(sum);
    ev.logprob = static_cast<float>(row[ev.token] - lse);
    const int V = static_cast<int>(row.size());
    top = std::min(top, V);
    if (top == 0) return;
    std::vector<int> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + top, idx.end(),
                      [&](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int i = 0; i < top; ++i) ev.top_logprobs.push_back({idx[i], static_cast<float>(row[idx[i]] - lse)});
  }

  ModelConfig cfg_;
  EngineOptions opts_;
  KvDtype dtype_;
  Backend* backend_ = nullptr;  // rank 0's (owned by runner_)
  KvPlan plan_;
  std::unique_ptr<KvCacheManager> kv_;
  KvScales scales_;
  std::shared_ptr<const ModelWeights> weights_;  // CPU only: the non-finite diagnosis reads them
  std::weak_ptr<const ModelWeights> caller_weights_;  // a device backend's in-memory weights (create())
  std::function<std::shared_ptr<const ModelWeights>()> reload_weights_;  // load(): re-open the checkpoint
  std::shared_ptr<const ModelWeights> reload_;
  bool reloaded_ = false;
  std::optional<std::string> bad_weight_;
  bool bad_weight_scanned_ = false;
  // One warning per layer and stream, the first time more than 0.1% of the
  // elements it stored so far saturated (only the per-tensor-scaled fp8
  // dtypes can clip: backend/cpu/kv_ops.h). No load-time check can know
  // K/V's range, so the store counts (issue 37; docs/robustness.md "KV clipping").
  // Checked after each of the first 16 steps, then every 64th: a device
  // backend reads its counters with a synchronous copy.
  void warn_kv_clipping() {
    if (!kv_dtype_per_tensor_scaled(dtype_) || clips_not_counted_) return;
    const uint64_t step = clip_checks_++;
    if (step >= 16 && step % 64 != 0) return;
    const std::optional<std::vector<KvClipCounts>> c = runner_->kv_clip_counts();
    if (!c) {
      clips_not_counted_ = true;  // not counted: nothing to check, ever
      return;
    }
    clip_warned_.resize(c->size() * 2, false);
    for (size_t l = 0; l < c->size(); ++l) {
      const KvClipCounts& n = (*c)[l];
      for (int st = 0; st < 2; ++st) {
        const uint64_t clipped = st == 0 ? n.k : n.v;
        if (clip_warned_[l * 2 + st] || clipped == 0 || clipped * 1000 <= n.stored) continue;
        clip_warned_[l * 2 + st] = true;
        const char* name = st == 0 ? "k" : "v";
        const StreamScale& sc = st == 0 ? scales_.layers.at(l).k : scales_.layers.at(l).v;
        const float smin = *std::min_element(sc.values.begin(), sc.values.end());
        const std::string scale = sc.values.size() > 1
                                      ? fmt::format("its smallest per-head {}_scale is {:g}", name, smin)
                                      : fmt::format("{}_scale {:g}", name, smin);
        const char* stream = st == 0 ? "K" : "V";
        engine_log()->warn(
            "layer {}: {} of {} {} values stored so far ({:.3g}%) clipped, |x / {}_scale| beyond {}'s max {:g} ({}): "
            "the scale is too small for this model's {} (recalibrate with fp8kv calibrate; /metrics counts them as "
            "fp8kv:kv_cache_clipped_total)",
            l, clipped, n.stored, stream, 100.0 * static_cast<double>(clipped) / static_cast<double>(n.stored), name,
            kv_dtype_name(dtype_), kv_dtype_elem_max(dtype_), scale, stream);
      }
    }
  }
  std::vector<bool> clip_warned_;  // [layer][k|v]
  bool clips_not_counted_ = false;
  uint64_t clip_checks_ = 0;  // steps since load (warn_kv_clipping)

  // The stage diagnose_overflow found (ForwardPass::first_nonfinite_stage),
  // or kNotDiagnosed.
  static constexpr int kNotDiagnosed = -100;
  int overflow_stage_ = kNotDiagnosed;
  std::unique_ptr<TpRunner> runner_;  // every rank's Backend + ModelRunner
  std::unique_ptr<Scheduler> sched_;
  RequestId next_id_ = 1;
  std::vector<float> logits_;
  const BatchLogitsCallback* score_cb_ = nullptr;
};

}  // namespace

namespace {
// bf16 matrices are widened to fp32 once when that fits comfortably (at most
// a quarter of the machine's memory): decode then skips the per-use
// conversion. Larger models keep bf16 and convert tile by tile. The values
// are identical either way (bf16 -> fp32 is exact).
std::shared_ptr<const ModelWeights> maybe_widen(std::shared_ptr<const ModelWeights> w) {
  size_t bf16_bytes = 0;
  auto count = [&](const WeightMatrix& m) { bf16_bytes += m.bf16 ? m.bytes() : 0; };
  count(w->embed);
  if (w->lm_head) count(*w->lm_head);
  for (const auto& L : w->layers)
    for (const WeightMatrix* m : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj})
      count(*m);
  if (bf16_bytes == 0 || 2 * bf16_bytes > physical_memory() / 4) return w;
  return w->widened_to_f32();
}

// The log line that says which fp8 compute mode runs. W8A8 runs on both
// backends (docs/design.md "FP8-weight checkpoints"); on CUDA its decode
// rows keep the fp8 GEMV (W8A16 numerics) and it needs compute capability
// 9.0, checked at weight upload (CudaBackend::upload_weights, which also
// logs the matrices that run W8A16 there).
void log_fp8_weights(const WeightQuantConfig& q, Fp8Compute mode, bool cpu) {
  engine_log()->info(
      "fp8 weights: {}; running {}", q.describe(),
      mode == Fp8Compute::w8a8
          ? fmt::format("W8A8 (--fp8-weight-mode w8a8: activations quantized dynamically to e4m3 per {}, "
                        "saturating{})",
                        q.granularity == ScaleGranularity::block128 ? "1x128 group" : "token",
                        cpu ? "" : "; cuBLASLt FP8 GEMMs past the decode rows, which run the fp8 GEMV as W8A16")
          : std::string("W8A16 (--fp8-weight-mode w8a16: weights dequantized in the GEMM, fp32 "
                        "activations)"));
}
}  // namespace

namespace {
// Before any weight is read or made: a tensor-parallel size that does not
// fit the model (heads, ffn, Gated DeltaNet heads; engine/tp_shard.h) fails
// at once, naming the fields.
void check_tensor_parallel_early(const ModelConfig& cfg, int tp) {
  if (tp != 1) check_tensor_parallel(cfg, tp);
}
}  // namespace

std::unique_ptr<Engine> Engine::create(ModelConfig cfg, std::shared_ptr<const ModelWeights> weights,
                                       const EngineOptions& opts) {
  const KvDtype d = opts.kv_cache_dtype.dtype.value_or(KvDtype::bf16);
  const bool cpu = resolve_backend(opts.backend) == BackendKind::cpu;
  check_tensor_parallel_early(cfg, opts.tensor_parallel_size);
  if (weights && weights->has_fp8() && opts.tensor_parallel_size > 1)
    check_fp8_block_shards(*weights, cfg, opts.tensor_parallel_size);
  auto e = std::make_unique<EngineImpl>(std::move(cfg), cpu ? maybe_widen(std::move(weights)) : std::move(weights),
                                        opts, d);
  if (opts.nnodes > 1 && opts.node_rank > 0) {
    e->follow();  // a multi-process follower, as in load
    return nullptr;
  }
  return e;
}

namespace {
std::unique_ptr<Engine> load_engine(const std::filesystem::path& dir, const EngineOptions& opts);
}  // namespace

std::unique_ptr<Engine> Engine::load(const std::filesystem::path& dir, const EngineOptions& opts) {
  // Before the weights load: a bad rank / world combination fails at once.
  check_multi_process(TpMultiProcess{opts.nnodes, opts.node_rank, opts.master_addr, opts.master_port,
                                     opts.collective_timeout_s},
                      opts.tensor_parallel_size);
  auto e = load_engine(dir, opts);
  static_cast<EngineImpl&>(*e).warm_up();
  if (opts.nnodes > 1 && opts.node_rank > 0) {
    // A follower process: serve rank 0's steps until rank 0's engine is
    // destroyed; the command's own work belongs to rank 0. Errors propagate.
    static_cast<EngineImpl&>(*e).follow();
    return nullptr;
  }
  return e;
}

namespace {
std::unique_ptr<Engine> load_engine(const std::filesystem::path& dir, const EngineOptions& opts) {
  ModelConfig cfg = load_model_config(dir);
  const KvDtype d = resolve_kv_cache_dtype(opts.kv_cache_dtype, dir);
  // Before weights are read or made (tens of GB for --load-format dummy).
  // Only the CPU backend widens bf16 matrices to fp32 (maybe_widen): a device
  // backend uploads bf16, so widening would only cost host time and memory
  // (an 8B model: 32 GB written, then converted back at upload).
  const bool cpu = require_backend(opts.backend) == BackendKind::cpu;
  check_tensor_parallel_early(cfg, opts.tensor_parallel_size);
  const WeightQuantConfig& quant = cfg.weight_quant;
  if (quant.quantized()) log_fp8_weights(quant, opts.fp8_weight_mode, cpu);
  auto widen = [&](std::shared_ptr<const ModelWeights> w) {
    if (!cpu) return w;
    StartupPhase ph("widen bf16 -> fp32 (cpu backend)");
    return maybe_widen(std::move(w));
  };
  if (opts.load_format == LoadFormat::dummy) {
    // Random weights from config.json alone (no safetensors read); unity KV scales.
    engine_log()->info("--load-format dummy: random weights (N(0, 0.02), norms 1{}) for {}",
                       cfg.gdn ? "; Gated DeltaNet: conv1d N(0, 0.02), A = exp(A_log) uniform in [1, 16), dt_bias 1"
                               : "",
                       dir.string());
    if (opts.tensor_parallel_size > 1) {
      check_fp8_block_shards(cfg, opts.tensor_parallel_size);  // before any rank makes its shard
      return std::make_unique<EngineImpl>(cfg, nullptr, opts, d);  // per rank
    }
    // A device backend generates the matrices on the device (the same
    // generator, docs/cuda_backend.md "Startup": 0.2 s instead of 11.5 s on
    // the host for the 8B shape, 5 of 16.8M elements one bf16 ulp off the
    // host generator); the CPU backend (and TP > 1 ranks) make them here.
    const bool on_device = !cpu;
    std::shared_ptr<ModelWeights> w;
    {
      StartupPhase ph(on_device ? "dummy weights (descriptors; made on the device at upload)" : "dummy weights (host)");
      w = dummy_weights(cfg, 0, 0.02f, on_device);  // fp8 with scales where the config quantizes
    }
    w->fp8_compute = opts.fp8_weight_mode;
    return std::make_unique<EngineImpl>(cfg, widen(std::move(w)), opts, d);
  }
  std::shared_ptr<const Checkpoint> ckpt = Checkpoint::open(dir);
  std::shared_ptr<ModelWeights> w;
  {
    StartupPhase ph("checkpoint weights (host)");
    w = ModelWeights::load(ckpt, cfg);
  }
  w->fp8_compute = opts.fp8_weight_mode;
  // KV scales from the checkpoint (validated; one coverage warning for fp8): kv/scale_loader.h.
  const KvScaleShape kv_shape = kv_scale_shape(cfg);
  KvScales scales = load_kv_scales_for_run(*ckpt, kv_shape, d);
  if (kv_dtype_per_tensor_scaled(d)) {
    // What the fp8 cache runs with, among the layers that have a KV cache
    // (a linear_attention layer has none: docs/design.md "KV scales of hybrid models").
    const KvScaleCoverage cov = kv_scale_coverage(scales, kv_shape);
    const int linear = cfg.num_layers - kv_shape.num_kv_layers();
    engine_log()->info("KV scales from the checkpoint: k {}/{}, v {}/{}, q {}/{} KV-cache layers{}{}", cov.k_present(),
                       cov.quantized_layers, cov.v_present(), cov.quantized_layers, cov.q_present(),
                       cov.quantized_layers, linear ? fmt::format(" ({} linear_attention layers: no KV cache)", linear) : "",
                       cov.k_present() + cov.v_present() < 2 * cov.quantized_layers ? "; a k or v stream without one runs at 1.0" : "");
  }
  std::unique_ptr<EngineImpl> engine;
  if (opts.tensor_parallel_size > 1) {
    check_fp8_block_shards(*w, cfg, opts.tensor_parallel_size);  // the mapped matrices: no weight read yet
    // Per-rank loading (docs/tp.md): each rank cuts its shard from the mapped
    // checkpoint (row slices are views) and widens only that on the CPU, so a
    // process never holds the whole model widened (nor a TP 2 process the
    // other rank's half).
    std::shared_ptr<const ModelWeights> full = std::move(w);
    RankWeightsFn per_rank = [full, c = cfg, cpu](const TpShard& t) {
      auto s = shard_weights(full, c, TpShard{t.rank, t.world});
      return cpu ? maybe_widen(std::move(s)) : s;
    };
    engine = std::make_unique<EngineImpl>(std::move(cfg), full, opts, d, std::move(per_rank));
  } else {
    engine = std::make_unique<EngineImpl>(std::move(cfg), widen(std::move(w)), opts, d);
  }
  engine->set_kv_scales(std::move(scales));
  if (!cpu)
    engine->set_weights_reload([dir, cfg = load_model_config(dir)] {
      std::shared_ptr<ModelWeights> w = ModelWeights::load(Checkpoint::open(dir), cfg);
      return std::shared_ptr<const ModelWeights>(std::move(w));
    });
  return engine;
}

}  // namespace

}  // namespace fp8kv
