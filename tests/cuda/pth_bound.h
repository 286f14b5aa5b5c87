// The per-token-head attention bound (docs/cuda.md "Tolerance"), shared by
// tests/cuda and tests/cuda_ops: one (query, head) against its visible keys.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace fp8kv::cudatest {

// Keys j = 0 .. n-1: key(j, kq, vq, ks, vs) fills the stored codes of key j's
// K and V rows (as floats, D each) and its two scales. u: the MMA operand
// roundoff (f16: 2^-11). Score s_j = c ks_j q . kq_j (softcap applied);
//   |dO| <= Vmax (u + expm1(2 u Smax) + 1e-5) + 2^-25 sum_{j: p_j vs_j < 2^-14} max_d |vq_jd| / L + 1e-6
// with Smax = max_j c ks_j sum_d |q_d| |kq_jd|, Vmax = max_j vs_j max_d |vq_jd|,
// p_j = exp(s_j - max s), L = sum p_j (P is the f16 rounding of p_j vs_j:
// subnormal below 2^-14, absolute error <= 2^-25 there).
template <class Key>
double pth_attention_bound(int n, int D, const float* q, float softmax_scale, float softcap, double u, Key&& key) {
  std::vector<float> kq(D), vq(D);
  std::vector<double> sc(n), vm(n), vsj(n);
  double smax = 0, vmax = 0;
  for (int j = 0; j < n; ++j) {
    float ks = 0, vs = 0;
    key(j, kq.data(), vq.data(), ks, vs);
    double a = 0, dot = 0, m = 0;
    for (int d = 0; d < D; ++d) {
      a += std::fabs(q[d]) * std::fabs(kq[d]);
      dot += static_cast<double>(q[d]) * kq[d];
      m = std::max<double>(m, std::fabs(vq[d]));
    }
    smax = std::max(smax, a * softmax_scale * ks);
    vmax = std::max(vmax, vs * m);
    double x = dot * ks * softmax_scale;
    if (softcap > 0) x = softcap * std::tanh(x / softcap);
    sc[j] = x;
    vm[j] = m;
    vsj[j] = vs;
  }
  double mx = -INFINITY, l = 0, sub = 0;
  for (double x : sc) mx = std::max(mx, x);
  for (double x : sc) l += std::exp(x - mx);
  for (int j = 0; j < n; ++j)
    if (std::exp(sc[j] - mx) * vsj[j] < 0x1p-14) sub += vm[j];
  return vmax * (u + std::expm1(2.0 * u * smax) + 1e-5) + 0x1p-25 * sub / std::max(l, 1.0) + 1e-6;
}

}  // namespace fp8kv::cudatest
