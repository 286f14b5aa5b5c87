// Atomic file replace, sha256, small file helpers.
#pragma once
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>

namespace fp8kv {
std::string read_file(const std::filesystem::path& p);  // throws InputError naming p
// read_file of a JSON file, its nesting depth checked (io/json_limits.h)
// before anyone parses it: every JSON file fp8kv reads goes through this.
std::string read_json_text(const std::filesystem::path& p);
// read_json_text parsed; invalid JSON is an InputError "P: invalid JSON: ...".
nlohmann::json read_json_file(const std::filesystem::path& p);
// read_json_file of a file that must hold an object (else InputError
// "P: expected a JSON object").
nlohmann::json read_json_object(const std::filesystem::path& p);
// An optional input file (generation_config.json, chat_template.jinja, ...):
// true when `p` is a regular file (or a link to one), false when nothing is
// there; a path that exists but is something else (a directory, a FIFO, a
// device, a socket, a symlink loop or a dangling link) is refused with
// InputError naming what it is, as a required file would be.
bool optional_file(const std::filesystem::path& p);
// What a path that is not a regular file is, for messages: "a directory",
// "a FIFO", "a symlink loop", "a dangling symlink", "missing", ...
std::string path_kind(const std::filesystem::path& p);
// Write to "<p>.tmp.<pid>.<rand>" in the same directory, fsync, rename over p,
// fsync the directory. Never leaves a partial p.
void atomic_write_file(const std::filesystem::path& p, std::string_view content);
std::string sha256_hex(std::span<const std::byte> data);
std::string sha256_file_hex(const std::filesystem::path& p);
}  // namespace fp8kv
