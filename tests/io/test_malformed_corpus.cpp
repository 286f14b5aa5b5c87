// Replays every file of tests/data/malformed/ (also the fuzzer's seed corpus):
// each must be rejected with InputError for the reason its name says, never
// crash, through both the in-memory parser and the mmap reader.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "io/safetensors.h"

using namespace fp8kv;
namespace fs = std::filesystem;

TEST(MalformedCorpus, EveryFileRejectedWithReason) {
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests/data/malformed";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  // Expected substring of the error per file (file stem -> reason).
  const std::map<std::string, std::string> reason = {
      {"empty", "empty file"},
      {"short_5_bytes", "shorter than the 8-byte"},
      {"header_len_beyond_file", "beyond the end"},
      {"header_len_over_100mib", "100 MiB"},
      {"header_len_u64_max", "100 MiB"},
      {"invalid_json", "not valid JSON"},
      {"not_an_object", "JSON object"},
      {"invalid_utf8_name", "not valid JSON"},
      {"unknown_dtype", "unknown dtype"},
      {"missing_dtype", "dtype"},
      {"shape_size_mismatch", "data_offsets span"},
      {"offsets_out_of_range", "out of range"},
      {"offsets_overflow", "out of range"},
      {"offsets_too_big_for_u64", "non-negative integers"},
      {"offsets_begin_after_end", "begin > end"},
      {"offsets_wrong_arity", "[begin, end]"},
      {"overlapping_spans", "overlap"},
      {"hole_between_tensors", "hole"},
      {"hole_at_start", "hole"},
      {"trailing_bytes", "trailing"},
      {"duplicate_name", "duplicate"},
      {"negative_dim", "non-negative integer"},
      {"float_dim", "non-negative integer"},
      {"string_dim", "non-negative integer"},
      {"shape_product_overflow", "overflow"},
      {"metadata_not_string", "__metadata__"},
      {"entry_not_object", "not an object"},
  };
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    ++n;
    const std::string stem = e.path().stem().string();
    std::ifstream in(e.path(), std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(s.data()), s.size());
    std::string err;
    try {
      parse_safetensors_header(bytes, s.size(), e.path().string());
      ADD_FAILURE() << stem << ": accepted by parse_safetensors_header";
    } catch (const InputError& x) {
      err = x.what();
    }
    EXPECT_THROW(SafetensorsFile::open(e.path()), InputError) << stem;
    EXPECT_NE(err.find(e.path().string()), std::string::npos) << stem << ": error does not name the file: " << err;
    const auto it = reason.find(stem);
    if (it != reason.end()) {
      EXPECT_NE(err.find(it->second), std::string::npos) << stem << ": " << err;
    }
  }
  EXPECT_GE(n, static_cast<int>(reason.size())) << "corpus files missing; run tests/data/malformed/make_corpus.py";
}
