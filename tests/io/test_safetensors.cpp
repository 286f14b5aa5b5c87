// safetensors reader/writer: round trips over every dtype, dtype conversion
// against hand-computed bit patterns, misaligned data, validation messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "../common/temp_dir.h"
#include "io/safetensors.h"

using namespace fp8kv;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

template <class T>
TensorToWrite make_tensor(std::string name, DType dt, std::vector<int64_t> shape, const std::vector<T>& vals) {
  TensorToWrite t{std::move(name), dt, std::move(shape), {}};
  t.data.resize(vals.size() * sizeof(T));
  if (!vals.empty()) std::memcpy(t.data.data(), vals.data(), t.data.size());
  return t;
}

std::span<const std::byte> as_span(const std::vector<std::byte>& v) { return {v.data(), v.size()}; }

std::vector<std::byte> raw_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<std::byte> out(8 + header.size() + data.size());
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = std::byte((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

void write_bytes(const fs::path& p, const std::vector<std::byte>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::string parse_error(const std::vector<std::byte>& file, const std::string& src = "x.safetensors") {
  try {
    parse_safetensors_header(as_span(file), file.size(), src);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, DtypeNamesRoundTrip) {
  for (int i = 0; i <= static_cast<int>(DType::F8_E5M2); ++i) {
    const auto d = static_cast<DType>(i);
    const auto parsed = parse_dtype(dtype_name(d));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(d);
    EXPECT_EQ(*parsed, d);
    EXPECT_GT(dtype_size(d), 0u);
  }
  EXPECT_FALSE(parse_dtype("F12").has_value());
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
}

TEST(Safetensors, RoundTripAllDtypesAlignedAndZeroCopy) {
  const test_util::TempDir tmp("fp8kv_test_io_roundtrip_");
  const fs::path& dir = tmp.path();
  std::vector<TensorToWrite> ts;
  ts.push_back(make_tensor<uint8_t>("u8", DType::U8, {3}, {1, 2, 255}));
  ts.push_back(make_tensor<uint16_t>("bf16", DType::BF16, {3}, {0x3f80, 0xc0a0, 0x0000}));
  ts.push_back(make_tensor<int64_t>("i64", DType::I64, {2}, {-5, std::numeric_limits<int64_t>::max()}));
  ts.push_back(make_tensor<float>("f32", DType::F32, {2, 2}, {1.5f, -2.0f, 3.25f, 0.0f}));
  ts.push_back(make_tensor<double>("f64", DType::F64, {1}, {0.1}));
  ts.push_back(make_tensor<uint8_t>("e4m3", DType::F8_E4M3, {1, 3}, {0x38, 0x7e, 0xfe}));
  ts.push_back(make_tensor<uint16_t>("f16", DType::F16, {1}, {0x3c00}));
  ts.push_back(make_tensor<float>("empty", DType::F32, {0, 4}, {}));
  const fs::path p = dir / "all.safetensors";
  write_safetensors(p, ts, {{"format", "pt"}});

  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->tensors().size(), ts.size());
  for (const auto& t : ts) {
    const TensorInfo* info = f->find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype);
    EXPECT_EQ(info->shape, t.shape);
    const TensorView v = f->view(t.name);
    ASSERT_EQ(v.nbytes(), t.data.size());
    if (!t.data.empty()) {
      EXPECT_EQ(std::memcmp(v.data, t.data.data(), t.data.size()), 0) << t.name;
      // The writer orders tensors so every one is aligned for its dtype.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(t.dtype), 0u) << t.name;
    }
  }
  // Zero-copy: aligned views point into one mapping at their file offsets.
  const TensorView a = f->view("f64"), b = f->view("i64");
  EXPECT_EQ(a.data - b.data, static_cast<std::ptrdiff_t>(a.info->begin) - static_cast<std::ptrdiff_t>(b.info->begin));
  EXPECT_EQ(f->view("f32").data, f->view("f32").data);
  // Header is padded so the data region starts 8-aligned.
  std::ifstream in(p, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_THROW(f->view("nope"), InputError);
  fs::remove_all(dir);
}

TEST(Safetensors, ToF32MatchesHandDecodedBits) {
  std::vector<TensorToWrite> ts;
  // f16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), 1/3 rounded, +inf
  ts.push_back(make_tensor<uint16_t>("f16", DType::F16, {6}, {0x3c00, 0xc000, 0x7bff, 0x0001, 0x3555, 0x7c00}));
  ts.push_back(make_tensor<uint16_t>("bf16", DType::BF16, {3}, {0x3f80, 0xc0a0, 0x4049}));
  ts.push_back(make_tensor<uint8_t>("e4m3", DType::F8_E4M3, {5}, {0x38, 0x7e, 0xfe, 0x01, 0x7f}));
  ts.push_back(make_tensor<uint8_t>("e5m2", DType::F8_E5M2, {4}, {0x3c, 0x7b, 0x01, 0x7c}));
  ts.push_back(make_tensor<double>("f64", DType::F64, {2}, {0.1, -1e300}));
  ts.push_back(make_tensor<int32_t>("i32", DType::I32, {1}, {7}));
  const auto bytes = serialize_safetensors(ts);
  const test_util::TempDir tmp("fp8kv_test_io_tof32_");
  const fs::path& dir = tmp.path();
  write_bytes(dir / "m.safetensors", bytes);
  auto f = SafetensorsFile::open(dir / "m.safetensors");

  const auto f16 = f->to_f32("f16");
  EXPECT_EQ(f16[0], 1.0f);
  EXPECT_EQ(f16[1], -2.0f);
  EXPECT_EQ(f16[2], 65504.0f);
  EXPECT_EQ(f16[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(f16[4], 0.333251953125f);  // 0x3555 = (1 + 341/1024) * 2^-2
  EXPECT_TRUE(std::isinf(f16[5]) && f16[5] > 0);
  const auto bf = f->to_f32("bf16");
  EXPECT_EQ(bf[0], 1.0f);
  EXPECT_EQ(bf[1], -5.0f);
  EXPECT_EQ(bf[2], 3.140625f);  // 0x4049 = (1 + 73/128) * 2
  const auto e4 = f->to_f32("e4m3");
  EXPECT_EQ(e4[0], 1.0f);
  EXPECT_EQ(e4[1], 448.0f);
  EXPECT_EQ(e4[2], -448.0f);
  EXPECT_EQ(e4[3], std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(e4[4]));
  const auto e5 = f->to_f32("e5m2");
  EXPECT_EQ(e5[0], 1.0f);
  EXPECT_EQ(e5[1], 57344.0f);
  EXPECT_EQ(e5[2], std::ldexp(1.0f, -16));
  EXPECT_TRUE(std::isinf(e5[3]));
  const auto d = f->to_f32("f64");
  EXPECT_EQ(d[0], static_cast<float>(0.1));
  EXPECT_TRUE(std::isinf(d[1]) && d[1] < 0);
  EXPECT_THAT(test_util::input_error_of([&] { f->to_f32("i32"); }), AllOf(HasSubstr("i32"), HasSubstr("I32")));
  fs::remove_all(dir);
}

TEST(Safetensors, MisalignedTensorIsCopiedAligned) {
  // A U8 of 1 byte first puts the F32 at data offset 1 (valid, as the format
  // does not require alignment); 8 + header length is kept a multiple of 8.
  std::string header =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  while ((8 + header.size()) % 8) header += ' ';
  std::vector<uint8_t> data(9);
  data[0] = 42;
  const float vals[2] = {3.5f, -1.25f};
  std::memcpy(data.data() + 1, vals, 8);
  const test_util::TempDir tmp("fp8kv_test_io_misaligned_");
  const fs::path& dir = tmp.path();
  write_bytes(dir / "m.safetensors", raw_file(header, data));
  auto f = SafetensorsFile::open(dir / "m.safetensors");
  const TensorView v = f->view("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % alignof(float), 0u);
  float got[2];
  std::memcpy(got, v.data, 8);
  EXPECT_EQ(got[0], 3.5f);
  EXPECT_EQ(got[1], -1.25f);
  EXPECT_EQ(f->view("b").data, v.data);  // copied once, then reused
  EXPECT_EQ(f->to_f32("b"), (std::vector<float>{3.5f, -1.25f}));
  EXPECT_EQ(static_cast<uint8_t>(f->view("a").data[0]), 42);
  fs::remove_all(dir);
}

TEST(Safetensors, EmptyHeaderAndZeroSizedTensorsAreValid) {
  auto h = parse_safetensors_header(as_span(raw_file("{}", {})), 10, "e");
  EXPECT_TRUE(h.tensors.empty());
  // Several zero-sized tensors at the same offset are not overlaps.
  const auto f = raw_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("c":{"dtype":"F16","shape":[0,3],"data_offsets":[4,4]}})",
                          {0, 0, 0, 0});
  h = parse_safetensors_header(as_span(f), f.size(), "z");
  EXPECT_EQ(h.tensors.size(), 3u);
}

struct BadCase {
  const char* what;
  std::string header;
  std::vector<uint8_t> data;
  const char* expect;  // substring of the error
};

TEST(Safetensors, ValidationErrorsNameFileTensorAndProblem) {
  const std::vector<uint8_t> d8(8, 0);
  const BadCase cases[] = {
      {"invalid json", R"({"w": )", d8, "not valid JSON"},
      {"not object", "[1]", {}, "JSON object"},
      {"unknown dtype", R"({"w":{"dtype":"F12","shape":[2],"data_offsets":[0,8]}})", d8, "unknown dtype 'F12'"},
      {"size mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8, "12 bytes but data_offsets span 8"},
      {"out of range", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8, "out of range"},
      {"overflow", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551615]}})", d8, "out of range"},
      {"begin>end", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8, "begin > end"},
      {"overlap", R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8, "overlap"},
      {"hole", R"({"v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})", d8, "hole"},
      {"trailing", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8, "trailing"},
      {"duplicate", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8, "duplicate"},
      {"negative dim", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8, "non-negative integer"},
      {"float dim", R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", d8, "non-negative integer"},
      {"product overflow", R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904,4],"data_offsets":[0,8]}})", d8, "overflow"},
      {"metadata", R"({"__metadata__":{"a":1},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8, "__metadata__"},
  };
  for (const auto& c : cases) {
    const std::string err = parse_error(raw_file(c.header, c.data), "dir/bad.safetensors");
    ASSERT_FALSE(err.empty()) << c.what << " was accepted";
    EXPECT_NE(err.find("dir/bad.safetensors"), std::string::npos) << c.what << ": " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.what << ": " << err;
    const bool names_tensor = err.find("'w'") != std::string::npos;
    if (std::string(c.what) != "invalid json" && std::string(c.what) != "not object" &&
        std::string(c.what) != "trailing" && std::string(c.what) != "metadata") {
      EXPECT_TRUE(names_tensor) << c.what << ": " << err;
    }
  }
}

