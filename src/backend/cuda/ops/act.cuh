// The gated activations' element math (act(g) * u), shared by the activation
// kernel (ops_misc.cu gated_act) and the GEMV with the activation fused
// (ops_gemv.cu gemv_gated_act_bf16), so both give the same bits.
#pragma once

#include "backend/cuda/ops/ops.h"

namespace fp8kv::cuda {

template <Activation A>
__device__ __forceinline__ float gated_act_value(float g, float u) {
  float a;
  if constexpr (A == Activation::silu) {
    a = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  } else if constexpr (A == Activation::gelu_tanh) {
    const float k0 = 0.7978845608028654f;
    const float inner = __fmul_rn(k0, __fadd_rn(g, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g)));
    a = __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner)));
  } else {
    a = __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, erff(__fmul_rn(g, 0.7071067811865476f))));
  }
  return __fmul_rn(a, u);
}

}  // namespace fp8kv::cuda
