// The prefill part of FP8KV_PROFILE (backend/common/profile.h;
// docs/cuda_backend.md "Profiling: FP8KV_PROFILE"): with prefill[=N] on, the CUDA backend
// brackets each op of a step of >= N tokens (default 64) that has a
// prefill part (decode-only steps are never counted) with a pair of
// CUDA events and, when the next step begins (or the backend goes away),
// prints to stderr one line per step: the host wall time from begin_step to
// the next begin_step, the GPU span from begin_step to the last op, and per
// op class (GEMMs by shape with their TFLOP/s, norms, qkv
// prep + store, attention, activation, logits) the summed event time and the
// number of calls. A total over all profiled steps is printed at the end.
// The events sit between kernels, so PDL overlap across an event is lost:
// the per-op sums are upper bounds of what each op costs inside the normal
// chain (the span shows the cost of profiling next to the unprofiled TTFT).
// Off: no profile object, no events, no cost. Never active while a graph is
// captured (decode graphs are below the row threshold anyway).
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fp8kv::cuda {

class PrefillProfile {
 public:
  // Times steps of >= min_rows rows with a prefill part; the first `skip`
  // such steps are left out and at most max_steps (< 0: all) after them are
  // timed (the backend: 0 and all; tests pass others).
  explicit PrefillProfile(int min_rows, int64_t skip = 0, int64_t max_steps = -1);
  ~PrefillProfile();
  PrefillProfile(const PrefillProfile&) = delete;
  PrefillProfile& operator=(const PrefillProfile&) = delete;

  // A new step: flushes the previous one, starts timing when T >= min rows.
  void begin_step(int T, int num_seqs, int num_decodes, cudaStream_t stream, bool capturing);
  bool active() const { return active_; }
  // Brackets one op: start(key) before its launches, stop() after.
  // flops > 0 adds a TFLOP/s column for the class.
  void start(const std::string& key, double flops);
  void stop();
  // Prints the pending step and the total (called by the destructor too).
  void flush();

  // RAII bracket; a no-op when the profile is null or inactive. The CUDA
  // backend's ops bracket themselves with CudaBackend::OpScope instead (one
  // scope for this profile and the step profile); this one is for code
  // outside the backend (tests).
  class Scope {
   public:
    Scope(PrefillProfile* p, const char* key, double flops = 0) : p_(p && p->active() ? p : nullptr) {
      if (p_) p_->start(key, flops);
    }
    Scope(PrefillProfile* p, const std::string& key, double flops = 0) : p_(p && p->active() ? p : nullptr) {
      if (p_) p_->start(key, flops);
    }
    ~Scope() {
      if (p_) p_->stop();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    PrefillProfile* p_;
  };

 private:
  struct Mark {
    std::string key;
    double flops = 0;
    int ev0 = 0, ev1 = -1;
  };
  struct Sum {
    double ms = 0, flops = 0;
    int64_t calls = 0;
  };
  cudaEvent_t event(int i);
  void print(const char* what, const std::map<std::string, Sum>& s, double span_ms, int64_t tokens) const;

  int min_rows_ = 64;
  int64_t skip_ = 0, max_steps_ = -1, seen_ = 0;  // qualifying steps so far
  bool active_ = false;
  int depth_ = 0;  // nested scopes are not timed (the outer one is)
  cudaStream_t stream_ = nullptr;
  int T_ = 0, S_ = 0, nd_ = 0;
  std::chrono::steady_clock::time_point wall0_;
  std::vector<cudaEvent_t> events_;
  int used_ = 0;
  std::vector<Mark> marks_;
  std::map<std::string, Sum> total_;
  double total_span_ms_ = 0;
  int64_t total_tokens_ = 0, total_steps_ = 0;
};

}  // namespace fp8kv::cuda