TEST(Safetensors, LengthPrefixErrors) {
  EXPECT_NE(parse_error({}).find("empty file"), std::string::npos);
  std::vector<std::byte> five(5);
  EXPECT_NE(parse_error(five).find("shorter than the 8-byte"), std::string::npos);
  auto f = raw_file("{}", {});
  f[0] = std::byte{0xff};  // header length 255 > file
  EXPECT_NE(parse_error(f).find("beyond the end of the file"), std::string::npos);
  f = raw_file("{}", {});
  const uint64_t big = (100ull << 20) + 1;
  for (int i = 0; i < 8; ++i) f[i] = std::byte((big >> (8 * i)) & 0xff);
  EXPECT_NE(parse_error(f).find("100 MiB"), std::string::npos);
  // The file must also be opened cleanly through the mmap path.
  const test_util::TempDir tmp("fp8kv_test_io_len_");
  const fs::path& dir = tmp.path();
  write_bytes(dir / "empty.safetensors", {});
  EXPECT_THROW(SafetensorsFile::open(dir / "empty.safetensors"), InputError);
  EXPECT_THROW(SafetensorsFile::open(dir / "missing.safetensors"), InputError);
  EXPECT_THROW(SafetensorsFile::open(dir), InputError);  // a directory
  fs::remove_all(dir);
}

