// Exhaustive checks of the fp8/bf16 conversions against an independent
// reference: the nearest of the decoded values of the same sign (ties to the
// even code), which saturates by construction.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "numerics/fp8.h"
#include "numerics/quant_stats.h"

using namespace fp8kv;

namespace {

// Decoded value of an fp8 code computed independently of the library:
// from the bit fields with plain double arithmetic.
double ref_decode(uint8_t c, int mant, int bias, bool e5m2) {
  int s = c >> 7, e = (c >> mant) & ((1 << (7 - mant)) - 1), m = c & ((1 << mant) - 1);
  if (!e5m2 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (e5m2 && e == 31) return m == 0 ? std::numeric_limits<double>::infinity() * (s ? -1 : 1)
                                     : std::numeric_limits<double>::quiet_NaN();
  double v = e == 0 ? std::ldexp(m, 1 - bias - mant) : std::ldexp((1 << mant) + m, e - bias - mant);
  return s ? -v : v;
}

uint8_t ref_quant(double y, bool e5m2) {
  const int mant = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  if (std::isnan(y)) return 0x7f;
  const bool neg = std::signbit(y);
  const double maxv = e5m2 ? 57344.0 : 448.0;
  if (std::fabs(y) >= maxv) return static_cast<uint8_t>((neg ? 0x80 : 0) | (e5m2 ? 0x7b : 0x7e));
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 128; ++c) {
    const uint8_t code = static_cast<uint8_t>(c | (neg ? 0x80 : 0));
    const double v = ref_decode(code, mant, bias, e5m2);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - y);  // exact in double for |y| < max
    if (best < 0 || d < best_d || (d == best_d && (code & 1) == 0)) { best = code; best_d = d; }
  }
  return static_cast<uint8_t>(best);
}

}  // namespace

TEST(Fp8, DecodeMatchesReferenceAllCodes) {
  for (int c = 0; c < 256; ++c) {
    for (bool e5 : {false, true}) {
      const double r = ref_decode(static_cast<uint8_t>(c), e5 ? 2 : 3, e5 ? 15 : 7, e5);
      const float v = e5 ? e5m2_to_f32(static_cast<uint8_t>(c)) : e4m3_to_f32(static_cast<uint8_t>(c));
      if (std::isnan(r)) EXPECT_TRUE(std::isnan(v)) << c;
      else EXPECT_EQ(static_cast<double>(v), r) << "code " << c << (e5 ? " e5m2" : " e4m3");
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
}

TEST(Fp8, ExhaustiveOverAllBf16Patterns) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const float x = bf16_to_f32(static_cast<uint16_t>(p));
    const uint8_t e4 = f32_to_e4m3(x), e5 = f32_to_e5m2(x);
    if (std::isnan(x)) {
      EXPECT_EQ(e4 & 0x7f, 0x7f) << p;
      EXPECT_TRUE(std::isnan(e5m2_to_f32(e5))) << p;
      continue;
    }
    ASSERT_EQ(e4, ref_quant(x, false)) << "bf16 pattern " << p << " x=" << x;
    ASSERT_EQ(e5, ref_quant(x, true)) << "bf16 pattern " << p << " x=" << x;
  }
}

TEST(Fp8, SaturatesAndPreservesNaN) {
  EXPECT_EQ(f32_to_e4m3(500.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-500.0f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_e5m2(1e30f), 0x7b);
  EXPECT_EQ(f32_to_e5m2(-INFINITY), 0xfb);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(f32_to_e4m3(NAN))));
  EXPECT_TRUE(std::isnan(e5m2_to_f32(f32_to_e5m2(NAN))));
  EXPECT_EQ(f32_to_e4m3(-NAN), 0x7f);  // canonical NaN, as CUDA cvt
  EXPECT_EQ(f32_to_e5m2(-NAN), 0x7f);
}

TEST(Fp8, RandomFp32MatchesReference) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 300000; ++i) {
    float x = bits_f32(bits(rng));
    if (std::isnan(x)) continue;
    // Bring most values into the interesting range.
    if (i % 2) { int e = 0; x = std::ldexp(std::frexp(x, &e), static_cast<int>(rng() % 40) - 24); }
    ASSERT_EQ(f32_to_e4m3(x), ref_quant(x, false)) << x;
    ASSERT_EQ(f32_to_e5m2(x), ref_quant(x, true)) << x;
  }
}

