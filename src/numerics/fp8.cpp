#include "numerics/fp8.h"

#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>

namespace fp8kv {

std::string_view kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::bf16: return "bf16";
    case KvDtype::fp8_e4m3: return "fp8_e4m3";
    case KvDtype::fp8_e5m2: return "fp8_e5m2";
    case KvDtype::fp8_e4m3_pth: return "fp8_per_token_head";
    case KvDtype::int8_pth: return "int8_per_token_head";
  }
  return "?";
}

namespace {

constexpr KvCacheDtypeName kNames[] = {
    {"auto", std::nullopt, false},
    {"bfloat16", KvDtype::bf16, false},
    {"fp8", KvDtype::fp8_e4m3, false},
    {"fp8_e4m3", KvDtype::fp8_e4m3, false},
    {"fp8_e5m2", KvDtype::fp8_e5m2, false},
    {"fp8_per_token_head", KvDtype::fp8_e4m3_pth, false},
    {"int8_per_token_head", KvDtype::int8_pth, false},
    {"bf16", KvDtype::bf16, true},
    {"fp8e4m3", KvDtype::fp8_e4m3, true},
    {"fp8e5m2", KvDtype::fp8_e5m2, true},
};
// vLLM's other CacheDType names: named in the error, not accepted.
constexpr std::string_view kUnsupported[] = {"float16", "int8", "fp8_inc", "fp8_ds_mla"};

}  // namespace

std::span<const KvCacheDtypeName> kv_cache_dtype_names() { return kNames; }

std::string kv_cache_dtype_choices() {
  std::string main, aliases;
  for (const auto& n : kNames) {
    std::string& to = n.alias ? aliases : main;
    if (!to.empty()) to += ", ";
    to += n.name;
  }
  return main + " (aliases: " + aliases + ")";
}

std::optional<KvDtype> parse_kv_cache_dtype(std::string_view s) {
  for (const auto& n : kNames)
    if (n.name == s) return n.dtype;
  for (const auto u : kUnsupported)
    if (u == s)
      throw std::invalid_argument("'" + std::string(s) + "' (a vLLM KV cache dtype) is not supported by fp8kv; accepted: " +
                                  kv_cache_dtype_choices());
  throw std::invalid_argument("unknown KV cache dtype '" + std::string(s) + "'; accepted: " + kv_cache_dtype_choices());
}

KvDtype parse_kv_dtype(std::string_view s) {
  const std::optional<KvDtype> d = parse_kv_cache_dtype(s);
  if (!d) throw std::invalid_argument("'auto' is not a KV cache dtype here: give bfloat16, fp8_e4m3, fp8_e5m2, fp8_per_token_head or int8_per_token_head");
  return *d;
}

float kv_dtype_max(KvDtype d) { return kv_dtype_elem_max(d); }

float per_token_head_scale(std::span<const float> x, KvDtype d) {
  float amax = 0.0f;
  for (const float v : x) amax = std::fmax(amax, std::fabs(v));  // fmax ignores NaN
  return std::fmax(amax / kv_dtype_elem_max(d), FLT_MIN);
}

namespace {

// Generic saturating RNE float -> small float with MANT mantissa bits and
// exponent bias BIAS, max finite code MAXCODE (sign excluded).
// Subnormals: below 2^(1-BIAS) the value is rounded on the fixed grid
// 2^(1-BIAS-MANT); the rounding result of 2^MANT naturally becomes the
// smallest normal code.
template <int MANT, int BIAS, uint8_t MAXCODE, uint8_t NANCODE>
inline uint8_t f32_to_small(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return NANCODE;  // canonical NaN, sign dropped (as CUDA's cvt)
  // Smallest normal of the target, as fp32 bits: exponent (1 - BIAS).
  constexpr uint32_t min_normal_bits = static_cast<uint32_t>(127 + 1 - BIAS) << 23;
  if (a < min_normal_bits) {
    // Subnormal (or zero): value / 2^(1-BIAS-MANT), exact power-of-two scaling,
    // then round to nearest even integer in [0, 2^MANT].
    const float scaled = std::ldexp(bits_f32(a), BIAS - 1 + MANT);
    const float r = std::nearbyint(scaled);  // default mode: nearest even
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(r));
  }
  constexpr int shift = 23 - MANT;
  uint32_t v = a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);
  // Rebias exponent: fp32 exponent e32 -> e = e32 - 127 + BIAS.
  const uint32_t code = (v >> shift) - (static_cast<uint32_t>(127 - BIAS) << MANT);
  if (v >= 0x7f800000u || code > MAXCODE) return static_cast<uint8_t>(sign | MAXCODE);
  return static_cast<uint8_t>(sign | code);
}

template <int MANT, int BIAS>
inline float small_to_f32(uint8_t v) {
  const bool neg = v & 0x80u;
  const int e = (v & 0x7f) >> MANT;
  const int m = v & ((1 << MANT) - 1);
  float r;
  if (e == 0) r = std::ldexp(static_cast<float>(m), 1 - BIAS - MANT);
  else r = std::ldexp(static_cast<float>((1 << MANT) + m), e - BIAS - MANT);
  return neg ? -r : r;
}

}  // namespace

uint8_t f32_to_e4m3(float f) { return f32_to_small<3, 7, 0x7e, 0x7f>(f); }
uint8_t f32_to_e5m2(float f) { return f32_to_small<2, 15, 0x7b, 0x7f>(f); }

float e4m3_to_f32(uint8_t v) {
  if ((v & 0x7f) == 0x7f) return std::nanf("");
  return small_to_f32<3, 7>(v);
}
float e5m2_to_f32(uint8_t v) {
  const int a = v & 0x7f;
  if (a == 0x7c) return (v & 0x80) ? -INFINITY : INFINITY;
  if (a > 0x7c) return std::nanf("");
  return small_to_f32<2, 15>(v);
}

void quantize_fp8(std::span<const float> x, float scale, KvDtype d, std::span<uint8_t> out) {
  if (out.size() < x.size()) throw std::invalid_argument("quantize_fp8: output span too small");
  if (d == KvDtype::fp8_e5m2) {
    for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_e5m2(x[i] / scale);
  } else if (d == KvDtype::int8_pth) {
    for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_int8_sat(x[i] / scale);
  } else {
    for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_e4m3(x[i] / scale);
  }
}

void dequantize_fp8(std::span<const uint8_t> q, float scale, KvDtype d, std::span<float> out) {
  if (out.size() < q.size()) throw std::invalid_argument("dequantize_fp8: output span too small");
  // Table decode: 256 entries, built once per call (cheap) for vectorizable loop.
  float table[256];
  for (int i = 0; i < 256; ++i) table[i] = kv_byte_to_f32(static_cast<uint8_t>(i), d);
  for (size_t i = 0; i < q.size(); ++i) out[i] = table[q[i]] * scale;
}

void quantize_bf16(std::span<const float> x, std::span<uint16_t> out) {
  if (out.size() < x.size()) throw std::invalid_argument("quantize_bf16: output span too small");
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
}

void dequantize_bf16(std::span<const uint16_t> q, std::span<float> out) {
  if (out.size() < q.size()) throw std::invalid_argument("dequantize_bf16: output span too small");
  for (size_t i = 0; i < q.size(); ++i) out[i] = bf16_to_f32(q[i]);
}

float roundtrip(float x, float scale, KvDtype d) {
  if (d == KvDtype::bf16) return round_bf16(x);
  return kv_byte_to_f32(f32_to_kv_byte(x / scale, d), d) * scale;
}

}  // namespace fp8kv
