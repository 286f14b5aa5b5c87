// Atomic file replace, sha256, small file helpers.
#pragma once
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace fp8kv {
std::string read_file(const std::filesystem::path& p);  // throws InputError naming p
// Write to "<p>.tmp.<pid>.<rand>" in the same directory, fsync, rename over p,
// fsync the directory. Never leaves a partial p.
void atomic_write_file(const std::filesystem::path& p, std::string_view content);
std::string sha256_hex(std::span<const std::byte> data);
std::string sha256_file_hex(const std::filesystem::path& p);
}  // namespace fp8kv
