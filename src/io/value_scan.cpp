#include "io/value_scan.h"

#include <cstring>

namespace fp8kv {

namespace {

template <class U>
U load(const std::byte* p) {
  U u;
  std::memcpy(&u, p, sizeof(U));
  return u;
}

// exp_mask: all exponent bits; a pattern is non-finite when they are all set.
// mant_mask: mantissa bits (0 -> inf, else NaN); sign: the sign bit.
template <class U>
std::optional<NonFiniteValue> scan(const TensorView& v, U exp_mask, U mant_mask, U sign) {
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    const U u = load<U>(v.data + static_cast<size_t>(i) * sizeof(U));
    if ((u & exp_mask) != exp_mask) continue;
    if (u & mant_mask) return NonFiniteValue{i, "NaN"};
    return NonFiniteValue{i, (u & sign) ? "-inf" : "inf"};
  }
  return std::nullopt;
}

}  // namespace

std::optional<NonFiniteValue> first_non_finite(const TensorView& v) {
  switch (v.dtype()) {
    case DType::F64:
      return scan<uint64_t>(v, 0x7ff0000000000000ull, 0x000fffffffffffffull, 0x8000000000000000ull);
    case DType::F32: return scan<uint32_t>(v, 0x7f800000u, 0x007fffffu, 0x80000000u);
    case DType::F16: return scan<uint16_t>(v, 0x7c00, 0x03ff, 0x8000);
    case DType::BF16: return scan<uint16_t>(v, 0x7f80, 0x007f, 0x8000);
    case DType::F8_E5M2: return scan<uint8_t>(v, 0x7c, 0x03, 0x80);
    case DType::F8_E4M3: {
      // e4m3fn: S.1111.111 is NaN; there are no infinities.
      const int64_t n = v.numel();
      for (int64_t i = 0; i < n; ++i)
        if ((load<uint8_t>(v.data + i) & 0x7f) == 0x7f) return NonFiniteValue{i, "NaN"};
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

}  // namespace fp8kv
