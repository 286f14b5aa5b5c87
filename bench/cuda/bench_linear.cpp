// cuBLASLt linear (cuda::Gemm, the CUDA backend's GEMM) at decode shapes:
// how close a bf16 x bf16 -> fp32 GEMM with T = 1..32 rows comes to the copy
// bandwidth, for the Llama-3.1-8B projections (fused qkv and gate|up, as the
// CUDA backend runs them) and the LM head. Prints one line per (shape, T) and
// the implied GEMM time of a decode step (32 layers + LM head), so the step's
// other costs can be read off `fp8kv bench latency` (docs/cuda_backend.md).
//   bench_linear [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/membw.h"
#include "backend/cuda/ops.h"

using namespace fp8kv;

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
  int per_step;  // calls per decode step
};

}  // namespace

int main(int argc, char** argv) {
  const char* json = nullptr;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
  if (!cuda::device_present()) {
    std::printf("bench_linear: no CUDA device\n");
    return 0;
  }
  const double copy = cuda::d2d_copy_bytes_per_s();
  const Shape shapes[] = {{"qkv", 6144, 4096, 32},
                          {"o_proj", 4096, 4096, 32},
                          {"gate_up", 28672, 4096, 32},
                          {"down", 4096, 14336, 32},
                          {"lm_head", 128256, 4096, 1}};
  // (T, gemv): cuBLASLt at 1, 8, 32 rows; the decode GEMV (ops.h gemv_bf16) at 1 and 8.
  const std::pair<int, bool> Ts[] = {{1, false}, {1, true}, {8, false}, {8, true}, {32, false}};
  cudaStream_t st;
  FP8KV_CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cuda::Gemm gemm;
  // One weight buffer per shape (distinct memory: no L2 reuse across calls).
  std::vector<cuda::DeviceBuffer> w;
  size_t max_k = 0, max_n = 0;
  for (const Shape& s : shapes) {
    w.emplace_back(static_cast<size_t>(s.n * s.k) * 2);
    FP8KV_CU(cudaMemset(w.back().get(), 0x3c, w.back().bytes()));  // ~0.01 in bf16
    max_k = std::max<size_t>(max_k, s.k);
    max_n = std::max<size_t>(max_n, s.n);
  }
  cuda::DeviceBuffer x(32 * max_k * 2), y(32 * max_n * 4);
  FP8KV_CU(cudaMemset(x.get(), 0x3c, x.bytes()));
  cudaEvent_t e0, e1;
  FP8KV_CU(cudaEventCreate(&e0));
  FP8KV_CU(cudaEventCreate(&e1));
  std::printf("copy bandwidth %.0f GB/s (read + write)\n", copy / 1e9);
  std::printf("%-8s %6s %6s %3s %-5s %9s %8s %7s\n", "shape", "N", "K", "T", "path", "us", "GB/s", "/copy");
  FILE* jf = json ? std::fopen(json, "w") : nullptr;
  if (jf) std::fprintf(jf, "{\"copy_gbps\": %.1f, \"cases\": [\n", copy / 1e9);
  bool first = true;
  for (auto [T, use_gemv] : Ts) {
    gemm.set_gemv_max_rows(use_gemv ? cuda::kGemvMaxRows : 0);
    const char* path = use_gemv ? "gemv" : "lt";
    double step_us = 0;
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const Shape& s = shapes[i];
      const cuda::DeviceMatrix W{w[i].as<const uint16_t>(), s.n, s.k};
      for (int r = 0; r < 3; ++r) gemm.linear(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
      const int reps = 20;
      std::vector<float> ms;
      for (int rep = 0; rep < 5; ++rep) {
        FP8KV_CU(cudaEventRecord(e0, st));
        for (int r = 0; r < reps; ++r) gemm.linear(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
        FP8KV_CU(cudaEventRecord(e1, st));
        FP8KV_CU(cudaEventSynchronize(e1));
        float t = 0;
        FP8KV_CU(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t / reps);
      }
      std::sort(ms.begin(), ms.end());
      const double us = ms[ms.size() / 2] * 1e3;
      const double bytes = static_cast<double>(s.n * s.k) * 2 + static_cast<double>(T) * (s.k * 2 + s.n * 4);
      const double gbps = bytes / (us * 1e-6) / 1e9;
      std::printf("%-8s %6lld %6lld %3d %-5s %9.2f %8.0f %7.3f\n", s.name, static_cast<long long>(s.n),
                  static_cast<long long>(s.k), T, path, us, gbps, gbps * 1e9 / copy);
      step_us += us * s.per_step;
      if (jf) {
        std::fprintf(jf,
                     "%s{\"shape\": \"%s\", \"n\": %lld, \"k\": %lld, \"t\": %d, \"path\": \"%s\", \"us\": %.3f, "
                     "\"gbps\": %.1f}",
                     first ? "" : ",\n", s.name, static_cast<long long>(s.n), static_cast<long long>(s.k), T, path, us,
                     gbps);
        first = false;
      }
    }
    std::printf("T=%d %s: GEMMs of one 8B decode step (32 layers + LM head) %.3f ms\n", T, path, step_us / 1e3);
  }
  if (jf) {
    std::fprintf(jf, "\n]}\n");
    std::fclose(jf);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
  return 0;
}
