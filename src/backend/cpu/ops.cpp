#include "backend/cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "numerics/fp8.h"

namespace fp8kv {

namespace {
// Output rows per GEMM tile. Fixed (never derived from the thread count), so
// every output element is computed by the same sgemm call whatever the
// number of threads.
constexpr int64_t kTileRows = 128;
// Tokens per sgemm call (M), padded with zeros for the last group.
constexpr int kTileTokens = 8;
// Smallest share of an element-wise loop worth a thread of its own: below
// it, waking a worker costs more than the loop (a decode step's vectors).
constexpr int64_t kElementGrain = 4096;
// Rows (of `width` values each) per chunk of a row-wise loop.
int64_t grain_for(int64_t width) { return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(width, 1)); }
}  // namespace

void set_cpu_threads(int n) {
  set_pool_threads(n);
  openblas_set_num_threads(1);
}

int cpu_threads() { return pool_threads(); }

void matrix_rows_to_f32(const MatrixRef& W, int64_t r0, int64_t n, float* out) {
  const int64_t count = n * W.cols;
  if (W.type == WeightType::f32) {
    std::memcpy(out, static_cast<const float*>(W.data) + r0 * W.cols, sizeof(float) * count);
  } else if (W.type == WeightType::f8_e4m3) {
    dequantize_fp8_weight_rows(static_cast<const uint8_t*>(W.data), W.scales, W.rows, W.cols, r0, n, out);
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(W.data) + r0 * W.cols;
    for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_f32(src[i]);
  }
}

void linear_cpu(const float* x, int64_t T, const MatrixRef& W, const float* bias, float* y) {
  if (T <= 0) return;
  const int64_t rows = W.rows, cols = W.cols;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t full_m = T / kTileTokens * kTileTokens;
  parallel_for(tiles, 1, [&](int64_t tile_begin, int64_t tile_end) {
    // Per-thread scratch, kept between calls (the pool's threads live on).
    thread_local std::vector<float> buf, xpad, ypad;
    if (W.type != WeightType::f32 && buf.size() < static_cast<size_t>(kTileRows * cols))
      buf.resize(static_cast<size_t>(kTileRows * cols));
    for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
      const int64_t r0 = tile * kTileRows;
      const int n = static_cast<int>(std::min(kTileRows, rows - r0));
      const int k = static_cast<int>(cols);
      const float* w;
      if (W.type == WeightType::f32) {
        w = static_cast<const float*>(W.data) + r0 * cols;
      } else {
        matrix_rows_to_f32(W, r0, n, buf.data());
        w = buf.data();
      }
      // Every sgemm has M = kTileTokens: a token's result never depends on
      // how many tokens share the call (chunked == one-shot, batch == single).
      for (int64_t t0 = 0; t0 < full_m; t0 += kTileTokens) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kTileTokens, n, k, 1.0f, x + t0 * cols, k, w, k, 0.0f,
                    y + t0 * rows + r0, static_cast<int>(rows));
      }
      if (full_m < T) {
        const int64_t m = T - full_m;
        xpad.assign(static_cast<size_t>(kTileTokens * cols), 0.0f);
        ypad.resize(static_cast<size_t>(kTileTokens) * n);
        std::memcpy(xpad.data(), x + full_m * cols, sizeof(float) * m * cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kTileTokens, n, k, 1.0f, xpad.data(), k, w, k, 0.0f,
                    ypad.data(), n);
        for (int64_t t = 0; t < m; ++t)
          std::memcpy(y + (full_m + t) * rows + r0, ypad.data() + t * n, sizeof(float) * n);
      }
      if (bias) {
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = 0; r < n; ++r) y[t * rows + r0 + r] += bias[r0 + r];
      }
    }
  });
}

void rmsnorm_cpu(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* y) {
  parallel_for(rows, grain_for(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * n;
      float* yr = y + r * n;
      float ss = 0.0f;
      for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * inv) * w[i];
    }
  });
}

void rope_cpu(float* x, int64_t T, int heads, int head_dim, int rot_dim, const float* cos, const float* sin) {
  const int half = rot_dim / 2;
  parallel_for(T, grain_for(static_cast<int64_t>(heads) * rot_dim), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      for (int h = 0; h < heads; ++h) {
        float* v = x + (t * heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          // HF: q * cos + rotate_half(q) * sin, rotate_half(q) = [-q2, q1].
          const float lo = a * c[i] + (-b) * s[i];
          const float hi = b * c[i] + a * s[i];
          v[i] = lo;
          v[i + half] = hi;
        }
      }
    }
  });
}

void gated_act_cpu(Activation act, const float* gate, const float* up, float* out, int64_t n) {
  switch (act) {
    case Activation::silu:
      parallel_for(n, kElementGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const float g = gate[i];
          out[i] = (g / (1.0f + std::exp(-g))) * up[i];
        }
      });
      break;
    case Activation::gelu_tanh: {
      const float k0 = 0.7978845608028654f;  // sqrt(2/pi)
      parallel_for(n, kElementGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const float g = gate[i];
          const float inner = k0 * (g + 0.044715f * g * g * g);
          out[i] = (0.5f * g * (1.0f + std::tanh(inner))) * up[i];
        }
      });
      break;
    }
    case Activation::gelu:
      parallel_for(n, kElementGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const float g = gate[i];
          out[i] = (0.5f * g * (1.0f + std::erf(g * 0.7071067811865476f))) * up[i];
        }
      });
      break;
  }
}

void embedding_cpu(const MatrixRef& E, const int* ids, int64_t T, float scale, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= E.rows) throw std::out_of_range("embedding_cpu: token id outside the vocabulary");
  }
  parallel_for(T, grain_for(E.cols), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* o = out + t * E.cols;
      matrix_rows_to_f32(E, ids[t], 1, o);
      if (scale != 1.0f)
        for (int64_t i = 0; i < E.cols; ++i) o[i] *= scale;
    }
  });
}

void add_inplace_cpu(float* x, const float* y, int64_t n) {
  parallel_for(n, 4 * kElementGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
  });
}

}  // namespace fp8kv
