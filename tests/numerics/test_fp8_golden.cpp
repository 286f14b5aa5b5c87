// Bit-exact comparison with CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, .)
// on every bf16 pattern and ~200K random/adversarial fp32 values (golden made
// on the GPU machine by tools/gen_fp8_golden.cu, stored gzip-compressed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../../tools/fp8_golden_inputs.h"
#include "../common/golden.h"
#include "numerics/fp8.h"

using namespace fp8kv;

TEST(Fp8Golden, MatchesCudaSatfiniteBitExact) {
  const std::string path = std::string(FP8KV_SOURCE_DIR) + "/tests/golden/numerics/fp8_cuda_satfinite.bin";
  if (!test_util::find_golden(path))
    GTEST_SKIP() << "golden missing: " << path << ".gz (run tools/gen_fp8_golden.cu on the GPU machine)";
  const std::string bytes = test_util::read_golden(path);
  const std::vector<unsigned char> data(bytes.begin(), bytes.end());
  ASSERT_GE(data.size(), 8u);
  ASSERT_EQ(std::string(data.begin(), data.begin() + 4), "FP8G");
  uint32_t count;
  std::memcpy(&count, data.data() + 4, 4);
  const std::vector<float> in = fp8golden::inputs();
  ASSERT_EQ(count, in.size()) << "golden was made from a different input list";
  ASSERT_EQ(data.size(), 8u + 2u * count);
  const unsigned char* e4 = data.data() + 8;
  const unsigned char* e5 = e4 + count;
  size_t bad4 = 0, bad5 = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const float x = in[i];
    if (f32_to_e4m3(x) != e4[i]) {
      if (++bad4 <= 10) ADD_FAILURE() << "e4m3 x=" << x << " bits=0x" << std::hex << fp8golden::to_bits(x)
                                      << " ours=0x" << int(f32_to_e4m3(x)) << " cuda=0x" << int(e4[i]);
    }
    if (f32_to_e5m2(x) != e5[i]) {
      if (++bad5 <= 10) ADD_FAILURE() << "e5m2 x=" << x << " bits=0x" << std::hex << fp8golden::to_bits(x)
                                      << " ours=0x" << int(f32_to_e5m2(x)) << " cuda=0x" << int(e5[i]);
    }
  }
  EXPECT_EQ(bad4, 0u);
  EXPECT_EQ(bad5, 0u);
}
