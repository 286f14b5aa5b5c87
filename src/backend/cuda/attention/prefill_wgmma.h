// The Hopper wgmma prefill kernel (head_dim 128) and its building-block
// self-tests. Internal to the CUDA backend: callers use paged_prefill
// (kernels.h), which routes here per PrefillArgs::kernel / FP8KV_PREFILL.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cuda/attention/attention.h"

namespace fp8kv::cuda {

// True when the wgmma kernel handles this shape (head_dim 128, any cache
// dtype, window, softcap, scale mode); otherwise paged_prefill runs mma.sync.
bool prefill_wgmma_supports(const PrefillArgs& a);
// Launches the wgmma kernel (arguments validated by paged_prefill).
void paged_prefill_wgmma(const PrefillArgs& a, cudaStream_t stream);

// Building-block tests (synchronous, host vectors in/out; tests/cuda).
// dtype_f16: operands are f16 bits (the fp8-cache path), else bf16 bits.
// S = Q K^T: q [64][128], k [64][128] (row-major 16-bit) -> s [64][64] f32,
// one warpgroup, 8 x wgmma m64n64k16 with both operands in swizzled smem.
std::vector<float> wgmma_selftest_qk(const std::vector<uint16_t>& q, const std::vector<uint16_t>& k, bool dtype_f16);
// O = P V: p [64][64], v [64][128] (row-major 16-bit) -> o [64][128] f32,
// 4 x wgmma m64n128k16 with A = P in registers, B = V N-major (transposed).
// swap_offsets: the N-major descriptor with LBO and SBO exchanged (diagnostic:
// the test reports whether that alternative matches when the real one fails).
std::vector<float> wgmma_selftest_pv(const std::vector<uint16_t>& p, const std::vector<uint16_t>& v, bool dtype_f16,
                                     bool swap_offsets = false);

}  // namespace fp8kv::cuda
