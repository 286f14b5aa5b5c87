// fp8 (e4m3fn, e5m2) and bf16 <-> float conversions, saturating quantize.
//
// Convention (docs/design.md "Numerics and scales"): stored = saturate(rne(x / scale)), the division is
// an IEEE fp32 division (no reciprocal), dequantized = stored * scale.
// e4m3fn: max finite 448, no infinities, NaN only S.1111.111.
// e5m2:   max finite 57344, inf S.11111.00, NaN S.11111.{01,10,11}.
// Saturation: |x| beyond the max finite (inf included) stores as +-max; NaN
// stays NaN (canonical 0x7f, the sign is dropped). This matches CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, .).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace fp8kv {

// Element type of a KV cache (and of fp8 tensors generally).
// fp8_e4m3_pth / int8_pth: per-token-head caches (docs/design.md "Per-token-head
// KV cache dtypes"): e4m3 or int8 elements, each (token, KV head, stream)
// with its own f32 scale stored beside the cache; no per-tensor scale.
enum class KvDtype : uint8_t { bf16 = 0, fp8_e4m3 = 1, fp8_e5m2 = 2, fp8_e4m3_pth = 3, int8_pth = 4 };

// "bf16" | "fp8_e4m3" | "fp8_e5m2" | "fp8_per_token_head" | "int8_per_token_head".
std::string_view kv_dtype_name(KvDtype d);
// The KV cache dtype names every command accepts (--kv-cache-dtype, a
// calibrate target, a report's "target"), in one table: vLLM's CacheDType
// names that fp8kv implements (auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2,
// fp8_per_token_head, int8_per_token_head) and
// documented aliases (bf16, fp8e4m3, fp8e5m2). dtype nullopt: "auto" (the
// checkpoint decides; engine/engine.h resolve_kv_cache_dtype).
struct KvCacheDtypeName {
  std::string_view name;
  std::optional<KvDtype> dtype;
  bool alias;  // false: vLLM's name
};
std::span<const KvCacheDtypeName> kv_cache_dtype_names();
// "auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, fp8_per_token_head,
// int8_per_token_head (aliases: bf16, fp8e4m3, fp8e5m2)".
std::string kv_cache_dtype_choices();
// A name of the table: nullopt for "auto". Throws std::invalid_argument
// naming the accepted names otherwise (vLLM's fp8_inc, fp8_ds_mla, int8 and
// float16 are named as not supported).
std::optional<KvDtype> parse_kv_cache_dtype(std::string_view s);
// The same names without "auto" (a concrete dtype: calibrate's --target).
KvDtype parse_kv_dtype(std::string_view s);
inline constexpr int kv_dtype_bytes(KvDtype d) { return d == KvDtype::bf16 ? 2 : 1; }
// The elements are an fp8 format (e4m3 or e5m2; per tensor or per token head).
inline constexpr bool kv_dtype_is_fp8(KvDtype d) {
  return d == KvDtype::fp8_e4m3 || d == KvDtype::fp8_e5m2 || d == KvDtype::fp8_e4m3_pth;
}
// Per-token-head scales (fp8_e4m3_pth, int8_pth): the cache has k_scale /
// v_scale arrays beside it; per-tensor ScaleRefs and checkpoint scales are ignored.
inline constexpr bool kv_dtype_per_token_head(KvDtype d) { return d == KvDtype::fp8_e4m3_pth || d == KvDtype::int8_pth; }
// Per-tensor (or per-KV-head) scaled fp8: fp8_e4m3, fp8_e5m2 (the dtypes that
// take KvScales: checkpoint, calibrated or unity).
inline constexpr bool kv_dtype_per_tensor_scaled(KvDtype d) { return d == KvDtype::fp8_e4m3 || d == KvDtype::fp8_e5m2; }
// Largest stored magnitude M of the element format: 448 (both e4m3 kinds),
// 57344 (e5m2), 127 (int8: symmetric, -128 unused); bf16 -> 3.3895314e38.
inline constexpr float kv_dtype_elem_max(KvDtype d) {
  return d == KvDtype::fp8_e4m3 || d == KvDtype::fp8_e4m3_pth ? 448.0f
         : d == KvDtype::fp8_e5m2                             ? 57344.0f
         : d == KvDtype::int8_pth                             ? 127.0f
                                                              : 3.38953139e38f;
}
// The same as kv_dtype_elem_max (kept for the per-tensor callers).
float kv_dtype_max(KvDtype d);

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- bf16 ----
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (overflow -> inf, as IEEE)
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- fp8 ----
// Saturating, round-to-nearest-even conversions.
uint8_t f32_to_e4m3(float f);
uint8_t f32_to_e5m2(float f);
float e4m3_to_f32(uint8_t v);
float e5m2_to_f32(uint8_t v);

// int8 (int8_pth): round to nearest even, clamp to [-127, 127] (inf
// included), NaN -> 0; the byte is the two's complement int8.
inline uint8_t f32_to_int8_sat(float f) {
  if (!(f == f)) return 0;
  const float c = f > 127.0f ? 127.0f : (f < -127.0f ? -127.0f : f);
  return static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(c)));  // default mode: nearest even
}
inline float int8_to_f32(uint8_t v) { return static_cast<float>(static_cast<int8_t>(v)); }

// fp8 dtypes (e4m3 kinds, e5m2) only; int8_pth has f32_to_int8_sat.
inline uint8_t f32_to_fp8(float f, KvDtype d) {
  return d == KvDtype::fp8_e5m2 ? f32_to_e5m2(f) : f32_to_e4m3(f);
}
inline float fp8_to_f32(uint8_t v, KvDtype d) {
  return d == KvDtype::fp8_e5m2 ? e5m2_to_f32(v) : e4m3_to_f32(v);
}

// One stored byte of a 1-byte cache dtype (fp8 kinds or int8_pth) <-> float
// (without the scale).
inline uint8_t f32_to_kv_byte(float f, KvDtype d) { return d == KvDtype::int8_pth ? f32_to_int8_sat(f) : f32_to_fp8(f, d); }
inline float kv_byte_to_f32(uint8_t v, KvDtype d) { return d == KvDtype::int8_pth ? int8_to_f32(v) : fp8_to_f32(v, d); }

// The per-token-head scale of one (token, KV head, stream) vector x (docs/design.md
// "Per-token-head KV cache dtypes"): amax = max |x| (NaN ignored, as fmaxf),
// s = max(amax / M, FLT_MIN), M = kv_dtype_elem_max(d), an IEEE f32 division.
float per_token_head_scale(std::span<const float> x, KvDtype d);

// Quantize x / scale into an fp8 format (d must be an fp8 dtype, or int8_pth).
void quantize_fp8(std::span<const float> x, float scale, KvDtype d, std::span<uint8_t> out);
// out = stored * scale.
void dequantize_fp8(std::span<const uint8_t> q, float scale, KvDtype d, std::span<float> out);
// bf16 store (no scale: a bf16 cache stores x rounded to bf16).
void quantize_bf16(std::span<const float> x, std::span<uint16_t> out);
void dequantize_bf16(std::span<const uint16_t> q, std::span<float> out);

// Round trip through a cache dtype: what attention reads back after a store.
// bf16 ignores the scale; fp8 / int8 compute q(x / scale) * scale.
float roundtrip(float x, float scale, KvDtype d);

}  // namespace fp8kv
