#include "engine/scheduler.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "io/errors.h"

namespace fp8kv {

std::string_view request_state_name(RequestState s) {
  switch (s) {
    case RequestState::waiting: return "waiting";
    case RequestState::running: return "running";
    case RequestState::preempted: return "preempted";
    case RequestState::finished_stop: return "finished_stop";
    case RequestState::finished_length: return "finished_length";
    case RequestState::cancelled: return "cancelled";
  }
  return "?";
}

Scheduler::Scheduler(KvCacheManager& kv, SchedulerLimits limits, std::vector<int> eos)
    : kv_(kv), limits_(limits), eos_(std::move(eos)) {
  if (limits_.max_num_seqs < 1) throw InputError("max_num_seqs must be >= 1");
  if (limits_.max_num_batched_tokens < 1) throw InputError("max_num_batched_tokens must be >= 1");
}

void Scheduler::add(std::unique_ptr<SchedRequest> r) {
  r->state = RequestState::waiting;
  waiting_.push_back(std::move(r));
}

void Scheduler::cancel(RequestId id) {
  for (auto& r : running_)
    if (r->id == id) r->cancel_requested = true;
  for (auto& r : waiting_)
    if (r->id == id) r->cancel_requested = true;
}

int64_t Scheduler::outstanding_reservation() const {
  int64_t n = 0;
  for (const auto& r : running_) {
    if (r->num_computed >= static_cast<int>(r->tokens.size()) - 1) continue;  // decoding
    n += std::max<int64_t>(0, kv_.blocks_to_hold(static_cast<int>(r->tokens.size()), r->chunk) - kv_.blocks_held(r->kv));
  }
  return n;
}

int Scheduler::cut_at_snapshot(const SchedRequest& r, int n) const {
  const int every = kv_.snapshot_interval_tokens();
  if (every == 0 || r.scoring) return n;
  const int next = (r.num_computed / every + 1) * every;  // the first boundary after the chunk's start
  return next < r.num_computed + n ? next - r.num_computed : n;
}

void Scheduler::preempt(SchedRequest& r) {
  if (r.kv >= 0) kv_.free_sequence(r.kv);
  r.kv = -1;
  r.num_computed = 0;
  r.state = RequestState::preempted;
  ++r.num_preemptions;
  ++num_preemptions_;
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == &r; });
  if (it == running_.end()) throw std::logic_error("Scheduler::preempt: request is not running");
  waiting_.push_front(std::move(*it));
  running_.erase(it);
}

bool Scheduler::preempt() {
  if (running_.empty()) return false;
  preempt(*running_.back());
  return true;
}

void Scheduler::finish(SchedRequest& r, RequestState s) {
  if (r.kv >= 0) kv_.free_sequence(r.kv);
  r.kv = -1;
  r.state = s;
}

void Scheduler::reap() {
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& r) { return is_finished(r->state); }),
                 running_.end());
}

