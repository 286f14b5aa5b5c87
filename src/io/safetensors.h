// safetensors reader (mmap, zero-copy views) and writer.
// Format: 8-byte little-endian header length N, N bytes of JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data region; offsets are relative to the data region.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/errors.h"

namespace fp8kv {

enum class DType : uint8_t { BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2 };
std::string_view dtype_name(DType d);          // "F32", "BF16", ...
std::optional<DType> parse_dtype(std::string_view s);
size_t dtype_size(DType d);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data region
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(end - begin); }
};

// A read-only tensor: `data` points into the mmap when aligned for the dtype,
// else into an owned copy (docs/design.md "Checkpoints": misaligned data is copied, not viewed).
struct TensorView {
  const TensorInfo* info = nullptr;
  const std::byte* data = nullptr;
  DType dtype() const { return info->dtype; }
  const std::vector<int64_t>& shape() const { return info->shape; }
  int64_t numel() const { return info->numel(); }
  size_t nbytes() const { return info->nbytes(); }
};

// Parse and strictly validate a header (exposed for the fuzz target and
// tests). `file_size` is the whole file's size. Throws InputError naming
// `source` and the tensor on any problem.
struct ParsedHeader {
  uint64_t header_len = 0;
  uint64_t data_start = 0;  // 8 + header_len
  std::vector<TensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
};
ParsedHeader parse_safetensors_header(std::span<const std::byte> file_prefix, uint64_t file_size,
                                      const std::string& source);

class SafetensorsFile {
 public:
  // Opens and validates; throws InputError on malformed input.
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(const std::string& name) const;
  // Throws InputError "<file>: tensor <name> not found" when absent.
  TensorView view(const std::string& name) const;
  // Any float dtype (F32/F16/BF16/F64/F8_*) converted to float32.
  std::vector<float> to_f32(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  ParsedHeader header_;
  int fd_ = -1;
  const std::byte* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, size_t> index_;
  mutable std::mutex copies_mutex_;  // view() may be called from several threads
  mutable std::map<std::string, std::unique_ptr<std::byte[]>> copies_;  // misaligned tensors
};

bool is_float_dtype(DType d);  // F16, BF16, F32, F64, F8_E4M3, F8_E5M2
// Converts a view of any float dtype to float32 (throws InputError otherwise).
void tensor_to_f32(const TensorView& v, std::span<float> out);

// Writing: header JSON + data. As the Python library: the header is padded
// with spaces so the data region starts 8-aligned, tensors are ordered by
// dtype size (largest first) then name, so each tensor is aligned to its
// dtype size with no padding between tensors (no holes).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;  // exactly numel * dtype_size bytes
};
TensorToWrite make_f32_tensor(std::string name, std::vector<int64_t> shape, std::span<const float> values);
// Serializes to bytes (used by the writer and by tests).
std::vector<std::byte> serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                                             const std::map<std::string, std::string>& metadata = {});
// Writes atomically (temp file in the same dir, fsync, rename, fsync dir).
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace fp8kv
