// Tensor (a non-owning 2-D view of backend memory), DeviceBuffer (an owning
// allocation made by a Backend) and the small enums the ops share. Host
// memory on the CPU backend, device memory on CUDA (backend/backend.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "numerics/fp8_weights.h"

namespace fp8kv {

enum class ScalarType : uint8_t { f32, bf16, f16, i32, i64, u8 };

inline size_t scalar_type_bytes(ScalarType d) {
  switch (d) {
    case ScalarType::f32: return 4;
    case ScalarType::bf16: return 2;
    case ScalarType::f16: return 2;
    case ScalarType::i32: return 4;
    case ScalarType::i64: return 8;
    case ScalarType::u8: return 1;
  }
  return 0;
}

inline const char* scalar_type_name(ScalarType d) {
  switch (d) {
    case ScalarType::f32: return "f32";
    case ScalarType::bf16: return "bf16";
    case ScalarType::f16: return "f16";
    case ScalarType::i32: return "i32";
    case ScalarType::i64: return "i64";
    case ScalarType::u8: return "u8";
  }
  return "?";
}

// Gated MLP activation: out = act(gate) * up.
enum class Activation : uint8_t { silu, gelu_tanh, gelu };

// Row-major contiguous [rows][cols] view. Empty (data == nullptr) marks an
// absent optional tensor (a bias, a QK-norm weight). An fp8 weight matrix is
// dtype u8 (e4m3 bytes) with fp8.data set: its scales (numerics/fp8_weights.h).
struct Tensor {
  void* data = nullptr;
  ScalarType dtype = ScalarType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  Fp8WeightScales fp8;  // fp8 weights only (data null otherwise)

  bool empty() const { return data == nullptr; }
  bool is_fp8_weight() const { return dtype == ScalarType::u8 && fp8.data != nullptr; }
  int64_t numel() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(numel()) * scalar_type_bytes(dtype); }
  size_t row_bytes() const { return static_cast<size_t>(cols) * scalar_type_bytes(dtype); }
  // Rows [r0, r0 + n) (no bounds beyond this view; throws when out of range).
  Tensor rows_slice(int64_t r0, int64_t n) const {
    if (r0 < 0 || n < 0 || r0 + n > rows) throw std::out_of_range("Tensor::rows_slice");
    return Tensor{static_cast<char*>(data) + static_cast<size_t>(r0) * row_bytes(), dtype, n, cols};
  }
  // The same memory seen as [r][c] (r * c must equal numel()).
  Tensor reshaped(int64_t r, int64_t c) const {
    if (r * c != numel()) throw std::invalid_argument("Tensor::reshaped: element count differs");
    return Tensor{data, dtype, r, c};
  }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
};

// An owning allocation; move-only. The Backend that made it must outlive it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t bytes, std::function<void(void*)> release)
      : data_(data), bytes_(bytes), release_(std::move(release)) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), release_(std::move(o.release_)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      release_ = std::move(o.release_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // A [rows][cols] view of the start of the buffer (throws when it does not fit).
  Tensor view(ScalarType dtype, int64_t rows, int64_t cols) const {
    const size_t need = static_cast<size_t>(rows * cols) * scalar_type_bytes(dtype);
    if (need > bytes_)
      throw std::invalid_argument("DeviceBuffer::view: " + std::to_string(need) + " bytes wanted, " +
                                  std::to_string(bytes_) + " allocated");
    return Tensor{data_, dtype, rows, cols};
  }
  void reset() {
    if (data_ && release_) release_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> release_;
};

}  // namespace fp8kv
