// CPU reference ops for the forward pass: fp32 math, weights fp32, bf16 or
// fp8 e4m3 with scales (bf16 and fp8 converted per use, tile by tile: an fp8
// element becomes e4m3(q) * scale, one fp32 multiply). Every op parallelizes over
// independent outputs only, with a fixed reduction order, so results do not
// depend on the thread count.
#pragma once
#include <cstdint>

#include "backend/common/host_matrix.h"  // MatrixRef, WeightType
#include "backend/tensor.h"                // Activation

namespace fp8kv {

// Sets the thread count of the ops on the calling thread (n <= 0: the CPUs
// available, backend/cpu/thread_pool.h) and
// keeps OpenBLAS single-threaded inside our own parallel loops.
void set_cpu_threads(int n);
int cpu_threads();

// y[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r]). x: [T][W.cols], y: [T][W.rows].
// W is split into fixed tiles of output rows (independent of the thread
// count); each tile is one single-threaded sgemm.
void linear_cpu(const float* x, int64_t T, const MatrixRef& W, const float* bias, float* y);

// y = x * rsqrt(mean(x^2) + eps) * w, per row of n elements (w already holds
// 1 + w for Gemma-style norms). y may alias x.
void rmsnorm_cpu(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* y);

// Rotary embedding (rotate_half / NeoX convention, as Hugging Face): for each
// token t and head h, the first rot_dim dims of x[t][h] are rotated by
// cos/sin [T][rot_dim/2]; the remaining dims pass through.
void rope_cpu(float* x, int64_t T, int heads, int head_dim, int rot_dim, const float* cos, const float* sin);

// out[i] = act(gate[i]) * up[i] for [T][n] operands (row strides given).
void gated_act_cpu(Activation act, const float* gate, const float* up, float* out, int64_t n);

// out[t] = E[ids[t]] * scale (fp32).
void embedding_cpu(const MatrixRef& E, const int* ids, int64_t T, float scale, float* out);

// x[i] += y[i].
void add_inplace_cpu(float* x, const float* y, int64_t n);

// Converts rows [r0, r0 + n) of W to fp32 (out: [n][W.cols]).
void matrix_rows_to_f32(const MatrixRef& W, int64_t r0, int64_t n, float* out);

}  // namespace fp8kv
