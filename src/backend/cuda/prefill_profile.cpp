#include "backend/cuda/prefill_profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "backend/cuda/check.h"

namespace fp8kv::cuda {

PrefillProfile::PrefillProfile(int min_rows, int64_t skip, int64_t max_steps)
    : min_rows_(min_rows), skip_(std::max<int64_t>(skip, 0)), max_steps_(max_steps) {}

PrefillProfile::~PrefillProfile() {
  try {
    flush();
    if (total_steps_ > 0) print("total", total_, total_span_ms_, total_tokens_);
  } catch (...) {  // never throw from a destructor (a CUDA error at teardown)
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

cudaEvent_t PrefillProfile::event(int i) {
  while (static_cast<int>(events_.size()) <= i) {
    cudaEvent_t e;
    FP8KV_CU(cudaEventCreate(&e));
    events_.push_back(e);
  }
  return events_[i];
}

void PrefillProfile::begin_step(int T, int num_seqs, int num_decodes, cudaStream_t stream, bool capturing) {
  if (capturing) return;  // no event sync inside a capture (the runner begins steps before capturing)
  flush();
  // Steps with a prefill part only: decode-only steps (e.g. the engine's
  // startup graph warm-up of the large decode buckets) are not counted.
  if (T < min_rows_ || num_decodes >= num_seqs) return;
  const int64_t n = seen_++;
  active_ = n >= skip_ && (max_steps_ < 0 || n < skip_ + max_steps_);
  if (!active_) return;
  stream_ = stream;
  T_ = T;
  S_ = num_seqs;
  nd_ = num_decodes;
  used_ = 1;
  depth_ = 0;
  FP8KV_CU(cudaEventRecord(event(0), stream_));  // the step's start
  wall0_ = std::chrono::steady_clock::now();
}

void PrefillProfile::start(const std::string& key, double flops) {
  if (depth_ > 0) {  // nested: the outer scope times it
    ++depth_;
    return;
  }
  Mark m;
  m.key = key;
  m.flops = flops;
  m.ev0 = used_;
  FP8KV_CU(cudaEventRecord(event(m.ev0), stream_));
  ++used_;
  marks_.push_back(std::move(m));
  ++depth_;
}

void PrefillProfile::stop() {
  if (depth_ == 0 || --depth_ > 0 || marks_.empty()) return;
  Mark& m = marks_.back();
  FP8KV_CU(cudaEventRecord(event(used_), stream_));
  m.ev1 = used_++;
}

void PrefillProfile::flush() {
  if (!active_) return;
  active_ = false;
  depth_ = 0;
  while (!marks_.empty() && marks_.back().ev1 < 0) marks_.pop_back();  // an op that threw
  if (marks_.empty()) return;
  // Host wall time from this step's begin_step to the next one's (or to the
  // flush): the GPU span plus what the host did around it (logits download,
  // sampling, scheduling the next step) that the GPU did not overlap.
  const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0_).count();
  FP8KV_CU(cudaEventSynchronize(event(marks_.back().ev1)));
  std::map<std::string, Sum> s;
  for (const Mark& m : marks_) {
    if (m.ev1 < 0) continue;
    float ms = 0;
    FP8KV_CU(cudaEventElapsedTime(&ms, event(m.ev0), event(m.ev1)));
    Sum& x = s[m.key];
    x.ms += ms;
    x.flops += m.flops;
    ++x.calls;
  }
  float span = 0;
  FP8KV_CU(cudaEventElapsedTime(&span, event(0), event(marks_.back().ev1)));
  marks_.clear();
  char what[128];
  std::snprintf(what, sizeof what, "step T=%d seqs=%d decodes=%d, host wall %.3f ms", T_, S_, nd_, wall_ms);
  print(what, s, span, T_);
  for (const auto& [k, v] : s) {
    Sum& t = total_[k];
    t.ms += v.ms;
    t.flops += v.flops;
    t.calls += v.calls;
  }
  total_span_ms_ += span;
  total_tokens_ += T_;
  ++total_steps_;
}

void PrefillProfile::print(const char* what, const std::map<std::string, Sum>& s, double span_ms,
                           int64_t tokens) const {
  double sum = 0;
  for (const auto& kv : s) sum += kv.second.ms;
  std::fprintf(stderr, "prefill profile: %s (%lld tokens): span %.3f ms, ops %.3f ms, gaps %.3f ms\n", what,
               static_cast<long long>(tokens), span_ms, sum, span_ms - sum);
  for (const auto& [k, v] : s) {
    if (v.flops > 0)
      std::fprintf(stderr, "prefill profile:   %-28s %5lld calls %9.3f ms %5.1f%%  %6.1f TFLOP/s\n", k.c_str(),
                   static_cast<long long>(v.calls), v.ms, 100.0 * v.ms / span_ms, v.flops / (v.ms * 1e-3) / 1e12);
    else
      std::fprintf(stderr, "prefill profile:   %-28s %5lld calls %9.3f ms %5.1f%%\n", k.c_str(),
                   static_cast<long long>(v.calls), v.ms, 100.0 * v.ms / span_ms);
  }
  std::fflush(stderr);
}

}  // namespace fp8kv::cuda
