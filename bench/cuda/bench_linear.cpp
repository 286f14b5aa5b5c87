// cuBLASLt linear (cuda::Gemm, the CUDA backend's GEMM) at decode shapes:
// how close a bf16 x bf16 -> fp32 GEMM with T = 1..32 rows comes to the copy
// bandwidth, for the Llama-3.1-8B projections (fused qkv and gate|up, as the
// CUDA backend runs them) and the LM head, next to the decode GEMV's two
// kernels (ops.h gemv_bf16_simt / gemv_bf16_mma) at T = 1..8. Prints one
// line per (shape, T, path) and the implied GEMM time of a decode step (32
// layers + LM head) per (T, path), so the step's other costs can be read off
// `fp8kv bench latency` (docs/cuda_backend.md). With "fp8", the same shapes
// as block-wise e4m3 weights (FP8-weight checkpoints, W8A16) at 1 to 8192
// rows beside bf16; "w8a8" the same weights through the W8A8 path
// (Gemm::linear_w8a8: f32 activations quantized per 1x128 group, then the
// cuBLASLt FP8 GEMM with 128x128 x 1x128 block scales) at 1, 8, 32, 256 and
// 8192 rows (at 1 and 8 the engine keeps the fp8 GEMV: these rows say what
// W8A8 would cost there), and "w8a8q" its quantization kernel alone.
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
#include "bench_util.h"

using namespace fp8kv;

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
  int per_step;  // calls per decode step
};

}  // namespace

