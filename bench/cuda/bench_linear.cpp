// cuBLASLt linear (cuda::Gemm, the CUDA backend's GEMM) at decode shapes:
// how close a bf16 x bf16 -> fp32 GEMM with T = 1..32 rows comes to the copy
// bandwidth, for the Llama-3.1-8B projections (fused qkv and gate|up, as the
// CUDA backend runs them) and the LM head, next to the decode GEMV's two
// kernels (ops.h gemv_bf16_simt / gemv_bf16_mma) at T = 1..8. Prints one
// line per (shape, T, path) and the implied GEMM time of a decode step (32
// layers + LM head) per (T, path), so the step's other costs can be read off
// `fp8kv bench latency` (docs/cuda_backend.md).
//   bench_linear [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/copy_bandwidth.h"
#include "backend/cuda/ops/ops.h"
#include "event_median.h"

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
  if (!cuda::cuda_device_available()) {
    std::printf("bench_linear: no CUDA device\n");
    return 0;
  }
  const double copy = cuda::d2d_copy_bytes_per_s();
  const Shape shapes[] = {{"qkv", 6144, 4096, 32},
                          {"o_proj", 4096, 4096, 32},
                          {"gate_up", 28672, 4096, 32},
                          {"down", 4096, 14336, 32},
                          {"lm_head", 128256, 4096, 1}};
  // (T, path): cuBLASLt ("lt") at 1, 2, 4, 8, 32 rows; the decode GEMV's two
  // kernels (ops.h gemv_bf16_simt / gemv_bf16_mma) at 1, 2, 4 and 8 (where
  // each stops winning, if it does).
  const std::pair<int, const char*> Ts[] = {{1, "lt"},   {1, "simt"}, {1, "mma"}, {2, "lt"},  {2, "simt"},
                                            {2, "mma"},  {4, "lt"},   {4, "simt"}, {4, "mma"}, {8, "lt"},
                                            {8, "simt"}, {8, "mma"},  {32, "lt"}};
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
  gemm.set_gemv_max_rows(0);
  for (auto [T, path] : Ts) {
    const std::string p = path;
    double step_us = 0;
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const Shape& s = shapes[i];
      const cuda::DeviceMatrix W{w[i].as<const uint16_t>(), s.n, s.k};
      auto run = [&, T = T] {
        if (p == "simt")
          cuda::gemv_bf16_simt(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
        else if (p == "mma")
          cuda::gemv_bf16_mma(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
        else
          gemm.linear(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
      };
      const double us = bench::median_call_us(st, e0, e1, 20, run);
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
