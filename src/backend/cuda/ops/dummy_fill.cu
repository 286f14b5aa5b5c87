#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <stdexcept>

#include "backend/cuda/check.h"
#include "backend/cuda/ops/dummy_fill.h"

namespace fp8kv::cuda {

namespace {

// engine/dummy_weights.cpp mix(): splitmix64's finalizer.
__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One thread per pair j (elements 2j, 2j + 1), as the host loop.
__global__ void dummy_fill_kernel(uint16_t* dst, uint64_t key, int64_t n, float sd) {
  const int64_t pairs = (n + 1) / 2;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(key + static_cast<uint64_t>(j));
    const float u1 = __fmul_rn(static_cast<float>(h >> 40) + 1.0f, 0x1.0p-24f);      // (0, 1]
    const float u2 = __fmul_rn(static_cast<float>((h >> 8) & 0xffffffu), 0x1.0p-24f);  // [0, 1)
    const float lg = static_cast<float>(log(static_cast<double>(u1)));
    const float r = __fmul_rn(__fsqrt_rn(__fmul_rn(-2.0f, lg)), sd);
    const float a = __fmul_rn(6.2831853f, u2);
    double s, c;
    sincos(static_cast<double>(a), &s, &c);
    const float x0 = __fmul_rn(r, static_cast<float>(c)), x1 = __fmul_rn(r, static_cast<float>(s));
    const __nv_bfloat16 b0 = __float2bfloat16_rn(x0), b1 = __float2bfloat16_rn(x1);
    dst[2 * j] = *reinterpret_cast<const uint16_t*>(&b0);
    if (2 * j + 1 < n) dst[2 * j + 1] = *reinterpret_cast<const uint16_t*>(&b1);
  }
}

// The same normals as dummy_fill_kernel, times inv_scale, to e4m3 (RNE,
// saturating to +-448).
__global__ void dummy_fill_e4m3_kernel(uint8_t* dst, uint64_t key, int64_t n, float sd, float inv_scale) {
  const int64_t pairs = (n + 1) / 2;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(key + static_cast<uint64_t>(j));
    const float u1 = __fmul_rn(static_cast<float>(h >> 40) + 1.0f, 0x1.0p-24f);
    const float u2 = __fmul_rn(static_cast<float>((h >> 8) & 0xffffffu), 0x1.0p-24f);
    const float lg = static_cast<float>(log(static_cast<double>(u1)));
    const float r = __fmul_rn(__fsqrt_rn(__fmul_rn(-2.0f, lg)), sd);
    const float a = __fmul_rn(6.2831853f, u2);
    double s, c;
    sincos(static_cast<double>(a), &s, &c);
    const float x0 = __fmul_rn(__fmul_rn(r, static_cast<float>(c)), inv_scale);
    const float x1 = __fmul_rn(__fmul_rn(r, static_cast<float>(s)), inv_scale);
    dst[2 * j] = __nv_cvt_float_to_fp8(x0, __NV_SATFINITE, __NV_E4M3);
    if (2 * j + 1 < n) dst[2 * j + 1] = __nv_cvt_float_to_fp8(x1, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

void dummy_fill_e4m3(uint8_t* dst, uint64_t key, int64_t n, float std, float scale, cudaStream_t stream) {
  if (n == 0) return;
  if (!dst || n < 0 || !(scale > 0.0f)) throw std::invalid_argument("cuda::dummy_fill_e4m3: bad arguments");
  const int64_t pairs = (n + 1) / 2;
  const int64_t blocks = std::min<int64_t>((pairs + 255) / 256, 132 * 64);
  dummy_fill_e4m3_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dst, key, n, std, 1.0f / scale);
  FP8KV_CU_LAUNCH();
}

void dummy_fill_bf16(uint16_t* dst, uint64_t key, int64_t n, float std, cudaStream_t stream) {
  if (n == 0) return;
  if (!dst || n < 0) throw std::invalid_argument("cuda::dummy_fill_bf16: bad arguments");
  const int64_t pairs = (n + 1) / 2;
  const int64_t blocks = std::min<int64_t>((pairs + 255) / 256, 132 * 64);
  dummy_fill_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dst, key, n, std);
  FP8KV_CU_LAUNCH();
}

}  // namespace fp8kv::cuda
