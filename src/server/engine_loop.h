// The one thread that owns the Engine. HTTP threads hand requests to it
// through a locked inbox (submit / cancel) and receive the engine's StepEvents
// on a per-request Channel; no HTTP thread ever calls the engine.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace fp8kv::server {

using Clock = std::chrono::steady_clock;

// One request's event queue (engine loop -> HTTP thread).
class Channel {
 public:
  // Blocks until at least one event is queued or the request has ended;
  // appends the queued events to `out`. Returns false once everything was read
  // and the request has ended.
  bool wait(std::vector<StepEvent>& out);
  // As wait(), for at most `timeout`: nullopt when it timed out with nothing
  // to report.
  std::optional<bool> wait_for(std::vector<StepEvent>& out, std::chrono::milliseconds timeout);
  // Set when the engine failed (the request ends without a finish event).
  std::optional<std::string> error() const;
  // The HTTP status of error(): 500, or 503 when the tensor-parallel group
  // failed (a peer process gone or silent; docs/tp.md "The watchdog").
  int error_status() const;

 private:
  friend class EngineLoop;
  void push(StepEvent ev);
  void fail(std::string message, int status = 500);

  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<StepEvent> events_;
  bool ended_ = false;
  std::optional<std::string> error_;
  int error_status_ = 500;
  // Engine loop thread only:
  RequestId id_ = 0;
  Clock::time_point arrival_;
  std::optional<Clock::time_point> last_token_;
  std::vector<int> prompt_;
  GenerateOptions options_;
  bool counted_ = false;  // in_flight_ decremented
};

class EngineLoop {
 public:
  // max_in_flight: requests admitted and not yet finished (running, waiting
  // in the engine, or in the inbox); one more gets a 503. The server passes
  // max_num_seqs + max_waiting (docs/server.md "Admission").
  // on_fatal: called once, on the loop thread, when the engine can no longer
  // run (a RankFailure: docs/tp.md "The watchdog"). It must not call drain()
  // (the server's signal thread does).
  EngineLoop(Engine& engine, Metrics& metrics, int max_in_flight, std::function<void()> on_fatal = {});
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Throws ApiError 503 (Retry-After) when max_in_flight requests are in
  // flight or the server is shutting down. The count is exact: it is taken
  // and released under the inbox lock, never from a gauge a step behind.
  std::shared_ptr<Channel> submit(std::vector<int> prompt, GenerateOptions options);
  // Thread-safe and idempotent; the request's blocks return at the next step.
  void cancel(const std::shared_ptr<Channel>& ch);

  // Refuses new requests, lets running ones finish for up to `grace`, cancels
  // the rest, and stops the thread.
  void drain(std::chrono::duration<double> grace);
  bool draining() const { return draining_.load(); }
  int in_flight() const { return in_flight_.load(); }
  // The failure that stopped the engine (a RankFailure), or null.
  std::exception_ptr fatal() const;

 private:
  void run();
  // idle: the engine has no work (the clip counts are read fresh).
  void update_gauges(bool idle = false);
  void end(Channel& ch);
  void fail_all(std::unordered_map<RequestId, std::shared_ptr<Channel>>& live, const std::string& message, int status);

  Engine& engine_;
  Metrics& metrics_;
  const int max_in_flight_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Channel>> inbox_;
  std::vector<std::shared_ptr<Channel>> cancels_;
  bool cancel_all_ = false;
  bool quit_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
  std::mutex drained_m_;
  std::condition_variable drained_cv_;
  std::function<void()> on_fatal_;
  mutable std::mutex fatal_m_;
  std::exception_ptr fatal_;  // set once, on the loop thread; afterwards no step runs
  // The last Engine::kv_clip_counts read and when: re-read at most every
  // 250 ms while steps run, and whenever the engine goes idle (a device
  // backend's read is a synchronous copy; docs/server.md).
  std::optional<std::vector<Gauges::LayerClips>> kv_clipped_;
  std::optional<Clock::time_point> clips_read_;
  std::thread thread_;
};

}  // namespace fp8kv::server
