#include "backend/cpu/gdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "numerics/fp8.h"

namespace fp8kv {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float conv_round(float x, GdnStateType st) { return st == GdnStateType::bf16 ? round_bf16(x) : x; }
float state_get(const void* s, int64_t i, GdnStateType st) {
  return st == GdnStateType::bf16 ? bf16_to_f32(static_cast<const uint16_t*>(s)[i]) : static_cast<const float*>(s)[i];
}
void state_set(void* s, int64_t i, float v, GdnStateType st) {
  if (st == GdnStateType::bf16)
    static_cast<uint16_t*>(s)[i] = f32_to_bf16(v);
  else
    static_cast<float*>(s)[i] = v;
}

// x / sqrt(sum x^2 + 1e-6) (transformers' and FLA's l2norm), then * scale.
void l2norm_into(const float* x, int n, float scale, float* y) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss + 1e-6f);
  for (int i = 0; i < n; ++i) y[i] = (x[i] * inv) * scale;
}

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The normalized q (scaled by 1/sqrt(Dk)), k and the v of token t, value head h.
struct TokenQkv {
  std::vector<float> q, k;
  const float* v = nullptr;
};
void load_token(const GdnShape& s, const float* qkv, int64_t t, int h, TokenQkv& o) {
  const int Dk = s.k_head_dim, kh = h / (s.num_v_heads / s.num_k_heads);
  const float* row = qkv + t * s.conv_dim();
  o.q.resize(Dk);
  o.k.resize(Dk);
  l2norm_into(row + static_cast<int64_t>(kh) * Dk, Dk, 1.0f / std::sqrt(static_cast<float>(Dk)), o.q.data());
  l2norm_into(row + s.key_dim() + static_cast<int64_t>(kh) * Dk, Dk, 1.0f, o.k.data());
  o.v = row + 2 * s.key_dim() + static_cast<int64_t>(h) * s.v_head_dim;
}

}  // namespace

void gdn_causal_conv(const float* x, int64_t T, int64_t C, int K, const float* w, void* state, GdnStateType st,
                     float* out) {
  const int P = K - 1;  // state length
  parallel_for(C, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      // The channel's inputs: P from the state (oldest first), then T new ones.
      std::vector<float> in(static_cast<size_t>(P + T));
      for (int i = 0; i < P; ++i) in[i] = state_get(state, c * P + i, st);
      for (int64_t t = 0; t < T; ++t) in[P + t] = conv_round(x[t * C + c], st);
      const float* wc = w + c * K;
      for (int64_t t = 0; t < T; ++t) {
        float acc = 0.0f;
        for (int j = 0; j < K; ++j) acc += wc[j] * in[t + j];
        out[t * C + c] = silu(acc);
      }
      for (int i = 0; i < P; ++i) state_set(state, c * P + i, in[T + i], st);
    }
  });
}

void gdn_gates(const float* a, const float* b, int64_t T, int Hv, const float* A_log, const float* dt_bias, float* g,
               float* beta) {
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h;
      const float x = a[i] + dt_bias[h];
      const float sp = x > 20.0f ? x : std::log1p(std::exp(x));  // torch.nn.functional.softplus
      g[i] = -std::exp(A_log[h]) * sp;
      beta[i] = 1.0f / (1.0f + std::exp(-b[i]));
    }
}