int main(int argc, char** argv) {
  const char* json = bench::json_flag(argc, argv);
  if (bench::no_device("bench_linear")) return 0;
  const double copy = cuda::d2d_copy_bytes_per_s();
  const Shape shapes[] = {{"qkv", 6144, 4096, 32},
                          {"o_proj", 4096, 4096, 32},
                          {"gate_up", 28672, 4096, 32},
                          {"down", 4096, 14336, 32},
                          {"lm_head", 128256, 4096, 1}};
  // (T, path): cuBLASLt ("lt") at 1, 2, 4, 8, 32 rows; the decode GEMV's two
  // kernels (ops.h gemv_bf16_simt / gemv_bf16_mma) at 1, 2, 4 and 8 (where
  // each stops winning, if it does).
  // "fp8": the same shapes as block-wise e4m3 weights (128x128 f32 scales)
  // through cuda::Gemm (W8A16: the fp8 GEMV up to 8 rows, the dequantized
  // slices + cuBLASLt past them), beside bf16 at 1, 8, 32, 256 and 8192 rows
  // (past 32 rows without the LM head).
  const std::pair<int, const char*> Ts[] = {
      {1, "lt"},   {1, "simt"},  {1, "mma"},    {1, "fp8"},   {2, "lt"},   {2, "simt"},   {2, "mma"},
      {4, "lt"},   {4, "simt"},  {4, "mma"},    {8, "lt"},    {8, "simt"}, {8, "mma"},    {8, "fp8"},
      {32, "lt"},  {32, "fp8"},  {256, "lt"},   {256, "fp8"}, {8192, "lt"}, {8192, "fp8"},
      {1, "w8a8"}, {8, "w8a8"}, {32, "w8a8"}, {256, "w8a8"}, {256, "w8a8q"}, {8192, "w8a8"}, {8192, "w8a8q"}};
  constexpr int kMaxT = 8192;
  const bench::Timing tm(cudaStreamNonBlocking);
  cudaStream_t st = tm.st;
  cuda::Gemm gemm;
  // One weight buffer per shape (distinct memory: no L2 reuse across calls).
  std::vector<cuda::DeviceBuffer> w, w8, s8;
  size_t max_k = 0, max_n = 0, max_n_big = 0;
  for (const Shape& s : shapes) {
    w.emplace_back(static_cast<size_t>(s.n * s.k) * 2);
    FP8KV_CU(cudaMemset(w.back().get(), 0x3c, w.back().bytes()));  // ~0.01 in bf16
    w8.emplace_back(static_cast<size_t>(s.n * s.k));
    FP8KV_CU(cudaMemset(w8.back().get(), 0x30, w8.back().bytes()));  // 0.5 in e4m3
    const std::vector<float> scales(static_cast<size_t>(((s.n + 127) / 128) * ((s.k + 127) / 128)), 0.02f);
    s8.emplace_back(scales.size() * 4);
    s8.back().upload(scales.data(), scales.size() * 4);
    max_k = std::max<size_t>(max_k, s.k);
    max_n = std::max<size_t>(max_n, s.n);
    if (std::strcmp(s.name, "lm_head") != 0) max_n_big = std::max<size_t>(max_n_big, s.n);
  }
  gemm.reserve_fp8_scratch();
  cuda::DeviceBuffer x(kMaxT * max_k * 2), y(std::max(32 * max_n, kMaxT * max_n_big) * 4);
  FP8KV_CU(cudaMemset(x.get(), 0x3c, x.bytes()));
  // W8A8: f32 activations (what the engine's W8A8 rows get) and the codes +
  // scales scratch of the largest call.
  cuda::DeviceBuffer x32(kMaxT * max_k * 4), w8a8_scratch(cuda::Gemm::w8a8_scratch_bytes(kMaxT, max_k, true));
  FP8KV_CU(cudaMemset(x32.get(), 0x3c, x32.bytes()));  // ~0.011 in f32
  std::printf("copy bandwidth %.0f GB/s (read + write)\n", copy / 1e9);
  std::printf("%-8s %6s %6s %4s %-5s %9s %8s %7s %8s\n", "shape", "N", "K", "T", "path", "us", "GB/s", "/copy",
              "TFLOP/s");
  bench::JsonReport report(json);
  report.head("{\"copy_gbps\": %.1f, \"cases\": [\n", copy / 1e9);
  gemm.set_gemv_max_rows(0);
  for (auto [T, path] : Ts) {
    const std::string p = path;
    double step_us = 0;
    for (size_t i = 0; i < std::size(shapes); ++i) {
      const Shape& s = shapes[i];
      if (T > 32 && std::strcmp(s.name, "lm_head") == 0) continue;
      const bool w8a8 = p == "w8a8" || p == "w8a8q";
      const bool fp8 = p == "fp8" || w8a8;
      cuda::DeviceMatrix W{w[i].as<const uint16_t>(), s.n, s.k};
      if (fp8) {
        W = cuda::DeviceMatrix{nullptr, s.n, s.k, w8[i].as<const uint8_t>(), s8[i].as<const float>(), 7,
                               (s.k + 127) / 128, 1};
        // These K give ceil(K / 128) % 4 == 0: the checkpoint's block scales
        // are already cuBLASLt's layout (ops.h DeviceMatrix::w8a8_scale).
        if (w8a8) {
          W.w8a8_scale = W.scale;
          W.w8a8_scale_ld = (s.k + 127) / 128;
        }
      }
      const int64_t T4 = (T + cuda::Gemm::kW8a8Rows - 1) / cuda::Gemm::kW8a8Rows * cuda::Gemm::kW8a8Rows,
                    L = (s.k + 127) / 128;
      auto* codes = w8a8_scratch.as<uint8_t>();
      auto* act_scales = reinterpret_cast<float*>(codes + (T4 * s.k + 255) / 256 * 256);
      auto run = [&, T = T] {
        if (p == "w8a8q")
          cuda::quantize_rows_e4m3(x32.get(), true, nullptr, T, T4, s.k, s.k, 128, codes,
                                   cuda::W8a8ScaleOut{act_scales, T4, act_scales + L * T4, cuda::Gemm::kW8a8Rows}, st);
        else if (w8a8)
          gemm.linear_w8a8(cuda::Gemm::W8a8Input{x32.get(), true, nullptr}, T, W, nullptr, y.as<float>(), false, false,
                           w8a8_scratch.get(), w8a8_scratch.bytes(), st);
        else if (fp8)
          gemm.linear(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
        else if (p == "simt")
          cuda::gemv_bf16_simt(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
        else if (p == "mma")
          cuda::gemv_bf16_mma(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
        else
          gemm.linear(x.as<uint16_t>(), T, W, nullptr, y.as<float>(), false, st);
      };
      const double us = bench::median_call_us(st, tm.e0, tm.e1, 20, run);
      // Weights once plus the activations in and out (w8a8: f32 in; w8a8q:
      // f32 in, e4m3 codes out, no weights).
      const double bytes = p == "w8a8q" ? static_cast<double>(T) * s.k * 5
                                        : static_cast<double>(s.n * s.k) * (fp8 ? 1 : 2) +
                                              static_cast<double>(T) * (s.k * (w8a8 ? 4 : 2) + s.n * 4);
      const double tflops = p == "w8a8q" ? 0.0 : 2.0 * static_cast<double>(T) * s.n * s.k / (us * 1e-6) / 1e12;
      const double gbps = bytes / (us * 1e-6) / 1e9;
      std::printf("%-8s %6lld %6lld %4d %-5s %9.2f %8.0f %7.3f %8.1f\n", s.name, static_cast<long long>(s.n),
                  static_cast<long long>(s.k), T, path, us, gbps, gbps * 1e9 / copy, tflops);
      step_us += us * s.per_step;
      report.add("{\"shape\": \"%s\", \"n\": %lld, \"k\": %lld, \"t\": %d, \"path\": \"%s\", \"us\": %.3f, "
                 "\"gbps\": %.1f, \"tflops\": %.2f}",
                 s.name, static_cast<long long>(s.n), static_cast<long long>(s.k), T, path, us, gbps, tflops);
    }
    std::printf("T=%d %s: GEMMs of one 8B decode step (32 layers + LM head) %.3f ms\n", T, path, step_us / 1e3);
  }
  return 0;
}
