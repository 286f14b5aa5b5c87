// Argument checks and small conversions the CudaBackend files share
// (cuda_backend.cpp, cuda_weights.cpp, cuda_forward.cpp, cuda_sample.cpp):
// each names the op and the tensor that failed and its shape.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "backend/common/op_checks.h"
#include "backend/cuda/ops/ops.h"
#include "backend/cuda/prefill_profile.h"
#include "backend/tensor.h"

namespace fp8kv::cuda_checks {

using op_checks::shape;

[[noreturn]] inline void bad(const char* op, const std::string& what) { op_checks::bad("CudaBackend", op, what); }

inline float* f32(const Tensor& t, const char* op, const char* name) {
  if (t.dtype != ScalarType::f32) bad(op, fmt::format("{} must be f32, got {}", name, shape(t)));
  if (!t.data && t.numel() > 0) bad(op, fmt::format("{} is empty", name));
  return static_cast<float*>(t.data);
}

// An optional fp32 vector of n elements (bias, norm weight): null when empty.
inline const float* opt_vec(const Tensor& t, int64_t n, const char* op, const char* name) {
  if (t.empty()) return nullptr;
  if (t.dtype != ScalarType::f32 || t.numel() != n)
    bad(op, fmt::format("{} must be f32 with {} elements, got {}", name, n, shape(t)));
  return static_cast<const float*>(t.data);
}

// A weight as the linear kernels take it: bf16, or e4m3 with its scales
// (ops.h DeviceMatrix gives the scale indexing of each granularity).
inline cuda::DeviceMatrix matrix(const Tensor& w, const char* op) {
  if (w.is_fp8_weight()) {
    cuda::DeviceMatrix m;
    m.rows = w.rows;
    m.cols = w.cols;
    m.fp8 = static_cast<const uint8_t*>(w.data);
    m.scale = w.fp8.data;
    switch (w.fp8.granularity) {
      case ScaleGranularity::tensor: break;
      case ScaleGranularity::channel: m.scale_ld = 1; break;
      case ScaleGranularity::block128:
        m.scale_row_shift = 7;
        m.scale_ld = (w.cols + kFp8WeightBlock - 1) / kFp8WeightBlock;
        m.scale_k_step = 1;
        break;
    }
    // W8A8: the upload's cuBLASLt-layout copy (cuda_weights.cpp w8a8_layout).
    if (w.fp8.compute == Fp8Compute::w8a8 && w.fp8.gemm) {
      m.w8a8_scale = w.fp8.gemm;
      m.fp8_ld = w.fp8.gemm_ld;
      if (w.fp8.granularity == ScaleGranularity::block128) m.w8a8_scale_ld = (m.scale_ld + 3) / 4 * 4;
    }
    return m;
  }
  if (w.dtype != ScalarType::bf16)
    bad(op, fmt::format("weight must be bf16 or fp8 (uploaded by this backend), got {}", shape(w)));
  return cuda::DeviceMatrix{static_cast<const uint16_t*>(w.data), w.rows, w.cols};
}

inline void same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.rows != b.rows || a.cols != b.cols) bad(op, fmt::format("shapes differ: {} vs {}", shape(a), shape(b)));
}

// The prefill profile (prefill_profile.h): a GEMM's class key (by weight
// shape; formatted only on profiled steps) and FLOPs.
inline std::string gemm_key(const cuda::PrefillProfile* p, const Tensor& w, const char* suffix = "") {
  return p && p->active() ? fmt::format("gemm N={} K={}{}", w.rows, w.cols, suffix) : std::string();
}
inline double gemm_flops(int64_t T, const Tensor& w) {
  return 2.0 * static_cast<double>(T) * static_cast<double>(w.rows) * static_cast<double>(w.cols);
}

}  // namespace fp8kv::cuda_checks