void Scheduler::abort_all() {
  for (auto& r : running_)
    if (r->kv >= 0) kv_.free_sequence(r->kv);
  running_.clear();
  waiting_.clear();
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  // 1. Cancellations.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->cancel_requested) {
      if (!(*it)->scoring) out.events.push_back({(*it)->id, -1, FinishReason::cancelled});
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& r : running_) {
    if (!r->cancel_requested) continue;
    finish(*r, RequestState::cancelled);
    if (!r->scoring) out.events.push_back({r->id, -1, FinishReason::cancelled});
  }
  reap();

  int budget = limits_.max_num_batched_tokens;
  std::vector<ScheduledSeq> decodes, prefills;
  std::vector<const SchedRequest*> scheduled;
  auto is_scheduled = [&](const SchedRequest* r) {
    return std::find(scheduled.begin(), scheduled.end(), r) != scheduled.end();
  };
  auto take = [&](SchedRequest& r, int n, std::vector<ScheduledSeq>& into) {
    kv_.append(r.kv, n);
    const bool samples = !r.scoring && r.num_computed + n == static_cast<int>(r.tokens.size());
    into.push_back(ScheduledSeq{&r, r.num_computed, n, samples});
    scheduled.push_back(&r);
    budget -= n;
    // The step ends r's tokens at a snapshot boundary: save its state there.
    if (!r.scoring && kv_.snapshots_on()) {
      const int slot = kv_.reserve_snapshot(r.kv, r.tokens, r.num_computed + n);
      if (slot >= 0) out.state_saves.emplace_back(r.kv, slot);
    }
  };
  bool preempted_any = false;

  // 2. Decodes, in admission order; a full pool preempts the newest request.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SchedRequest& r = *running_[i];
    if (r.pending() != 1) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!kv_.can_append(r.kv, 1)) {
      SchedRequest& victim = *running_.back();
      preempted_any = true;
      preempt(victim);
      if (&victim == &r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // r was the newest: nothing after it is left
    take(r, 1, decodes);
    ++i;
  }

  // 3. Prefill chunks of running requests, in admission order.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SchedRequest& r = *running_[i];
    if (is_scheduled(&r) || r.pending() <= 1) {
      ++i;
      continue;
    }
    const int n = cut_at_snapshot(r, std::min({r.pending(), r.chunk, budget}));
    bool self_preempted = false;
    while (!kv_.can_append(r.kv, n)) {
      // The newest request after r that is not scheduled this step; else r itself.
      SchedRequest* victim = nullptr;
      for (size_t j = running_.size(); j-- > i + 1;)
        if (!is_scheduled(running_[j].get())) {
          victim = running_[j].get();
          break;
        }
      if (!victim) {
        if (running_.size() == 1)
          throw InputError(fmt::format("KV cache too small: a request of {} tokens does not fit in {} free blocks; "
                                       "raise --kv-memory or lower --max-model-len",
                                       r.tokens.size(), kv_.num_free_blocks()));
        victim = &r;
      }
      preempted_any = true;
      preempt(*victim);
      if (victim == &r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) continue;  // running_[i] is now the next request
    take(r, n, prefills);
    ++i;
  }

  // 4. Admission (FCFS; preempted requests are at the front).
  while (!preempted_any && !waiting_.empty() && static_cast<int>(running_.size()) < limits_.max_num_seqs &&
         budget > 0) {
    SchedRequest& r = *waiting_.front();
    // Prefix cache: reuse the longest cached run of full blocks (never for
    // scoring, which needs the logits of every row); its pages that other
    // sequences hold cost no free page.
    const KvCacheManager::PrefixHit hit =
        r.scoring ? KvCacheManager::PrefixHit{} : kv_.find_cached_prefix(r.tokens);
    const int64_t need = kv_.blocks_to_hold(static_cast<int>(r.tokens.size()), r.chunk) - hit.pages_in_use;
    if (!running_.empty() && need > kv_.num_free_blocks() - outstanding_reservation()) break;
    r.kv = kv_.add_sequence();
    if (hit.tokens > 0) kv_.adopt_prefix(r.kv, r.tokens, hit.tokens);
    r.num_computed = hit.tokens;
    const int n = cut_at_snapshot(r, std::min({r.pending(), r.chunk, budget}));
    if (!kv_.can_append(r.kv, n)) {
      kv_.free_sequence(r.kv);
      r.kv = -1;
      r.num_computed = 0;
      if (running_.empty())
        throw InputError(fmt::format("KV cache too small: a request of {} tokens does not fit in {} free blocks; "
                                     "raise --kv-memory or lower --max-model-len",
                                     r.tokens.size(), kv_.num_free_blocks()));
      break;
    }
    r.state = RequestState::running;
    if (kv_.prefix_caching() && !r.scoring) {
      prefix_queries_ += static_cast<int64_t>(r.tokens.size());
      prefix_hits_ += hit.tokens;
    }
    // A hit on a model with a state pool resumes from the snapshot at its end.
    if (hit.tokens > 0 && hit.state_slot >= 0) out.state_restores.emplace_back(hit.state_slot, r.kv);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    take(r, n, n == 1 ? decodes : prefills);
  }

  // Decodes first (one-token chunks join them: the same attention shape).
  std::stable_partition(prefills.begin(), prefills.end(), [](const ScheduledSeq& s) { return s.num_tokens == 1; });
  out.num_decodes = static_cast<int>(decodes.size());
  for (const auto& s : prefills) out.num_decodes += s.num_tokens == 1;
  out.seqs = std::move(decodes);
  out.seqs.insert(out.seqs.end(), prefills.begin(), prefills.end());
  for (const auto& s : out.seqs) out.num_tokens += s.num_tokens;
  return out;
}

std::vector<StepEvent> Scheduler::update(const SchedulerOutput& out, std::span<const int> sampled) {
  std::vector<StepEvent> events;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSeq& s = out.seqs[i];
    SchedRequest& r = *s.req;
    r.num_computed += s.num_tokens;
    num_computed_tokens_ += s.num_tokens;
    kv_.cache_computed_blocks(r.kv, r.tokens, r.num_computed);  // before finish() frees them
    if (r.scoring) {
      if (r.num_computed == static_cast<int>(r.tokens.size())) finish(r, RequestState::finished_length);
      continue;
    }
    if (!s.samples) continue;
    const int tok = sampled[i];
    r.tokens.push_back(tok);
    ++r.generated;
    StepEvent ev{r.id, tok, std::nullopt};
    const bool stop = (r.gen.stop_at_eos && std::find(eos_.begin(), eos_.end(), tok) != eos_.end()) ||
                      std::find(r.gen.stop_token_ids.begin(), r.gen.stop_token_ids.end(), tok) !=
                          r.gen.stop_token_ids.end();
    if (stop) {
      finish(r, RequestState::finished_stop);
      ev.finished = FinishReason::stop;
    } else if (r.generated >= r.gen.max_tokens || static_cast<int>(r.tokens.size()) >= limits_.max_model_len) {
      finish(r, RequestState::finished_length);
      ev.finished = FinishReason::length;
    }
    events.push_back(ev);
  }
  reap();
  return events;
}

}  // namespace fp8kv