TEST(Fp8, NearTiesRoundToEven) {
  // 1.0625 is the tie between 1.0 (code 0x38) and 1.125 (0x39) in e4m3.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);  // tie between 0x39 and 0x3a -> even
  // Subnormal tie: 2^-10 is halfway between 0 and 2^-9 -> 0.
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(3.0f, -10)), 0x02);
  EXPECT_EQ(f32_to_e4m3(-std::ldexp(1.0f, -12)), 0x80);
}

TEST(Bf16, RoundTripAndRne) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const float x = bf16_to_f32(static_cast<uint16_t>(p));
    if (std::isnan(x)) { EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(x)))); continue; }
    EXPECT_EQ(f32_to_bf16(x), p);
  }
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);
}

TEST(Quantize, SpansUseDivisionByScale) {
  std::vector<float> x = {0.0f, 1.0f, -3.5f, 1000.0f, 1e-6f};
  std::vector<uint8_t> q(x.size());
  std::vector<float> back(x.size());
  quantize_fp8(x, 2.0f, KvDtype::fp8_e4m3, q);
  dequantize_fp8(q, 2.0f, KvDtype::fp8_e4m3, back);
  EXPECT_EQ(back[0], 0.0f);
  EXPECT_EQ(back[1], 1.0f);
  EXPECT_EQ(back[2], -3.5f);
  EXPECT_EQ(back[3], 896.0f);  // 1000/2 = 500 saturates at 448, times 2
  EXPECT_EQ(back[4], 0.0f);    // flushed
}

TEST(QuantStats, CountsClipFlushAndError) {
  std::vector<float> x = {0.0f, 1.0f, 500.0f, -600.0f, 1e-6f, 2.0f};
  QuantStats s;
  s.add(x, 1.0f, KvDtype::fp8_e4m3);
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.clipped, 2u);
  EXPECT_EQ(s.flushed, 1u);
  EXPECT_DOUBLE_EQ(s.amax, 600.0);
  const double num = 52.0 * 52 + 152.0 * 152 + 1e-12;
  const double den = 1 + 500.0 * 500 + 600.0 * 600 + 1e-12 + 4;
  EXPECT_NEAR(s.rt_rel_err(), std::sqrt(num / den), 1e-9);
  QuantStats t;
  t.add(std::vector<float>{700.0f}, 1.0f, KvDtype::fp8_e4m3);
  s.merge(t);
  EXPECT_EQ(s.clipped, 3u);
  EXPECT_DOUBLE_EQ(s.amax, 700.0);
}

TEST(KvDtype, Parse) {
  EXPECT_EQ(parse_kv_dtype("fp8"), KvDtype::fp8_e4m3);
  EXPECT_EQ(parse_kv_dtype("fp8_e5m2"), KvDtype::fp8_e5m2);
  EXPECT_EQ(parse_kv_dtype("bf16"), KvDtype::bf16);
  EXPECT_THROW(parse_kv_dtype("int8"), std::invalid_argument);
  EXPECT_THROW(parse_kv_dtype("auto"), std::invalid_argument);
}

// One table of names (vLLM's CacheDType names fp8kv implements, then aliases):
// every name parses to its dtype and kv_dtype_name round-trips it.
TEST(KvDtype, NamesTable) {
  std::string vllm;
  for (const auto& n : kv_cache_dtype_names()) {
    EXPECT_EQ(parse_kv_cache_dtype(n.name), n.dtype) << n.name;
    if (n.dtype) {
      EXPECT_EQ(parse_kv_dtype(kv_dtype_name(*n.dtype)), *n.dtype) << n.name;
    }
    if (!n.alias) vllm += std::string(vllm.empty() ? "" : " ") + std::string(n.name);
  }
  EXPECT_EQ(vllm, "auto bfloat16 fp8 fp8_e4m3 fp8_e5m2 fp8_per_token_head int8_per_token_head");
  EXPECT_EQ(parse_kv_cache_dtype("auto"), std::nullopt);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16"), KvDtype::bf16);
  for (const char* bad : {"fp8_inc", "fp8_ds_mla", "int8", "float16", "e4m3", "FP8", ""}) {
    try {
      parse_kv_cache_dtype(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(kv_cache_dtype_choices()), std::string::npos) << e.what();
    }
  }
}
