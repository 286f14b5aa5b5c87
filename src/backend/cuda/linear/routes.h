// The GEMV route table: which kernel runs each decode projection when a Gemm
// takes the GEMV path (T <= Gemm::gemv_max_rows(), ops.h). Data, not a
// switch: production has this one table, and a route that wins an A/B later
// replaces its entry here (docs/design.md "The plan table and no switches in
// src").
//
// Measured in the engine (batch 1 1K fp8 with CUDA graphs, one route
// changed at a time): the SIMT GEMV on every projection was at least as fast
// as the mma GEMV and cuBLASLt (bench_linear's standalone wins for mma on qkv
// / o_proj and cuBLASLt on down did not carry over to the PDL chain). The
// projections whose SIMT GEMV was furthest from copy bandwidth (qkv 0.79,
// o_proj 0.63, down 0.66 of it) split K over several warps per output
// column: qkv and o_proj by gemv_simt_auto_split's choice (4 warps at the 8B
// shape), down over 8 (the best of 1, 2, auto and 8 warps and cuBLASLt):
// 4.586 ms/step against 4.769 with gemv_bf16's own choice everywhere.
// docs/cuda_backend.md "The GEMV route table".
#pragma once
#include <array>
#include <cstdint>

namespace fp8kv::cuda {

enum class LinearProj : uint8_t { qkv, o_proj, gate_up, down, lm_head };
inline constexpr int kNumLinearProj = 5;

enum class GemvKernel : uint8_t {
  lt,           // cuBLASLt (every call past the GEMV rows)
  simt_or_mma,  // gemv_bf16's own choice: SIMT below kGemvMmaMinRows rows, else mma
  simt_split,   // gemv_bf16_simt_split, K split as gemv_simt_auto_split picks
  simt_split8,  // gemv_bf16_simt_split, K split over 8 warps
};

inline constexpr std::array<GemvKernel, kNumLinearProj> kGemvRoutes = {
    GemvKernel::simt_split,   // qkv
    GemvKernel::simt_split,   // o_proj
    GemvKernel::simt_or_mma,  // gate_up (at 1-2 rows fused with the activation: CudaBackend::linear_gated_act)
    GemvKernel::simt_split8,  // down
    GemvKernel::simt_or_mma,  // lm_head
};
inline constexpr GemvKernel gemv_route(LinearProj p) { return kGemvRoutes[static_cast<size_t>(p)]; }

// fp8 weights in W8A8 mode (--fp8-weight-mode w8a8): calls of at least this
// many rows quantize their activations to e4m3 and run the cuBLASLt FP8 GEMM
// (Gemm::linear_w8a8); fewer rows (decode) keep the fp8 GEMV, which reads the
// same e4m3 weights with bf16 activations (W8A16 numerics; a quantization
// kernel would only add a launch). 9: past the fp8 GEMV's rows (kGemvMaxRows,
// ops.h), where W8A16 runs the dequantized slices through bf16 cuBLASLt.
inline constexpr int kW8a8MinRows = 9;

}  // namespace fp8kv::cuda
