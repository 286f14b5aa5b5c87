// Argument checks shared by the CPU backend's ops (cpu_backend.cpp,
// cpu_backend_gdn.cpp): errors name the op and the tensor with its shape.
#pragma once
#include <string>

#include <fmt/format.h>

#include "backend/common/op_checks.h"
#include "backend/tensor.h"

namespace fp8kv::cpu_op {

using op_checks::shape;

[[noreturn]] inline void bad(const char* op, const std::string& what) { op_checks::bad("CpuBackend", op, what); }

// t's data as f32; invalid_argument naming the op when t is not f32.
inline float* f32(const Tensor& t, const char* op, const char* name) {
  if (t.dtype != ScalarType::f32) bad(op, fmt::format("{} must be f32, got {}", name, shape(t)));
  return static_cast<float*>(t.data);
}

}  // namespace fp8kv::cpu_op
