#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <fstream>
#include <map>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "engine/forward.h"
#include "engine/sampler.h"
#include "io/checkpoint.h"
#include "io/errors.h"
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

KvDtype resolve_kv_cache_dtype(std::string_view requested, const std::filesystem::path& model_dir) {
  if (requested != "auto") {
    try {
      return parse_kv_dtype(requested);
    } catch (const std::invalid_argument& e) {
      throw InputError(fmt::format("--kv-cache-dtype: {} (or auto)", e.what()));
    }
  }
  const bool fp8 = json_declares_fp8_kv(model_dir / "config.json", false) ||
                   json_declares_fp8_kv(model_dir / "hf_quant_config.json", true);
  return fp8 ? KvDtype::fp8_e4m3 : KvDtype::bf16;
}

namespace {

struct SeqState {
  RequestId id = 0;
  bool scoring = false;
  int kv = -1;
  std::vector<int> tokens;
  int num_prompt = 0;
  int num_computed = 0;
  int chunk = 0;
  // generation
  GenerateOptions gen;
  std::optional<Sampler> sampler;
  int generated = 0;
  bool cancelled = false;
  // scoring
  int score_index = -1;
  ScoreResult* result = nullptr;
};

class CpuEngine final : public Engine {
 public:
  CpuEngine(ModelConfig cfg, std::shared_ptr<const ModelWeights> w, const EngineOptions& o, KvDtype dtype)
      : cfg_(std::move(cfg)), opts_(o), dtype_(dtype), fwd_(cfg_, w) {
    if (o.backend == "cuda") {
#ifdef FP8KV_HAVE_CUDA
      throw InputError("--backend cuda: the CUDA engine path is not available yet; use --backend cpu");
#else
      throw InputError("--backend cuda: this build has no CUDA backend (configure with -DFP8KV_CUDA=ON); use --backend cpu");
#endif
    }
    if (o.backend != "auto" && o.backend != "cpu") throw InputError("--backend must be auto, cpu or cuda");
    if (o.max_num_seqs < 1) throw InputError("max_num_seqs must be >= 1");
    if (o.max_num_batched_tokens < 1) throw InputError("max_num_batched_tokens must be >= 1");
    set_cpu_threads(o.num_threads);

    KvPlanSettings s;
    s.max_model_len = o.max_model_len;
    s.max_num_seqs = o.max_num_seqs;
    s.max_num_batched_tokens = o.max_num_batched_tokens;
    s.block_size = o.block_size;
    s.dtype = dtype_;
    if (o.kv_memory_bytes > 0) {
      s.kv_memory_bytes = o.kv_memory_bytes;
    } else {
      // Default: room for max_num_seqs full-length requests, capped at a quarter
      // of the machine (but always one full request).
      const uint64_t one = kv_memory_needed(cfg_, s);
      uint64_t want = one * static_cast<uint64_t>(o.max_num_seqs);
      const uint64_t cap = physical_memory() / 4;
      if (cap > 0) want = std::min(want, std::max(one, cap));
      s.kv_memory_bytes = want;
    }
    plan_ = plan_kv_cache(cfg_, s);
    kv_ = std::make_unique<KvCacheManager>(cfg_, plan_);
    scales_ = KvScales::unity(cfg_.num_layers);
    engine_log()->info("{}", kv_plan_log_line(plan_));
  }

  const ModelConfig& config() const override { return cfg_; }
  KvDtype kv_dtype() const override { return dtype_; }
  const KvPlan& kv_plan() const override { return plan_; }
  int max_model_len() const override { return plan_.max_model_len; }

