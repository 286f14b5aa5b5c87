// The golden reader of the tests (tests/common/golden.h): NAME, else NAME.gz,
// and a missing, truncated or corrupt golden is an error, never empty data.
#include <gtest/gtest.h>
#include <zlib.h>

#include <fstream>
#include <stdexcept>
#include <string>

#include "../common/golden.h"
#include "../common/temp_dir.h"

namespace fp8kv::test_util {
namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string gzip_bytes(const TempDir& dir, const std::string& text) {
  const fs::path p = dir.path() / "scratch.gz";
  gzFile f = gzopen(p.c_str(), "wb9");
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  EXPECT_EQ(gzclose(f), Z_OK);
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::string kDoc = R"({"cases": [1, 2, 3], "text": "h\u00e9llo"})";

TEST(GoldenReader, ReadsThePlainFileFirst) {
  TempDir d;
  write_file(d.path() / "a.json", kDoc);
  write_file(d.path() / "a.json.gz", gzip_bytes(d, "other"));
  EXPECT_EQ(find_golden(d.path() / "a.json"), d.path() / "a.json");
  EXPECT_EQ(read_golden(d.path() / "a.json"), kDoc);
}

TEST(GoldenReader, FallsBackToTheGzipFile) {
  TempDir d;
  write_file(d.path() / "a.json.gz", gzip_bytes(d, kDoc));
  EXPECT_EQ(find_golden(d.path() / "a.json"), d.path() / "a.json.gz");
  EXPECT_EQ(read_golden(d.path() / "a.json"), kDoc);
}

TEST(GoldenReader, MissingIsAnError) {
  TempDir d;
  EXPECT_FALSE(find_golden(d.path() / "a.json"));
  EXPECT_THROW(read_golden(d.path() / "a.json"), std::runtime_error);
}

TEST(GoldenReader, TruncatedOrCorruptGzipIsAnError) {
  TempDir d;
  std::string big;
  for (int i = 0; i < 20000; ++i) big += std::to_string(i * 7919 % 10007) + ",";
  const std::string gz = gzip_bytes(d, big);
  write_file(d.path() / "cut.json.gz", gz.substr(0, gz.size() / 2));
  EXPECT_THROW(read_golden(d.path() / "cut.json"), std::runtime_error);
  std::string flipped = gz;
  flipped[gz.size() - 6] ^= 0x5a;  // the CRC32 of the trailer
  write_file(d.path() / "crc.json.gz", flipped);
  EXPECT_THROW(read_golden(d.path() / "crc.json"), std::runtime_error);
}

}  // namespace
}  // namespace fp8kv::test_util
