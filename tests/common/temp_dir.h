// A fresh temporary directory for one test, removed with everything in it.
#pragma once
#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace fp8kv::test_util {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "fp8kv_test_") {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / (prefix + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace fp8kv::test_util