  void set_kv_scales(KvScales s) override {
    if (static_cast<int>(s.layers.size()) != cfg_.num_layers)
      throw InputError(fmt::format("KV scales: {} layers, the model has {}", s.layers.size(), cfg_.num_layers));
    for (int l = 0; l < cfg_.num_layers; ++l) {
      auto check = [&](const StreamScale& sc, const char* what, int heads) {
        const size_t n = sc.values.size();
        if (n != 1 && n != static_cast<size_t>(heads))
          throw InputError(fmt::format("KV scales: layer {} {}_scale has {} values, expected 1 or {}", l, what, n, heads));
        for (float v : sc.values)
          if (!(std::isfinite(v) && v > 0.0f))
            throw InputError(fmt::format("KV scales: layer {} {}_scale = {} (must be finite and > 0)", l, what, v));
      };
      check(s.layers[l].k, "k", cfg_.num_kv_heads);
      check(s.layers[l].v, "v", cfg_.num_kv_heads);
      check(s.layers[l].q, "q", cfg_.num_heads);
    }
    scales_ = std::move(s);
  }
  const KvScales& kv_scales() const override { return scales_; }
  void set_store_observer(StoreObserver* o) override { observer_ = o; }
  int64_t free_kv_blocks() const override { return kv_->num_free_blocks(); }

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
      SeqState s;
      s.id = next_id_++;
      s.scoring = true;
      s.tokens = seqs[i];
      s.num_prompt = static_cast<int>(s.tokens.size());
      s.chunk = chunk;
      s.score_index = static_cast<int>(i);
      s.result = &results[i];
      s.result->token_ids = s.tokens;
      s.result->logprobs.assign(s.tokens.size(), std::nullopt);
      s.result->top1_ids.assign(s.tokens.size(), std::nullopt);
      waiting_.push_back(std::move(s));
    }
    try {
      while (!idle()) step();
    } catch (...) {
      abort_all();
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
      abort_all();
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
    SeqState s;
    s.id = next_id_++;
    s.tokens = std::move(req.prompt);
    s.num_prompt = static_cast<int>(s.tokens.size());
    s.chunk = chunk_for(req.options.chunk_size);
    s.gen = std::move(req.options);
    s.sampler.emplace(s.gen.sampling);
    waiting_.push_back(std::move(s));
    return waiting_.back().id;
  }

  void cancel(RequestId id) override {
    for (auto& s : running_)
      if (s.id == id) s.cancelled = true;
    for (auto& s : waiting_)
      if (s.id == id) s.cancelled = true;
  }

  bool idle() const override { return running_.empty() && waiting_.empty(); }
  int num_running() const override { return static_cast<int>(running_.size()); }
  int num_waiting() const override { return static_cast<int>(waiting_.size()); }

  std::vector<StepEvent> step() override {
    std::vector<StepEvent> events;
    // Cancelled requests finish without running.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->cancelled) {
        events.push_back({it->id, -1, FinishReason::cancelled});
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& s : running_)
      if (s.cancelled) finish(s, FinishReason::cancelled, events);
    reap();

    // Admit waiting requests (FCFS) while there is room for their first chunk.
    while (!waiting_.empty() && static_cast<int>(running_.size()) < opts_.max_num_seqs) {
      SeqState& s = waiting_.front();
      s.kv = kv_->add_sequence();
      const int first = std::min<int>(s.chunk, static_cast<int>(s.tokens.size()));
      if (!kv_->can_append(s.kv, first) && !running_.empty()) {
        kv_->free_sequence(s.kv);
        s.kv = -1;
        break;
      }
      running_.push_back(std::move(s));
      waiting_.pop_front();
    }

    // Schedule: every running sequence gets its next chunk (decodes: 1 token)
    // within the token budget, in admission order.
    std::vector<ForwardSeq> batch;
    std::vector<SeqState*> who;
    std::vector<int> ids;
    int budget = opts_.max_num_batched_tokens;
    for (auto& s : running_) {
      const int pending = static_cast<int>(s.tokens.size()) - s.num_computed;
      int n = std::min({pending, s.chunk, budget});
      if (n <= 0) continue;
      if (!kv_->can_append(s.kv, n)) continue;  // waits for pages
      kv_->append(s.kv, n);
      batch.push_back(ForwardSeq{s.kv, s.num_computed, n});
      who.push_back(&s);
      ids.insert(ids.end(), s.tokens.begin() + s.num_computed, s.tokens.begin() + s.num_computed + n);
      budget -= n;
    }
    if (batch.empty()) {
      if (!running_.empty())
        throw InputError(fmt::format("KV cache too small: no running sequence can proceed ({} free blocks); raise "
                                     "--kv-memory or lower --max-model-len",
                                     kv_->num_free_blocks()));
      return events;
    }
    fwd_.run(ids, batch, *kv_, scales_, observer_);

