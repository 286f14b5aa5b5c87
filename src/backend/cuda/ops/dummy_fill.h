// `--load-format dummy` on the device (docs/cuda_backend.md "Startup"): the dummy matrices of engine/dummy_weights.cpp generated
// straight into device memory (same counter hash, same Box-Muller), so an
// 8B-shape benchmark does not spend seconds of host math and a 16 GB upload.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace fp8kv::cuda {

// dst[i] = element i of the dummy matrix whose key is `key` (dummy_weights.cpp
// dummy_element: pair i / 2 hashed, Box-Muller, times std, bf16 RNE), for
// i < n. u1, u2, the products and sqrt are the host's fp32 operations;
// log, cos and sin are computed in double and rounded to fp32 (correctly
// rounded), where the host calls glibc's fp32 functions (< 1 ulp, nearly
// always correctly rounded): an element can differ from the host's by one
// bf16 ulp where the two disagree (tests/cuda_ops: counted, rare).
void dummy_fill_bf16(uint16_t* dst, uint64_t key, int64_t n, float std, cudaStream_t stream);

// An fp8 dummy matrix (engine/dummy_weights.h kDummyFp8Sigmas): the same
// normals as dummy_fill_bf16, divided by `scale` and rounded to e4m3 (RNE,
// saturating).
void dummy_fill_e4m3(uint8_t* dst, uint64_t key, int64_t n, float std, float scale, cudaStream_t stream);

}  // namespace fp8kv::cuda
