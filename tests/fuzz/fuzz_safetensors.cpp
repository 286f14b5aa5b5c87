// libFuzzer target: the safetensors header parser must reject any malformed
// input with InputError, never crash, hang or read out of bounds. Build and
// run: docs/fuzzing.md.
#include <cstddef>
#include <cstdint>
#include <span>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto h = fp8kv::parse_safetensors_header(bytes, size, "fuzz");
    // Accepted headers must describe spans inside the input.
    for (const auto& t : h.tensors)
      if (h.data_start + t.end > size || t.begin > t.end) __builtin_trap();
  } catch (const fp8kv::InputError&) {
  }
  return 0;
}
