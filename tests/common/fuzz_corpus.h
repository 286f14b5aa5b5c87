// The kept inputs of a fuzz target (tests/data/<name>, docs/fuzzing.md),
// which the *_fuzz_corpus tests replay in every build.
#pragma once
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

namespace fp8kv::test_util {

struct CorpusFile {
  std::filesystem::path path;
  std::string bytes;
};

// Every regular file of tests/data/<name> with its bytes, in directory
// order; empty when the folder is missing.
inline std::vector<CorpusFile> fuzz_corpus(const std::string& name) {
  std::vector<CorpusFile> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(
           std::filesystem::path(FP8KV_SOURCE_DIR) / "tests" / "data" / name, ec)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    out.push_back({e.path(), std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>())});
  }
  return out;
}

}  // namespace fp8kv::test_util
