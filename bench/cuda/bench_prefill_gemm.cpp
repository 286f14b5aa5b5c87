// cuBLASLt (cuda::Gemm, the CUDA backend's GEMM) at prefill shapes: the
// Llama-3.1-8B projections (fused qkv and gate|up, as the CUDA backend runs
// them) with T = 8192 rows by default, bf16 inputs, fp32 output (and bf16
// output for gate|up, as the engine's prefill runs it), with cuBLASLt's
// first heuristic algorithm (the engine's choice; timing the first 16
// candidates instead gained at most 0.2% at TTFT 8K and was removed). A
// square 8192^3 GEMM with bf16 output gives the attainable peak on this box
// next to the 790 TFLOP/s. Prints one line per (shape, T) with us
// and TFLOP/s, and the implied GEMM time of one prefill (32 layers) per T
// (docs/cuda_backend.md "Prefill/TTFT"); then W8A16 (block-wise e4m3
// weights) at three dequantization slice sizes. The q35_ rows are the Qwen3.5-27B
// text model's projections (reference only, not in the 32-layer total).
//   bench_prefill_gemm [--t 8192,1024] [--json FILE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <string>
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
  bool bf16_out;
  int per_prefill;  // calls per prefill step (32 layers); 0: reference only
};

}  // namespace