void gdn_rule_recurrent(const GdnShape& s, const float* qkv, int64_t T, const float* g, const float* beta, float* S,
                        float* out) {
  const int Hv = s.num_v_heads, Dk = s.k_head_dim, Dv = s.v_head_dim;
  parallel_for(Hv, 1, [&](int64_t h0, int64_t h1) {
    for (int h = static_cast<int>(h0); h < h1; ++h) {
      float* Sh = S + static_cast<int64_t>(h) * Dk * Dv;  // [Dk][Dv]
      TokenQkv tok;
      std::vector<float> delta(Dv);
      for (int64_t t = 0; t < T; ++t) {
        load_token(s, qkv, t, h, tok);
        const float decay = std::exp(g[t * Hv + h]), b = beta[t * Hv + h];
        for (int64_t i = 0; i < static_cast<int64_t>(Dk) * Dv; ++i) Sh[i] *= decay;
        for (int d = 0; d < Dv; ++d) {
          float mem = 0.0f;
          for (int a = 0; a < Dk; ++a) mem += Sh[a * Dv + d] * tok.k[a];
          delta[d] = (tok.v[d] - mem) * b;
        }
        for (int a = 0; a < Dk; ++a)
          for (int d = 0; d < Dv; ++d) Sh[a * Dv + d] += tok.k[a] * delta[d];
        float* o = out + t * s.value_dim() + static_cast<int64_t>(h) * Dv;
        for (int d = 0; d < Dv; ++d) {
          float acc = 0.0f;
          for (int a = 0; a < Dk; ++a) acc += Sh[a * Dv + d] * tok.q[a];
          o[d] = acc;
        }
      }
    }
  });
}

void gdn_rule_chunked(const GdnShape& s, int64_t pos0, const float* qkv, int64_t T, const float* g,
                      const float* beta, float* S, float* out) {
  const int Hv = s.num_v_heads, Dk = s.k_head_dim, Dv = s.v_head_dim, C = kGdnChunk;
  parallel_for(Hv, 1, [&](int64_t h0, int64_t h1) {
    for (int h = static_cast<int>(h0); h < h1; ++h) {
      float* Sh = S + static_cast<int64_t>(h) * Dk * Dv;  // [Dk][Dv]
      std::vector<float> q(static_cast<size_t>(C) * Dk), k(static_cast<size_t>(C) * Dk), W(static_cast<size_t>(C) * Dk);
      std::vector<float> U(static_cast<size_t>(C) * Dv), cum(C), b(C);
      TokenQkv tok;
      for (int64_t t0 = 0; t0 < T;) {
        // Chunks end at absolute multiples of C.
        const int n = static_cast<int>(std::min<int64_t>(T - t0, C - (pos0 + t0) % C));
        float run = 0.0f;
        for (int i = 0; i < n; ++i) {
          load_token(s, qkv, t0 + i, h, tok);
          std::copy(tok.q.begin(), tok.q.end(), q.begin() + static_cast<int64_t>(i) * Dk);
          std::copy(tok.k.begin(), tok.k.end(), k.begin() + static_cast<int64_t>(i) * Dk);
          b[i] = beta[(t0 + i) * Hv + h];
          run += g[(t0 + i) * Hv + h];
          cum[i] = run;
          for (int d = 0; d < Dv; ++d) U[static_cast<int64_t>(i) * Dv + d] = tok.v[d] * b[i];
          const float e = std::exp(cum[i]);
          for (int a = 0; a < Dk; ++a) W[static_cast<int64_t>(i) * Dk + a] = k[static_cast<int64_t>(i) * Dk + a] * b[i] * e;
        }
        // L[i][j] (j < i) = beta_i (k_i . k_j) exp(cum_i - cum_j); forward
        // substitution of (I + L) X = B for X = U (from beta v) and W (from beta k exp(cum)).
        for (int i = 0; i < n; ++i) {
          const float* ki = k.data() + static_cast<int64_t>(i) * Dk;
          for (int j = 0; j < i; ++j) {
            const float lij = b[i] * dot(ki, k.data() + static_cast<int64_t>(j) * Dk, Dk) * std::exp(cum[i] - cum[j]);
            for (int d = 0; d < Dv; ++d) U[static_cast<int64_t>(i) * Dv + d] -= lij * U[static_cast<int64_t>(j) * Dv + d];
            for (int a = 0; a < Dk; ++a) W[static_cast<int64_t>(i) * Dk + a] -= lij * W[static_cast<int64_t>(j) * Dk + a];
          }
        }
        // v_new = U - W S (U is overwritten), then the outputs.
        for (int i = 0; i < n; ++i)
          for (int d = 0; d < Dv; ++d) {
            float ws = 0.0f;
            for (int a = 0; a < Dk; ++a) ws += W[static_cast<int64_t>(i) * Dk + a] * Sh[a * Dv + d];
            U[static_cast<int64_t>(i) * Dv + d] -= ws;
          }
        for (int i = 0; i < n; ++i) {
          const float* qi = q.data() + static_cast<int64_t>(i) * Dk;
          float* o = out + (t0 + i) * s.value_dim() + static_cast<int64_t>(h) * Dv;
          const float ei = std::exp(cum[i]);
          for (int d = 0; d < Dv; ++d) {
            float acc = 0.0f;
            for (int a = 0; a < Dk; ++a) acc += qi[a] * Sh[a * Dv + d];
            o[d] = acc * ei;
          }
          for (int j = 0; j <= i; ++j) {
            const float aij = dot(qi, k.data() + static_cast<int64_t>(j) * Dk, Dk) * std::exp(cum[i] - cum[j]);
            for (int d = 0; d < Dv; ++d) o[d] += aij * U[static_cast<int64_t>(j) * Dv + d];
          }
        }
        // S = exp(cum_last) S + sum_i exp(cum_last - cum_i) k_i v_new_i^T.
        const float last = cum[n - 1], el = std::exp(last);
        for (int64_t x = 0; x < static_cast<int64_t>(Dk) * Dv; ++x) Sh[x] *= el;
        for (int i = 0; i < n; ++i) {
          const float di = std::exp(last - cum[i]);
          for (int a = 0; a < Dk; ++a) {
            const float ka = k[static_cast<int64_t>(i) * Dk + a] * di;
            for (int d = 0; d < Dv; ++d) Sh[a * Dv + d] += ka * U[static_cast<int64_t>(i) * Dv + d];
          }
        }
        t0 += n;
      }
    }
  });
}

