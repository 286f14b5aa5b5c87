// The decode plan table: which kernel runs each (head_dim, cache dtype).
// paged_decode's launch and plan_decode's occupancy query both read it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kv/layout.h"

namespace fp8kv::cuda::decode {

// How a decode kernel feeds its MMAs (decode_body.cuh).
enum class DecodeLoop : uint8_t {
  ring,         // per-warp cp.async ring of tile stages in shared memory
  reg,          // register-staged tiles
  fast,         // register-staged tiles, fewer instructions per tile (FAST)
  fast_refill,  // FAST with one register stage refilled as it frees (F4)
};

// One decode kernel instantiation: decode_kernel<D, DT, loop, stages, min_ctas>.
struct DecodeKernelSpec {
  DecodeLoop loop;
  int stages;    // register tiles in flight: 2 = the next tile loads during this one's math (ring: 0)
  int min_ctas;  // __launch_bounds__ CTAs per SM (0: none, the registers decide)
  constexpr bool operator==(const DecodeKernelSpec&) const = default;
};

struct DecodePlanRow {
  int head_dim;
  KvDtype dtype;
  DecodeKernelSpec kernel;  // grids of up to one wave of it
  DecodeKernelSpec wide;    // grids of more than one wave of `kernel` (== kernel: the same one)
  const char* why;
};

inline constexpr DecodeKernelSpec kFast3{DecodeLoop::fast, 2, 3};
inline constexpr DecodeKernelSpec kFast2{DecodeLoop::fast, 2, 2};
inline constexpr DecodeKernelSpec kFastOneStage{DecodeLoop::fast, 1, 2};
inline constexpr DecodeKernelSpec kF4{DecodeLoop::fast_refill, 1, 4};
inline constexpr DecodeKernelSpec kReg2{DecodeLoop::reg, 2, 0};
inline constexpr DecodeKernelSpec kReg1{DecodeLoop::reg, 1, 0};
inline constexpr DecodeKernelSpec kRing{DecodeLoop::ring, 0, 0};

// Measured figures: docs/cuda.md (decode). A fallback row (reg, ring) is a
// case the FAST loop does not cover as measured.
inline constexpr DecodePlanRow kDecodePlan[] = {
    {128, KvDtype::fp8_e4m3, kFast3, kF4,
     "FAST, 3 CTAs/SM; beyond one wave of it, F4 (4 CTAs/SM: 16 warps per SM stream faster than 12; the plan is "
     "made for 4 CTAs/SM then)"},
    {128, KvDtype::bf16, kFast2, kFast2, "FAST with the next tile in registers (~200 registers: 2 CTAs/SM)"},
    {128, KvDtype::fp8_e5m2, kReg2, kReg2, "fallback: the reg loop (FAST for e5m2 was never measured as a default)"},
    {256, KvDtype::fp8_e4m3, kFastOneStage, kFastOneStage,
     "FAST, one register tile (256-byte rows: a second stage would not fit)"},
    {256, KvDtype::fp8_e5m2, kReg1, kReg1, "fallback: the reg loop, one register tile (FAST for e5m2 unmeasured)"},
    {256, KvDtype::bf16, kRing, kRing,
     "fallback: the cp.async ring (a 512-byte register tile per key row would spill)"},
    {64, KvDtype::fp8_e4m3, kReg2, kReg2, "fallback: the reg loop (FAST at D = 64 was never measured as a default)"},
    {64, KvDtype::fp8_e5m2, kReg2, kReg2, "fallback: the reg loop (as fp8 e4m3 d64)"},
    {64, KvDtype::bf16, kReg2, kReg2, "fallback: the reg loop (as fp8 e4m3 d64)"},
    // Per-token-head (K scale on the score, V scale folded into P): fp8 e4m3's kernels.
    {128, KvDtype::fp8_e4m3_pth, kFast3, kF4, "as fp8 e4m3 d128 (FAST / F4), plus one scale load per lane per tile"},
    {128, KvDtype::int8_pth, kFast3, kF4, "as fp8 e4m3 d128; int8 -> f16 by the magic-number trick (exact)"},
    {256, KvDtype::fp8_e4m3_pth, kFastOneStage, kFastOneStage, "as fp8 e4m3 d256"},
    {256, KvDtype::int8_pth, kFastOneStage, kFastOneStage, "as fp8 e4m3 d256"},
    {64, KvDtype::fp8_e4m3_pth, kReg2, kReg2, "fallback: the reg loop (as fp8 e4m3 d64)"},
    {64, KvDtype::int8_pth, kReg2, kReg2, "fallback: the reg loop (as fp8 e4m3 d64)"},
};
inline constexpr int kDecodePlanRows = static_cast<int>(sizeof(kDecodePlan) / sizeof(kDecodePlan[0]));

// The row of (head_dim, dtype); -1 when the table has none.
constexpr int decode_plan_row(int head_dim, KvDtype dtype) {
  for (int i = 0; i < kDecodePlanRows; ++i)
    if (kDecodePlan[i].head_dim == head_dim && kDecodePlan[i].dtype == dtype) return i;
  return -1;
}

struct DecodeParams;
struct DecodePthParams;

// decode_kernels.cu: row `row`'s kernel (wide: its `wide` kernel) launched on
// `grid` with kWarps * 32 threads (p: DecodeParams plus, for the per-token-head
// rows, their scale arrays), and its resident CTAs per SM on the current
// device (occupancy API, cached per device; 0 when no device answers).
void launch_decode_kernel(int row, bool wide, const DecodePthParams& p, dim3 grid, cudaStream_t stream);
int decode_resident_ctas(int row, bool wide);

// decode_reduce.cu: the split combine of a launch with p.max_splits > 1.
void launch_decode_reduce(const DecodeParams& p, int head_dim, int batch, cudaStream_t stream);

}  // namespace fp8kv::cuda::decode
