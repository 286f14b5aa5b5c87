// Inputs of the fp8 conversion golden table (shared by tools/gen_fp8_golden.cu,
// which runs CUDA's __nv_cvt_float_to_fp8 on them on the GPU machine, and by
// tests/numerics/test_fp8_golden.cpp, which checks our conversion bit-exactly).
// Deterministic: the same list on every machine.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace fp8golden {

inline float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Value of an fp8 code (finite codes only), computed from the fields.
inline double decode(int code, int mant, int bias) {
  int e = (code >> mant) & ((1 << (7 - mant)) - 1), m = code & ((1 << mant) - 1);
  double v = e == 0 ? std::ldexp(m, 1 - bias - mant) : std::ldexp((1 << mant) + m, e - bias - mant);
  return (code & 0x80) ? -v : v;
}

inline void push_pm(std::vector<float>& v, float x) { v.push_back(x); v.push_back(-x); }

inline std::vector<float> inputs() {
  std::vector<float> v;
  // 1. Every bf16 bit pattern.
  for (uint32_t p = 0; p < 65536; ++p) v.push_back(from_bits(p << 16));
  // 2. Near ties: midpoints between adjacent finite codes of both formats and
  //    their fp32 neighbours, both signs.
  const int maxcode[2] = {0x7e, 0x7b}, mant[2] = {3, 2}, bias[2] = {7, 15};
  for (int f = 0; f < 2; ++f) {
    for (int c = 0; c < maxcode[f]; ++c) {
      const float a = static_cast<float>(decode(c, mant[f], bias[f]));
      const float b = static_cast<float>(decode(c + 1, mant[f], bias[f]));
      const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);
      push_pm(v, mid);
      push_pm(v, std::nextafter(mid, 0.0f));
      push_pm(v, std::nextafter(mid, INFINITY));
      push_pm(v, a);
    }
    // Around the max finite value and the first value beyond it.
    const float mx = static_cast<float>(decode(maxcode[f], mant[f], bias[f]));
    const float step = static_cast<float>(mx - decode(maxcode[f] - 1, mant[f], bias[f]));
    for (float x : {mx, mx + step / 2, mx + step, mx + 2 * step, mx * 2, mx * 1e6f}) {
      push_pm(v, x);
      push_pm(v, std::nextafter(x, 0.0f));
      push_pm(v, std::nextafter(x, INFINITY));
    }
  }
  // 448..480 densely (the region between e4m3's max and the next power).
  for (float x = 440.0f; x <= 480.0f; x += 0.25f) push_pm(v, x);
  // Special values.
  for (float x : {0.0f, INFINITY, std::nanf(""), 1e-45f, 1e-40f, 1.17549435e-38f, 3.4028235e38f}) push_pm(v, x);
  v.push_back(from_bits(0x7fc00001u));
  v.push_back(from_bits(0xffc00000u));
  v.push_back(from_bits(0x7f800001u));  // signalling NaN
  // 3. Random fp32 bit patterns and log-uniform magnitudes.
  uint64_t s = 0x5eed2026ull;
  for (int i = 0; i < 100000; ++i) v.push_back(from_bits(static_cast<uint32_t>(splitmix64(s))));
  for (int i = 0; i < 100000; ++i) {
    const uint64_t r = splitmix64(s);
    const double u = static_cast<double>(r >> 11) * 0x1.0p-53;  // [0,1)
    float x = static_cast<float>(std::ldexp(1.0 + u, static_cast<int>(r % 48) - 30));
    if (r & (1ull << 10)) x = -x;
    v.push_back(x);
  }
  return v;
}

}  // namespace fp8golden
