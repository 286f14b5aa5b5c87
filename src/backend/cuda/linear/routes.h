// Which kernel runs each decode projection when a Gemm takes the GEMV path
// (T <= Gemm::gemv_max_rows(), ops.h): cuBLASLt, the SIMT GEMV or the
// tensor-core (mma) GEMV, chosen per projection because the fastest one
// could differ by shape (bench_linear: mma for qkv / o_proj, cuBLASLt for
// down at T = 1; in the engine the SIMT kernels won everywhere).
// docs/cuda_backend.md "The GEMV route table".
//
// Production runs kDefaultLinearRoutes. A plain C++ header (no CUDA types),
// so that `fp8kv bench latency --gemv-routes` can time other route sets
// against it in one process; nothing else changes the routes.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace fp8kv::cuda {

enum class LinearProj : uint8_t { qkv, o_proj, gate_up, down, lm_head };
inline constexpr int kNumLinearProj = 5;
// auto: gemv_bf16's own choice (SIMT below kGemvMmaMinRows rows, else mma).
// simt2 / simt4 / simt8: the SIMT kernel with K split over 2 / 4 / 8 warps per
// output column; simtk: the split gemv_simt_auto_split picks for the shape
// (ops.h gemv_bf16_simt_split).
enum class GemvKernel : uint8_t { auto_, lt, simt, mma, simt2, simt4, simt8, simtk };

struct LinearRoutes {
  std::array<GemvKernel, kNumLinearProj> kernel{};  // all auto
  // Not a GEMM, but switched the same way: the KV store fused into the
  // qkv split kernel ("store=fused", the default) or its own kernel
  // ("store=separate"); CudaBackend::qkv_split_store.
  bool fused_store = true;
  // The gated activation fused into the gate|up GEMV at T <= 2 ("act=fused",
  // the default) or its own kernel ("act=separate");
  // CudaBackend::linear_gated_act.
  bool fused_act = true;
  // Logits rows + sampling inside the decode step's CUDA graph
  // ("sample=graph", the default) or after it ("sample=separate");
  // CudaBackend::samples_in_step (docs/cuda_backend.md "CUDA graphs").
  bool sample_in_graph = true;
  // Not a GEMM either: keys per split of the decode attention plan
  // ("dsplit=N", N > 0 rounded up to 64 by plan_decode), or 0: plan_decode's
  // own choice (fill the GPU; the default). For A/B sweeps of the
  // short-context split (CudaBackend::attention).
  int decode_split_tokens = 0;
  // fp8 weights in W8A8 mode (--fp8-weight-mode w8a8): calls of at least
  // this many rows quantize their activations to e4m3 and run the cuBLASLt
  // FP8 GEMM (Gemm::linear_w8a8, "w8a8rows=N"); fewer rows (decode) keep
  // the fp8 GEMV, which reads the same e4m3 weights with bf16 activations
  // (W8A16 numerics; a quantization kernel would only add a launch). 9:
  // past the fp8 GEMV's rows (kGemvMaxRows, ops.h), where W8A16 runs the
  // dequantized slices through bf16 cuBLASLt.
  int w8a8_min_rows = 9;
  GemvKernel of(LinearProj p) const { return kernel[static_cast<size_t>(p)]; }
  bool operator==(const LinearRoutes&) const = default;
};

// "qkv=mma,o_proj=mma,gate_up=simt,down=lt,lm_head=auto,store=fused" (any
// subset; the rest auto / fused; "" or "default": kDefaultLinearRoutes);
// also act=, sample=, dsplit= and w8a8rows= (1..1048576) above.
// Throws InputError naming `source` and the bad entry.
LinearRoutes parse_linear_routes(std::string_view spec, std::string_view source);
std::string linear_routes_string(const LinearRoutes& r);

// The built-in default (the per-projection winners measured in the engine).
extern const char* const kDefaultLinearRoutes;

// Process-wide routes every Gemm follows: kDefaultLinearRoutes until
// set_linear_routes (bench --gemv-routes, tests) replaces them and bumps
// linear_routes_generation(), which invalidates captured CUDA graphs
// (CudaBackend re-captures with the new kernels).
LinearRoutes linear_routes();
void set_linear_routes(const LinearRoutes& r);
uint64_t linear_routes_generation();

}  // namespace fp8kv::cuda
