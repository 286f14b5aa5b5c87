// FP8 (e4m3) weight matrices with their scales, as FP8-weight checkpoints
// ship them (docs/design.md "FP8-weight checkpoints"), and the two ways a
// linear layer computes with them.
//
// A weight W [N][K] (out x in) is stored as e4m3 bytes q [N][K] plus f32
// scales; the real weight is W[r][c] = e4m3(q[r][c]) * scale(r, c), one fp32
// multiply, where scale(r, c) is
//   tensor:   s[0]                          (scales [1])
//   channel:  s[r]                          (scales [N])
//   block128: s[(r / 128) * ceil(K / 128) + c / 128]   (scales [ceil(N/128)][ceil(K/128)])
#pragma once
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace fp8kv {

enum class ScaleGranularity : uint8_t { tensor, channel, block128 };
inline constexpr int64_t kFp8WeightBlock = 128;

// "tensor" | "channel" | "block 128x128".
std::string_view scale_granularity_name(ScaleGranularity g);

// The scale array's shape [rows][cols] for a weight [N][K]: tensor [1][1],
// channel [N][1], block128 [ceil(N/128)][ceil(K/128)].
std::pair<int64_t, int64_t> fp8_scale_shape(ScaleGranularity g, int64_t N, int64_t K);

// How a linear layer uses an fp8 weight (--fp8-weight-mode):
//   w8a16: the weight is dequantized tile by tile inside the GEMM (fp32 math);
//          activations stay as they are (the reference).
//   w8a8:  activations are first quantized dynamically to e4m3 (per token, or
//          per 1x128 group for block128 weights: scale = amax / 448,
//          saturating), as vLLM and SGLang run these checkpoints.
enum class Fp8Compute : uint8_t { w8a16, w8a8 };
std::string_view fp8_compute_name(Fp8Compute c);  // "w8a16" | "w8a8"

// The scales of one fp8 weight as a backend sees them (not owned).
struct Fp8WeightScales {
  const float* data = nullptr;  // shape fp8_scale_shape(granularity, N, K)
  ScaleGranularity granularity = ScaleGranularity::tensor;
  Fp8Compute compute = Fp8Compute::w8a16;
  // A device backend's copy of the same scales in the layout its W8A8 GEMM
  // reads (CUDA: cuBLASLt's, backend/cuda/ops/ops.h DeviceMatrix::w8a8_scale);
  // null: none (the CPU, W8A16, or a matrix that runs W8A16 anyway).
  const float* gemm = nullptr;
  // With gemm: the stride of the e4m3 rows in bytes when that backend padded
  // them (CUDA W8A8: K rounded up to a multiple of 16, zero columns); 0: K.
  int64_t gemm_ld = 0;
};

// Rows [r0, r0 + n) of an fp8 weight [N][K] dequantized to fp32:
// out [n][K] = e4m3(q) * scale(r, c).
void dequantize_fp8_weight_rows(const uint8_t* q, const Fp8WeightScales& s, int64_t N, int64_t K, int64_t r0,
                                int64_t n, float* out);

// W8A8's activation rounding, in place: each row of x [T][K] is cut into
// groups of `group` columns (the last one may be shorter); each group is
// quantized with scale amax / 448 (stored = saturate(rne(x / scale)), an
// IEEE fp32 division) and replaced by stored * scale. A group of zeros stays
// zero. The fp8 GEMM's products e4m3 x e4m3 are exact in fp32, so a W8A16
// GEMM on these values computes what an fp8 GEMM with fp32 accumulation does.
void round_activations_e4m3(float* x, int64_t T, int64_t K, int64_t group);

// The same rule as codes and scales (what an fp8 GEMM reads): q [T][K] e4m3
// codes and scales [T][ceil(K / group)], group (t, g) covering columns
// [g * group, min(K, (g + 1) * group)) of row t: scale = amax / 448 (IEEE
// fp32 division, amax ignoring NaNs), q = f32_to_e4m3(x / scale). A group
// whose amax is not > 0 (zeros, or NaNs only) gets scale 1 and q =
// f32_to_e4m3(x) (0x00 / 0x80 for +-0, 0x7f for NaN), so e4m3(q) * scale is
// what round_activations_e4m3 leaves there. For every other group
// e4m3_to_f32(q) * scale is bitwise round_activations_e4m3's value. The CUDA
// W8A8 path (backend/cuda/linear/w8a8_quant.cu) mirrors this function.
void quantize_activations_e4m3(const float* x, int64_t T, int64_t K, int64_t group, uint8_t* q, float* scales);

// The activation group of a weight in W8A8: 128 for block128, K (per token) otherwise.
inline int64_t fp8_activation_group(ScaleGranularity g, int64_t K) {
  return g == ScaleGranularity::block128 ? kFp8WeightBlock : K;
}

// Quantizes W [N][K] (fp32) to e4m3 with scale amax / 448 per tensor,
// channel or 128x128 block (1 where the block is all zeros), as the
// checkpoints' producers do. For dummy weights and tests.
// A weight scale from its cell's amax: amax / 448, or 1 for an all-zero cell
// (scales stay > 0). quantize_weight_e4m3's rule; stored = e4m3(w / scale).
float fp8_scale_from_amax(float amax);

struct Fp8QuantizedWeight {
  std::vector<uint8_t> q;     // [N][K]
  std::vector<float> scales;  // fp8_scale_shape(g, N, K)
};
Fp8QuantizedWeight quantize_weight_e4m3(const float* w, int64_t N, int64_t K, ScaleGranularity g);

}  // namespace fp8kv
