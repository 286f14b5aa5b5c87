// The one KV scale rule (numerics/scale_check.h): which float32 values are
// refused, which are warned about, and that every accepted value has a finite
// reciprocal (the quantizer divides by the scale).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "numerics/scale_check.h"

using namespace fp8kv;

namespace {
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
bool refused_with(float x, const char* needle) {
  const auto e = scale_value_error(x);
  return e && e->find(needle) != std::string::npos;
}
}  // namespace

TEST(ScaleCheck, RefusesNonPositiveNonFiniteAndSubnormal) {
  EXPECT_TRUE(refused_with(std::numeric_limits<float>::quiet_NaN(), "is NaN"));
  EXPECT_TRUE(refused_with(std::numeric_limits<float>::infinity(), "is inf"));
  EXPECT_TRUE(refused_with(-std::numeric_limits<float>::infinity(), "is -inf"));
  EXPECT_TRUE(refused_with(0.0f, "is 0"));
  EXPECT_TRUE(refused_with(-0.0f, "is 0"));
  EXPECT_TRUE(refused_with(-2.0f, "is negative (-2)"));
  EXPECT_TRUE(refused_with(from_bits(1), "is 1.40129846e-45, a subnormal float32"));
  EXPECT_TRUE(refused_with(from_bits(0x007fffff), "subnormal"));  // largest subnormal
  EXPECT_FALSE(scale_value_error(from_bits(0x00800000)));          // smallest normal = 2^-126
  EXPECT_FALSE(scale_value_error(std::numeric_limits<float>::max()));
  EXPECT_FALSE(scale_value_error(1.0f));
}

TEST(ScaleCheck, EveryAcceptedValueHasAFiniteReciprocal) {
  // Walk every positive float32 exponent and a spread of mantissas: the rule
  // accepts x exactly when x is normal, and then 1/x is finite and nonzero.
  for (uint32_t e = 0; e < 255; ++e)
    for (uint32_t m : {0u, 1u, 0x400000u, 0x7fffffu}) {
      const float x = from_bits((e << 23) | m);
      const bool accepted = !scale_value_error(x);
      EXPECT_EQ(accepted, e >= 1 && x > 0.0f) << x;
      if (accepted) {
        EXPECT_TRUE(std::isfinite(1.0f / x)) << x;
        EXPECT_GT(1.0f / x, 0.0f) << x;
      }
    }
}

TEST(ScaleCheck, WarnsOutsideTwoToThePlusMinus20Only) {
  EXPECT_FALSE(scale_value_warning(0x1p-20f));
  EXPECT_FALSE(scale_value_warning(0x1p20f));
  EXPECT_FALSE(scale_value_warning(1.0f));
  EXPECT_TRUE(scale_value_warning(std::nextafter(0x1p-20f, 0.0f)));
  EXPECT_TRUE(scale_value_warning(std::nextafter(0x1p20f, 1e30f)));
  ASSERT_TRUE(scale_value_warning(1e-30f));
  EXPECT_NE(scale_value_warning(1e-30f)->find("outside [2^-20, 2^20]"), std::string::npos);
}
