// What the CUDA GEMM/GEMV and delta-rule benchmarks (bench_linear,
// bench_prefill_gemm, bench_gdn) share: the --json flag, the no-device exit,
// the stream and timing events, the event-timed median, and the JSON report.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/ops.h"

namespace fp8kv::bench {

// The FILE of `--json FILE` on the command line, or nullptr.
inline const char* json_flag(int argc, char** argv) {
  const char* json = nullptr;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
  return json;
}

// True (after saying so) when there is no CUDA device: the benchmark exits 0.
inline bool no_device(const char* bench) {
  if (cuda::cuda_device_available()) return false;
  std::printf("%s: no CUDA device\n", bench);
  return true;
}

// The benchmark's stream (created with `flags`) and its two timing events,
// destroyed with it.
struct Timing {
  cudaStream_t st;
  cudaEvent_t e0, e1;
  explicit Timing(unsigned flags) {
    FP8KV_CU(cudaStreamCreateWithFlags(&st, flags));
    FP8KV_CU(cudaEventCreate(&e0));
    FP8KV_CU(cudaEventCreate(&e1));
  }
  ~Timing() {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(st);
  }
  Timing(const Timing&) = delete;
  Timing& operator=(const Timing&) = delete;
};

// 3 warm-up calls, then 5 batches of `reps` calls on stream st, each batch
// timed by two events; returns the median batch's time per call in
// microseconds.
template <class Run>
double median_call_us(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int reps, Run&& run) {
  for (int r = 0; r < 3; ++r) run();
  std::vector<float> ms;
  for (int rep = 0; rep < 5; ++rep) {
    FP8KV_CU(cudaEventRecord(e0, st));
    for (int r = 0; r < reps; ++r) run();
    FP8KV_CU(cudaEventRecord(e1, st));
    FP8KV_CU(cudaEventSynchronize(e1));
    float t = 0;
    FP8KV_CU(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / reps);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

// The --json report: a head that opens its "cases" list, the cases one per
// line, and "]}" when it goes. Without a path it writes nothing.
class JsonReport {
 public:
  explicit JsonReport(const char* path) : f_(path ? std::fopen(path, "w") : nullptr) {}
  ~JsonReport() {
    if (!f_) return;
    std::fprintf(f_, "\n]}\n");
    std::fclose(f_);
  }
  JsonReport(const JsonReport&) = delete;
  JsonReport& operator=(const JsonReport&) = delete;
  template <class... A>
  void head(const char* fmt, A... a) {
    if (f_) print(fmt, a...);
  }
  template <class... A>
  void add(const char* fmt, A... a) {
    if (!f_) return;
    std::fputs(first_ ? "" : ",\n", f_);
    print(fmt, a...);
    first_ = false;
  }

 private:
  template <class... A>
  void print(const char* fmt, A... a) {
    if constexpr (sizeof...(A) == 0) std::fputs(fmt, f_);
    else std::fprintf(f_, fmt, a...);
  }
  FILE* f_;
  bool first_ = true;
};

}  // namespace fp8kv::bench
