// first_non_finite (io/value_scan.h): finds the first NaN / inf per dtype on
// the raw bit patterns, and never flags a finite value (largest finite,
// subnormals, negative zero).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "io/value_scan.h"

using namespace fp8kv;

namespace {
// A view over raw little-endian elements.
struct Raw {
  TensorInfo info;
  std::vector<std::byte> bytes;
  template <class U>
  Raw(DType d, const std::vector<U>& elems) {
    info.dtype = d;
    info.shape = {static_cast<int64_t>(elems.size())};
    info.begin = 0;
    info.end = elems.size() * sizeof(U);
    bytes.resize(info.end);
    if (!elems.empty()) std::memcpy(bytes.data(), elems.data(), info.end);  // memcpy(null, null, 0) is UB
  }
  TensorView view() const { return TensorView{&info, bytes.data()}; }
};
std::string scan(const Raw& r) {
  const auto f = first_non_finite(r.view());
  return f ? fmt::format("{}:{}", f->index, f->what) : std::string("finite");
}
}  // namespace

TEST(ValueScan, F32) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max(), sub = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(scan(Raw(DType::F32, std::vector<float>{1.f, -0.f, big, -big, sub})), "finite");
  EXPECT_EQ(scan(Raw(DType::F32, std::vector<float>{1.f, 2.f, nan, inf})), "2:NaN");
  EXPECT_EQ(scan(Raw(DType::F32, std::vector<float>{1.f, -inf, nan})), "1:-inf");
  EXPECT_EQ(scan(Raw(DType::F32, std::vector<float>{inf})), "0:inf");
  EXPECT_EQ(scan(Raw(DType::F32, std::vector<float>{})), "finite");
}

TEST(ValueScan, F64) {
  EXPECT_EQ(scan(Raw(DType::F64, std::vector<double>{1.0, std::numeric_limits<double>::max()})), "finite");
  EXPECT_EQ(scan(Raw(DType::F64, std::vector<double>{1.0, std::numeric_limits<double>::quiet_NaN()})), "1:NaN");
}

TEST(ValueScan, HalfAndBfloat16Patterns) {
  // bf16: 0x7f80 inf, 0xff80 -inf, 0x7fc0 NaN, 0x7f7f largest finite, 0x0001 subnormal.
  EXPECT_EQ(scan(Raw(DType::BF16, std::vector<uint16_t>{0x3f80, 0x7f7f, 0xff7f, 0x0001, 0x8000})), "finite");
  EXPECT_EQ(scan(Raw(DType::BF16, std::vector<uint16_t>{0x3f80, 0xff80})), "1:-inf");
  EXPECT_EQ(scan(Raw(DType::BF16, std::vector<uint16_t>{0x7fc1})), "0:NaN");
  // f16: 0x7c00 inf, 0x7e00 NaN, 0x7bff largest finite (65504).
  EXPECT_EQ(scan(Raw(DType::F16, std::vector<uint16_t>{0x7bff, 0xfbff, 0x0001})), "finite");
  EXPECT_EQ(scan(Raw(DType::F16, std::vector<uint16_t>{0x3c00, 0x3c00, 0x7c00})), "2:inf");
  EXPECT_EQ(scan(Raw(DType::F16, std::vector<uint16_t>{0xfe00})), "0:NaN");
}

TEST(ValueScan, Fp8) {
  // e4m3fn: every pattern but S.1111.111 is finite (0x7e = 448, 0xfe = -448).
  std::vector<uint8_t> all;
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7f) != 0x7f) all.push_back(static_cast<uint8_t>(b));
  EXPECT_EQ(scan(Raw(DType::F8_E4M3, all)), "finite");
  EXPECT_EQ(scan(Raw(DType::F8_E4M3, std::vector<uint8_t>{0x7e, 0xff})), "1:NaN");
  // e5m2: 0x7c inf, 0xfc -inf, 0x7d..0x7f NaN, 0x7b = 57344.
  EXPECT_EQ(scan(Raw(DType::F8_E5M2, std::vector<uint8_t>{0x7b, 0xfb, 0x01})), "finite");
  EXPECT_EQ(scan(Raw(DType::F8_E5M2, std::vector<uint8_t>{0x00, 0xfc})), "1:-inf");
  EXPECT_EQ(scan(Raw(DType::F8_E5M2, std::vector<uint8_t>{0x7d})), "0:NaN");
}

TEST(ValueScan, IntegersAreNotScanned) {
  EXPECT_EQ(scan(Raw(DType::I32, std::vector<int32_t>{0x7f800000})), "finite");
}