TEST(Safetensors, WriterRejectsBadTensors) {
  std::vector<TensorToWrite> dup{make_f32_tensor("a", {1}, std::vector<float>{1.f}),
                                 make_f32_tensor("a", {1}, std::vector<float>{2.f})};
  EXPECT_THROW(serialize_safetensors(dup), InputError);
  std::vector<TensorToWrite> bad_size{make_tensor<uint16_t>("a", DType::F32, {1}, {1})};
  EXPECT_THROW(serialize_safetensors(bad_size), InputError);
  EXPECT_THROW(make_f32_tensor("a", {3}, std::vector<float>{1.f}), InputError);
  std::vector<TensorToWrite> bad_utf8{make_f32_tensor("\xff", {1}, std::vector<float>{1.f})};
  EXPECT_THROW(serialize_safetensors(bad_utf8), InputError);
  // Failed write leaves nothing behind.
  const test_util::TempDir tmp("fp8kv_test_io_wfail_");
  const fs::path& dir = tmp.path();
  EXPECT_THROW(write_safetensors(dir / "no_such_dir" / "x.safetensors", dup), InputError);
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

TEST(Safetensors, SerializedOrderMatchesPythonLibrary) {
  // Python safetensors sorts by dtype size (descending), then name.
  std::vector<TensorToWrite> ts{make_tensor<uint8_t>("a_u8", DType::U8, {1}, {1}),
                                make_f32_tensor("z_f32", {1}, std::vector<float>{1.f}),
                                make_tensor<uint16_t>("b_bf16", DType::BF16, {1}, {1}),
                                make_f32_tensor("c_f32", {1}, std::vector<float>{1.f})};
  const auto bytes = serialize_safetensors(ts);
  const auto h = parse_safetensors_header(as_span(bytes), bytes.size(), "o");
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "c_f32");
  EXPECT_EQ(h.tensors[1].name, "z_f32");
  EXPECT_EQ(h.tensors[2].name, "b_bf16");
  EXPECT_EQ(h.tensors[3].name, "a_u8");
}
