#include "server/engine_loop.h"

#include "server/log.h"

#include <fmt/format.h>

#include <unordered_map>

#include "backend/common/rank_failure.h"
#include "backend/cpu/ops.h"
#include "server/api_error.h"

namespace fp8kv::server {

bool Channel::wait(std::vector<StepEvent>& out) {
  std::unique_lock l(m_);
  cv_.wait(l, [&] { return !events_.empty() || ended_; });
  if (events_.empty()) return false;
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

std::optional<bool> Channel::wait_for(std::vector<StepEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock l(m_);
  if (!cv_.wait_for(l, timeout, [&] { return !events_.empty() || ended_; })) return std::nullopt;
  if (events_.empty()) return false;
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

std::optional<std::string> Channel::error() const {
  std::lock_guard l(m_);
  return error_;
}

void Channel::push(StepEvent ev) {
  {
    std::lock_guard l(m_);
    if (ended_) return;
    if (ev.finished) ended_ = true;
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

int Channel::error_status() const {
  std::lock_guard l(m_);
  return error_status_;
}

void Channel::fail(std::string message, int status) {
  {
    std::lock_guard l(m_);
    if (ended_) return;
    ended_ = true;
    error_ = std::move(message);
    error_status_ = status;
  }
  cv_.notify_all();
}

EngineLoop::EngineLoop(Engine& engine, Metrics& metrics, int max_in_flight, std::function<void()> on_fatal)
    : engine_(engine), metrics_(metrics), max_in_flight_(max_in_flight), on_fatal_(std::move(on_fatal)) {
  update_gauges();
  // OpenMP's thread count is per thread: the engine was created (and
  // --threads applied) on this thread, so the loop thread takes the same.
  thread_ = std::thread([this, n = cpu_threads()] {
    set_cpu_threads(n);
    run();
  });
}

EngineLoop::~EngineLoop() {
  if (thread_.joinable()) drain(std::chrono::seconds(0));
}

std::shared_ptr<Channel> EngineLoop::submit(std::vector<int> prompt, GenerateOptions options) {
  auto ch = std::make_shared<Channel>();
  ch->arrival_ = Clock::now();
  ch->prompt_ = std::move(prompt);
  ch->options_ = std::move(options);
  {
    std::lock_guard l(m_);
    if (draining_) throw ApiError(503, "the server is shutting down", {}, "service_unavailable_error");
    if (in_flight_.load() >= max_in_flight_)
      throw ApiError(503,
                     fmt::format("the server is full: {} requests in flight (--max-num-seqs + --max-waiting); retry later",
                                 max_in_flight_),
                     {}, "service_unavailable_error");
    inbox_.push_back(ch);
    ++in_flight_;
  }
  cv_.notify_all();
  return ch;
}

void EngineLoop::cancel(const std::shared_ptr<Channel>& ch) {
  {
    std::lock_guard l(m_);
    cancels_.push_back(ch);
  }
  cv_.notify_all();
}

void EngineLoop::drain(std::chrono::duration<double> grace) {
  draining_ = true;
  {
    std::unique_lock l(drained_m_);
    drained_cv_.wait_for(l, grace, [&] { return in_flight_.load() == 0; });
  }
  {
    std::lock_guard l(m_);
    cancel_all_ = true;
    quit_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::exception_ptr EngineLoop::fatal() const {
  std::lock_guard l(fatal_m_);
  return fatal_;
}

void EngineLoop::fail_all(std::unordered_map<RequestId, std::shared_ptr<Channel>>& live, const std::string& message,
                          int status) {
  for (auto& [id, ch] : live) {
    ch->fail(message, status);
    end(*ch);
  }
}

void EngineLoop::update_gauges(bool idle) {
  Gauges g;
  g.running = engine_.num_running();
  g.waiting = engine_.num_waiting();
  {
    std::lock_guard l(m_);
    g.waiting += static_cast<int>(inbox_.size());
  }
  g.free_blocks = engine_.free_kv_blocks();
  g.total_blocks = engine_.kv_plan().num_blocks;
  g.num_preemptions = engine_.num_preemptions();
  const PrefixCacheStats pc = engine_.prefix_cache_stats();
  g.prefix_cache_queries = pc.queries;
  g.prefix_cache_hits = pc.hits;
  const Clock::time_point now = Clock::now();
  if (idle || !clips_read_ || now - *clips_read_ >= std::chrono::milliseconds(250)) {
    clips_read_ = now;
    kv_clipped_.reset();
    if (const std::optional<std::vector<KvClipCounts>> c = engine_.kv_clip_counts()) {
      kv_clipped_.emplace();
      for (size_t l = 0; l < c->size(); ++l)
        if (!engine_.config().is_linear(static_cast<int>(l)))  // a linear_attention layer has no KV cache
          kv_clipped_->push_back({static_cast<int>(l), (*c)[l].k, (*c)[l].v});
    }
  }
  g.kv_clipped = kv_clipped_;
  metrics_.set_gauges(g);
}

void EngineLoop::end(Channel& ch) {
  if (ch.counted_) return;
  ch.counted_ = true;
  if (--in_flight_ == 0) {
    std::lock_guard l(drained_m_);
    drained_cv_.notify_all();
  }
}

void EngineLoop::run() {
  std::unordered_map<RequestId, std::shared_ptr<Channel>> live;
  std::string fatal_message;  // set once the engine cannot run: no step after it
  for (;;) {
    std::vector<std::shared_ptr<Channel>> in, cancels;
    bool cancel_all = false, quit = false;
    {
      std::unique_lock l(m_);
      cv_.wait(l, [&] {
        return !inbox_.empty() || !cancels_.empty() || cancel_all_ || quit_ ||
               (fatal_message.empty() && !engine_.idle());
      });
      in.swap(inbox_);
      cancels.swap(cancels_);
      cancel_all = cancel_all_;
      quit = quit_;
    }
    if (!fatal_message.empty()) {
      // Requests that raced the failure into the inbox get the same 503.
      for (auto& ch : in) {
        ch->fail(fatal_message, 503);
        end(*ch);
      }
      if (quit) break;
      continue;
    }
    for (auto& ch : in) {
      if (cancel_all) {
        ch->push(StepEvent{0, -1, FinishReason::cancelled});
        end(*ch);
        continue;
      }
      try {
        const int n = static_cast<int>(ch->prompt_.size());
        ch->id_ = engine_.submit(Request{std::move(ch->prompt_), ch->options_});
        live[ch->id_] = ch;
        metrics_.add_prompt_tokens(n);
      } catch (const std::exception& e) {
        ch->fail(e.what());  // validated before; an engine refusal is an internal error
        end(*ch);
      }
    }
    for (auto& ch : cancels)
      if (ch->id_ != 0 && live.count(ch->id_)) engine_.cancel(ch->id_);
    if (cancel_all)
      for (auto& [id, ch] : live) engine_.cancel(id);
    if (engine_.idle()) {
      update_gauges(/*idle=*/true);
      if (quit && live.empty()) break;
      continue;
    }
    std::vector<StepEvent> events;
    try {
      events = engine_.step();
    } catch (const RankFailure& e) {
      // The tensor-parallel group is gone (docs/tp.md "The watchdog"): every
      // open request gets a 503, new ones too (draining), and the server
      // stops and exits 1 with this line. No further step runs.
      log().error("{}", e.what());
      fatal_message = std::string("the tensor-parallel group failed: ") + e.what() + "; the server is exiting";
      draining_ = true;
      fail_all(live, fatal_message, 503);
      live.clear();
      {
        std::lock_guard l(fatal_m_);
        fatal_ = std::current_exception();
      }
      if (on_fatal_) on_fatal_();
      continue;
    } catch (const std::exception& e) {
      // The batch failed: every request in it ends with a 500; cancelling
      // them makes the next step return their blocks.
      log().error("engine step failed: {}", e.what());
      for (auto& [id, ch] : live) {
        ch->fail(std::string("engine failure: ") + e.what());
        end(*ch);
        engine_.cancel(id);
      }
      update_gauges();
      continue;
    }
    const auto now = Clock::now();
    int generated = 0;
    for (auto& ev : events) {
      auto it = live.find(ev.id);
      if (it == live.end()) continue;
      Channel& ch = *it->second;
      if (ev.token >= 0) {
        ++generated;
        if (!ch.last_token_) {
          metrics_.observe_ttft(std::chrono::duration<double>(now - ch.arrival_).count());
        } else {
          metrics_.observe_itl(std::chrono::duration<double>(now - *ch.last_token_).count());
        }
        ch.last_token_ = now;
      }
      const bool done = ev.finished.has_value();
      if (done) {
        if (!ch.counted_) {
          metrics_.observe_e2e(std::chrono::duration<double>(now - ch.arrival_).count(),
                               std::string(finish_reason_name(*ev.finished)));
        }
        end(ch);
      }
      it->second->push(std::move(ev));
      if (done) live.erase(it);
    }
    metrics_.add_generation_tokens(generated);
    update_gauges(engine_.idle());
  }
}

}  // namespace fp8kv::server