int main(int argc, char** argv) {
  const char* json = bench::json_flag(argc, argv);
  std::vector<int64_t> Ts = {8192};
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--t") == 0) {
      Ts.clear();
      for (const char* p = argv[i + 1]; *p;) {
        Ts.push_back(std::strtoll(p, nullptr, 10));
        p = std::strchr(p, ',');
        if (!p) break;
        ++p;
      }
    }
  }
  if (bench::no_device("bench_prefill_gemm")) return 0;
  const Shape shapes[] = {{"qkv", 6144, 4096, false, 32},        {"o_proj", 4096, 4096, false, 32},
                          {"gate_up", 28672, 4096, false, 32},   {"gate_up_bf16", 28672, 4096, true, 0},
                          {"down", 4096, 14336, false, 32},      {"square_bf16", 8192, 8192, true, 0},
                          // Qwen3.5-27B (reference only): the Gated DeltaNet input projections
                          // apart and fused (qkv|z|b|a: 16480 rows; 16512: padded to 129 x 128).
                          {"q35_in_qkv", 10240, 5120, false, 0}, {"q35_in_z", 6144, 5120, false, 0},
                          {"q35_in_b", 48, 5120, false, 0},      {"q35_in_ba", 96, 5120, false, 0},
                          {"q35_in_qkvz", 16384, 5120, false, 0}, {"q35_in_all", 16480, 5120, false, 0},
                          {"q35_in_all_pad", 16512, 5120, false, 0}, {"q35_q_gate", 12288, 5120, false, 0},
                          {"q35_out_proj", 5120, 6144, false, 0}, {"q35_gate_up_bf16", 34816, 5120, true, 0},
                          {"q35_down", 5120, 17408, false, 0}};
  int64_t max_t = 8192;
  for (int64_t t : Ts) max_t = std::max(max_t, t);
  const bench::Timing tm(cudaStreamNonBlocking);
  cudaStream_t st = tm.st;
  cuda::Gemm g;
  g.set_gemv_max_rows(0);
  size_t max_k = 0, max_n = 0, max_w = 0;
  for (const Shape& s : shapes) {
    max_k = std::max<size_t>(max_k, s.k);
    max_n = std::max<size_t>(max_n, s.n);
    max_w = std::max<size_t>(max_w, s.n * s.k);
  }
  cuda::DeviceBuffer w(max_w * 2), x(static_cast<size_t>(max_t) * max_k * 2), y(static_cast<size_t>(max_t) * max_n * 4);
  // Random operands (uniform, |w| < 0.035 like the dummy weights' N(0, 0.02),
  // |x| < 2 like normed activations): tensor-core power, and so the clock,
  // depends on the bits; a constant fill would overstate the throughput.
  auto fill = [](cuda::DeviceBuffer& b, uint16_t exp_hi) {
    std::vector<uint16_t> h(b.bytes() / 2);
    uint64_t s = 0x9E3779B97F4A7C15ull ^ exp_hi;
    for (auto& v : h) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
      // sign, exponent in [exp_hi - 7, exp_hi], random 7-bit mantissa
      v = static_cast<uint16_t>(((s >> 63) << 15) | ((exp_hi - ((s >> 20) & 7)) << 7) | ((s >> 32) & 0x7f));
    }
    FP8KV_CU(cudaMemcpy(b.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  };
  fill(w, 122);  // 2^-5 = 0.031 and below
  fill(x, 127);  // 1.x and below
  bench::JsonReport report(json);
  report.head("{\"cases\": [\n");
  std::printf("%-13s %6s %6s %6s %10s %8s\n", "shape", "T", "N", "K", "us", "TFLOP/s");
  // Median us of one call of W [s.n][s.k] on `rows` rows through gm (bf16 out for s.bf16_out).
  auto time_gemm = [&](cuda::Gemm& gm, const cuda::DeviceMatrix& W, const Shape& s, int64_t rows) {
    return bench::median_call_us(st, tm.e0, tm.e1, 5, [&] {
      if (s.bf16_out)
        gm.linear_bf16_out(x.as<uint16_t>(), rows, W, y.as<uint16_t>(), st);
      else
        gm.linear(x.as<uint16_t>(), rows, W, nullptr, y.as<float>(), false, st);
    });
  };
  for (int64_t T : Ts) {
    double prefill_us = 0;
    for (const Shape& s : shapes) {
      const int64_t rows = std::string(s.name) == "square_bf16" ? 8192 : T;
      if (std::string(s.name) == "square_bf16" && T != Ts.front()) continue;
      const double us = time_gemm(g, cuda::DeviceMatrix{w.as<const uint16_t>(), s.n, s.k}, s, rows);
      const double tflops = 2.0 * rows * s.n * s.k / (us * 1e-6) / 1e12;
      std::printf("%-13s %6lld %6lld %6lld %10.1f %8.1f\n", s.name, static_cast<long long>(rows),
                  static_cast<long long>(s.n), static_cast<long long>(s.k), us, tflops);
      prefill_us += us * s.per_prefill;
      report.add("{\"shape\": \"%s\", \"t\": %lld, \"n\": %lld, \"k\": %lld, \"us\": %.3f, \"tflops\": %.2f}",
                 s.name, static_cast<long long>(rows), static_cast<long long>(s.n), static_cast<long long>(s.k), us,
                 tflops);
    }
    std::printf("T=%lld: GEMMs of one prefill step (32 layers, fp32 out) %.2f ms\n", static_cast<long long>(T),
                prefill_us / 1e3);
  }
  // W8A16 (block-wise e4m3 weights past the GEMV rows: dequantized slices,
  // one cuBLASLt GEMM each) at slice sizes of 8M (the engine's), 32M and
  // 128M elements, the first T, beside the bf16 weights' time above.
  const Shape fp8_shapes[] = {{"gate_up_bf16", 28672, 4096, true, 0},   {"down", 4096, 14336, false, 0},
                              {"q35_in_qkv", 10240, 5120, false, 0},      {"q35_gate_up_bf16", 34816, 5120, true, 0},
                              {"q35_down", 5120, 17408, false, 0}};
  cuda::DeviceBuffer w8(max_w), s8(max_w / (128 * 128) * 4 + 4096);
  FP8KV_CU(cudaMemset(w8.get(), 0x30, w8.bytes()));  // 0.5 in e4m3
  {
    const std::vector<float> sc(s8.bytes() / 4, 0.02f);
    s8.upload(sc.data(), sc.size() * 4);
  }
  std::printf("%-17s %6s %6s %6s %9s %10s %8s\n", "w8a16", "T", "N", "K", "slice", "us", "TFLOP/s");
  for (int64_t slice : {int64_t{1} << 23, int64_t{1} << 25, int64_t{1} << 27}) {
    cuda::Gemm gs;
    gs.set_gemv_max_rows(0);
    gs.set_dequant_slice_elems(slice);
    gs.reserve_fp8_scratch();
    const int64_t rows = Ts.front();
    for (const Shape& s : fp8_shapes) {
      const cuda::DeviceMatrix W{nullptr, s.n, s.k, w8.as<const uint8_t>(), s8.as<const float>(), 7, (s.k + 127) / 128,
                                 1};
      const double us = time_gemm(gs, W, s, rows);
      const double tflops = 2.0 * rows * s.n * s.k / (us * 1e-6) / 1e12;
      std::printf("%-17s %6lld %6lld %6lld %8lldM %10.1f %8.1f\n", s.name, static_cast<long long>(rows),
                  static_cast<long long>(s.n), static_cast<long long>(s.k), static_cast<long long>(slice >> 20), us,
                  tflops);
      report.add("{\"shape\": \"%s w8a16\", \"t\": %lld, \"n\": %lld, \"k\": %lld, \"slice\": %lld, \"us\": %.3f, "
                 "\"tflops\": %.2f}",
                 s.name, static_cast<long long>(rows), static_cast<long long>(s.n), static_cast<long long>(s.k),
                 static_cast<long long>(slice), us, tflops);
    }
  }
  return 0;
}