    int row = 0;
    const int V = cfg_.vocab_size;
    for (size_t b = 0; b < batch.size(); ++b) {
      SeqState& s = *who[b];
      const int n = batch[b].num_tokens;
      if (s.scoring) {
        score_rows(s, row, n);
      } else if (s.num_computed + n == static_cast<int>(s.tokens.size())) {
        logits_.resize(static_cast<size_t>(V));
        fwd_.logits(fwd_.hidden_row(row + n - 1), 1, logits_.data());
        const int tok = s.sampler->sample(logits_);
        s.tokens.push_back(tok);
        ++s.generated;
        StepEvent ev{s.id, tok, std::nullopt};
        if (s.gen.logprobs >= 0) add_logprobs(ev, logits_, s.gen.logprobs);
        const bool eos = s.gen.stop_at_eos &&
                         std::find(cfg_.eos_token_ids.begin(), cfg_.eos_token_ids.end(), tok) != cfg_.eos_token_ids.end();
        const bool stop = eos || std::find(s.gen.stop_token_ids.begin(), s.gen.stop_token_ids.end(), tok) !=
                                     s.gen.stop_token_ids.end();
        s.num_computed += n;
        events.push_back(ev);
        if (stop) {
          finish(s, FinishReason::stop, events, /*attach=*/true);
        } else if (s.generated >= s.gen.max_tokens || static_cast<int>(s.tokens.size()) >= plan_.max_model_len) {
          finish(s, FinishReason::length, events, /*attach=*/true);
        }
        row += n;
        continue;
      }
      s.num_computed += n;
      row += n;
      if (s.scoring && s.num_computed == static_cast<int>(s.tokens.size())) finish(s, FinishReason::length, events);
    }
    reap();
    return events;
  }

 private:
  void score_rows(SeqState& s, int row0, int n) {
    const int V = cfg_.vocab_size;
    constexpr int kRows = 16;  // logits rows per LM-head GEMM (bounds memory for large vocabularies)
    logits_.resize(static_cast<size_t>(kRows) * V);
    for (int r = 0; r < n; r += kRows) {
      const int m = std::min(kRows, n - r);
      fwd_.logits(fwd_.hidden_row(row0 + r), m, logits_.data());
      for (int i = 0; i < m; ++i) {
        const int pos = s.num_computed + r + i;
        std::span<const float> row(logits_.data() + static_cast<size_t>(i) * V, V);
        const int top = argmax_lowest(row);
        if (pos + 1 < static_cast<int>(s.tokens.size())) {
          const double lp = log_softmax_at(row, s.tokens[pos + 1]);
          if (!std::isfinite(lp)) throw std::runtime_error(fmt::format("non-finite logprob at position {}", pos + 1));
          s.result->logprobs[pos + 1] = lp;
          s.result->top1_ids[pos + 1] = top;
        }
        if (score_cb_ && *score_cb_) (*score_cb_)(s.score_index, pos, row);
      }
    }
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

  void finish(SeqState& s, FinishReason r, std::vector<StepEvent>& events, bool attach = false) {
    if (attach && !events.empty() && events.back().id == s.id) {
      events.back().finished = r;
    } else if (!s.scoring) {
      events.push_back({s.id, -1, r});
    }
    s.kv >= 0 ? kv_->free_sequence(s.kv) : void();
    s.kv = -1;
    s.num_prompt = -1;  // marks finished
  }

  void reap() {
    running_.erase(std::remove_if(running_.begin(), running_.end(), [](const SeqState& s) { return s.num_prompt < 0; }),
                   running_.end());
  }

  void abort_all() {
    for (auto& s : running_)
      if (s.kv >= 0) kv_->free_sequence(s.kv);
    running_.clear();
    waiting_.clear();
  }

  ModelConfig cfg_;
  EngineOptions opts_;
  KvDtype dtype_;
  ForwardPass fwd_;
  KvPlan plan_;
  std::unique_ptr<KvCacheManager> kv_;
  KvScales scales_;
  StoreObserver* observer_ = nullptr;
  std::deque<SeqState> waiting_;
  std::deque<SeqState> running_;
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
}  // namespace

std::unique_ptr<Engine> Engine::create(ModelConfig cfg, std::shared_ptr<const ModelWeights> weights,
                                       const EngineOptions& opts) {
  const KvDtype d = opts.kv_cache_dtype == "auto" ? KvDtype::bf16 : resolve_kv_cache_dtype(opts.kv_cache_dtype, {});
  return std::make_unique<CpuEngine>(std::move(cfg), maybe_widen(std::move(weights)), opts, d);
}

std::unique_ptr<Engine> Engine::load(const std::filesystem::path& dir, const EngineOptions& opts) {
  ModelConfig cfg = load_model_config(dir);
  const KvDtype d = resolve_kv_cache_dtype(opts.kv_cache_dtype, dir);
  std::shared_ptr<const Checkpoint> ckpt = Checkpoint::open(dir);
  auto w = ModelWeights::load(ckpt, cfg);
  // KV scales from the checkpoint (validated; one coverage warning for fp8): kv/scale_loader.h.
  KvScales scales = load_kv_scales_for_run(*ckpt, KvScaleShape{cfg.num_layers, cfg.num_heads, cfg.num_kv_heads}, d);
  auto engine = std::make_unique<CpuEngine>(std::move(cfg), maybe_widen(std::move(w)), opts, d);
  engine->set_kv_scales(std::move(scales));
  return engine;
}

}  // namespace fp8kv
