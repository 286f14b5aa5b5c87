// Files written by the Python safetensors library (tests/golden/safetensors_py,
// produced by tools/check_safetensors_interop.py on the GPU machine) read back
// with our reader: dtype, shape, raw bytes and float32 values must match what
// Python recorded. Skips while the goldens are absent.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"

using namespace fp8kv;
namespace fs = std::filesystem;

namespace {

std::string to_hex(const std::byte* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<uint8_t>(p[i]);
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

double json_value(const nlohmann::json& v) {
  if (v.is_string()) {
    if (v == "nan") return std::numeric_limits<double>::quiet_NaN();
    return v == "inf" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  }
  return v.get<double>();
}

}  // namespace

TEST(SafetensorsInterop, ReadsFilesWrittenByPython) {
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests/golden/safetensors_py";
  if (!fs::exists(dir / "expected.json"))
    GTEST_SKIP() << "golden missing: run `python3 tools/check_safetensors_interop.py` on the GPU machine";
  const auto exp = nlohmann::json::parse(std::ifstream(dir / "expected.json"));
  int tensors_checked = 0;
  for (const auto& [file, spec] : exp["files"].items()) {
    auto f = SafetensorsFile::open(dir / file);
    for (const auto& [k, v] : spec["metadata"].items()) EXPECT_EQ(f->metadata().at(k), v.get<std::string>()) << file;
    EXPECT_EQ(f->tensors().size(), spec["tensors"].size()) << file;
    for (const auto& [name, t] : spec["tensors"].items()) {
      SCOPED_TRACE(file + ":" + name);
      const TensorInfo* info = f->find(name);
      ASSERT_NE(info, nullptr);
      EXPECT_EQ(dtype_name(info->dtype), t["dtype"].get<std::string>());
      EXPECT_EQ(info->shape, t["shape"].get<std::vector<int64_t>>());
      const TensorView view = f->view(name);
      if (view.nbytes()) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(view.data) % dtype_size(info->dtype), 0u);
      }
      EXPECT_EQ(to_hex(view.data, view.nbytes()), t["hex"].get<std::string>());
      if (is_float_dtype(info->dtype)) {
        const auto got = f->to_f32(name);
        ASSERT_EQ(got.size(), t["values"].size());
        for (size_t i = 0; i < got.size(); ++i) {
          // Python recorded exact values (as double); every one is exactly
          // representable after conversion to float32 except F64's, which
          // must equal the rounded double.
          const float want = static_cast<float>(json_value(t["values"][i]));
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got[i])) << i;
          } else {
            EXPECT_EQ(got[i], want) << i;
            EXPECT_EQ(std::signbit(got[i]), std::signbit(want)) << i;  // -0.0 stays -0.0
          }
        }
      }
      ++tensors_checked;
    }
  }
  EXPECT_GE(tensors_checked, 18);
}
