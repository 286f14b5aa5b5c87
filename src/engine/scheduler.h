// The Scheduler: admission, the token budget of each step, preemption, and
// the life cycle of every request (docs/engine.md "Scheduling rules").
//
// Each step (schedule()):
//  1. Cancelled requests finish (their blocks return to the pool).
//  2. Decodes first: every running request with one pending token gets it,
//     in admission order, within max_num_batched_tokens. When the pool has
//     no page for it, the newest running request is preempted (possibly the
//     request itself) until it fits.
//  3. Prefill chunks: running requests with more pending tokens get
//     min(pending, their chunk, budget left) tokens, in admission order; a
//     request short of pages preempts newer requests not scheduled this step,
//     else itself.
//  4. Admission (FCFS, preempted requests first): while fewer than
//     max_num_seqs run and budget is left, the front waiting request is
//     admitted when the free pages, minus what running prefills still need,
//     cover its whole prompt (sliding groups: window + one chunk:
//     KvCacheManager::blocks_to_hold); it gets its first chunk now. With
//     the prefix cache on, it first adopts the longest cached run of full
//     blocks (docs/design.md "Prefix caching") and prefills only the rest;
//     the pages of the hit that other sequences hold are not counted as need.
// After each step, the full blocks a request has computed are registered in
// the prefix cache (KvCacheManager::cache_computed_blocks).
// With a state pool (linear_attention layers) and the prefix cache on, the
// state snapshots (docs/design.md "Prefix snapshots of the linear-attention
// state"): a generation request's prefill chunk that would cross a snapshot
// boundary is cut to end there; a step that ends a request's tokens at a
// boundary asks for a snapshot (state_saves, copied after the forward); an
// admission with a hit resumes from its snapshot (state_restores, copied
// before the forward). Scoring requests are neither cut nor snapshotted.
// Preemption is by recompute: the request frees its pages and returns to the
// front of the waiting queue with every token it has (prompt + generated);
// re-admitted, it prefills them again and continues. No token is produced
// twice: the recompute ends by sampling the next new token.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "kv/kv_cache_manager.h"

namespace fp8kv {

enum class RequestState : uint8_t {
  waiting,          // never admitted yet
  running,          // holds KV pages, scheduled each step
  preempted,        // back in the waiting queue, pages freed, tokens kept
  finished_stop,    // a stop token (EOS or stop_token_ids)
  finished_length,  // max_tokens / max_model_len reached; scoring: all tokens computed
  cancelled,        // cancel() or the token callback said stop
};
std::string_view request_state_name(RequestState s);
inline bool is_finished(RequestState s) {
  return s == RequestState::finished_stop || s == RequestState::finished_length || s == RequestState::cancelled;
}

struct SchedRequest {
  RequestId id = 0;
  RequestState state = RequestState::waiting;
  bool scoring = false;       // teacher-forced scoring (no sampling, logits of every row)
  std::vector<int> tokens;    // prompt + generated so far
  int num_prompt = 0;         // prompt tokens (fixed)
  int num_computed = 0;       // tokens whose K/V are in the cache
  int chunk = 1;              // max tokens per prefill step
  int kv = -1;                // KvCacheManager sequence while running, else -1
  bool cancel_requested = false;
  int num_preemptions = 0;
  // generation
  GenerateOptions gen;
  std::optional<Sampler> sampler;
  int generated = 0;
  // scoring
  int score_index = -1;
  ScoreResult* result = nullptr;
  int rows_reported = 0;      // logits rows already handed out (kept across a preemption)

  int pending() const { return static_cast<int>(tokens.size()) - num_computed; }
};

// One request's share of a step: tokens [start, start + num_tokens) of its
// sequence. `samples`: the chunk reaches the last known token, so the step
// samples the next one (generation only).
struct ScheduledSeq {
  SchedRequest* req = nullptr;
  int start = 0;
  int num_tokens = 0;
  bool samples = false;
};

struct SchedulerOutput {
  // Decodes (num_tokens == 1) first, then prefill chunks.
  std::vector<ScheduledSeq> seqs;
  int num_decodes = 0;
  int num_tokens = 0;
  std::vector<StepEvent> events;  // cancellations finished this step
  // State pool slot copies (src, dst) around the forward (kv/state_plan.h
  // slots): snapshots into admitted sequences' slots before it, sequences'
  // slots into new snapshots after it.
  std::vector<std::pair<int32_t, int32_t>> state_restores, state_saves;
};

struct SchedulerLimits {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int max_model_len = 0;
};

class Scheduler {
 public:
  Scheduler(KvCacheManager& kv, SchedulerLimits limits, std::vector<int> eos_token_ids);

  void add(std::unique_ptr<SchedRequest> r);  // to the back of the waiting queue
  void cancel(RequestId id);                  // takes effect at the next schedule()
  SchedulerOutput schedule();
  // After the forward: advances every scheduled request, appends sampled
  // tokens (sampled[i] for seqs[i] with samples; others ignored), applies
  // stop / length rules, frees finished requests. Returns the step's events.
  std::vector<StepEvent> update(const SchedulerOutput& out, std::span<const int> sampled);
  // Preempts the newest running request (recompute). False when none runs.
  bool preempt();
  // Drops every request (after an exception in the step loop).
  void abort_all();

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Prefix cache, in tokens (vLLM's counters): prompt tokens of admitted
  // generation requests looked up (again after each preemption), and those
  // found cached.
  int64_t prefix_cache_queries() const { return prefix_queries_; }
  int64_t prefix_cache_hits() const { return prefix_hits_; }
  // Tokens run through the forward pass so far (prefill + decode).
  int64_t num_computed_tokens() const { return num_computed_tokens_; }
  const SchedulerLimits& limits() const { return limits_; }

 private:
  void preempt(SchedRequest& r);
  void finish(SchedRequest& r, RequestState s);
  void reap();
  // Pages the running prefills still have to take for their prompts.
  int64_t outstanding_reservation() const;
  // n tokens of r from r.num_computed on, cut to end at the first snapshot
  // boundary they would cross (generation requests with snapshots on).
  int cut_at_snapshot(const SchedRequest& r, int n) const;

  KvCacheManager& kv_;
  SchedulerLimits limits_;
  std::vector<int> eos_;
  std::deque<std::unique_ptr<SchedRequest>> waiting_;
  std::vector<std::unique_ptr<SchedRequest>> running_;  // admission order
  int64_t num_preemptions_ = 0;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
  int64_t num_computed_tokens_ = 0;
};

}  // namespace fp8kv
