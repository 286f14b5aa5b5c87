// Reads a golden file under tests/golden. Goldens that only tests read (case
// lists, reference values) are stored gzip-compressed as NAME.gz, written so
// by tools/gen_*goldens*.py; files a loader opens by path (model and
// tokenizer directories) stay plain. tests/golden/README.md has the list.
#pragma once
#include <zlib.h>

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

namespace fp8kv::test_util {

// The golden at `path`: NAME if it exists, else NAME.gz; nullopt when neither does.
inline std::optional<std::filesystem::path> find_golden(const std::filesystem::path& path) {
  if (std::filesystem::exists(path)) return path;
  std::filesystem::path gz = path;
  gz += ".gz";
  if (std::filesystem::exists(gz)) return gz;
  return std::nullopt;
}

// The bytes of the golden at `path` (NAME, or NAME.gz decompressed; zlib reads
// a plain file as it is). Throws when neither exists, on a read error, and on
// a corrupt or truncated .gz.
inline std::string read_golden(const std::filesystem::path& path) {
  const auto found = find_golden(path);
  if (!found) throw std::runtime_error("golden missing: " + path.string() + "[.gz]");
  gzFile f = gzopen(found->c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open golden " + found->string());
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  int err = Z_OK;
  const std::string what = n < 0 ? gzerror(f, &err) : "truncated";
  // gzclose reports a stream that ended early (Z_BUF_ERROR).
  if (gzclose(f) != Z_OK || n < 0) throw std::runtime_error("cannot read golden " + found->string() + ": " + what);
  return out;
}

}  // namespace fp8kv::test_util