void gdn_rule_step(const GdnShape& s, int64_t pos0, const float* qkv, int64_t T, const float* g, const float* beta,
                   void* state, GdnStateType st, float* out) {
  if (T <= 0) return;
  const int64_t n = s.ssm_state_elems();
  float* S = static_cast<float*>(state);
  std::vector<float> wide;
  if (st == GdnStateType::bf16) {
    wide.assign(static_cast<size_t>(n), 0.0f);
    const uint16_t* from = static_cast<const uint16_t*>(state);
    if (pos0 != 0)
      parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) wide[i] = bf16_to_f32(from[i]);
      });
    S = wide.data();
  } else if (pos0 == 0) {
    std::fill(S, S + n, 0.0f);
  }
  if (T == 1)
    gdn_rule_recurrent(s, qkv, T, g, beta, S, out);
  else
    gdn_rule_chunked(s, pos0, qkv, T, g, beta, S, out);
  if (st == GdnStateType::bf16) {
    uint16_t* to = static_cast<uint16_t*>(state);
    parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) to[i] = f32_to_bf16(wide[i]);
    });
  }
}

void gdn_gated_rmsnorm(const float* x, const float* z, int64_t T, int Hv, int Dv, const float* w, float eps, float* y) {
  const int64_t rows = T * Hv;
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * Dv;
      const float* zr = z + r * Dv;
      float* yr = y + r * Dv;
      float ss = 0.0f;
      for (int i = 0; i < Dv; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(Dv) + eps);
      for (int i = 0; i < Dv; ++i) yr[i] = w[i] * (xr[i] * inv) * silu(zr[i]);
    }
  });
}

void mul_sigmoid_cpu(float* x, const float* gate, int64_t n) {
  parallel_for(n, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  });
}

void split_q_gate_cpu(const float* qg, int64_t T, int Hq, int D, float* q, float* gate) {
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < Hq; ++h) {
      const float* src = qg + (t * Hq + h) * 2 * D;
      std::copy(src, src + D, q + (t * Hq + h) * D);
      std::copy(src + D, src + 2 * D, gate + (t * Hq + h) * D);
    }
}

}  // namespace fp8kv
