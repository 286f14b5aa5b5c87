#include "io/user_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "io/errors.h"
#include "io/fs_util.h"
#include "io/json_limits.h"

namespace fp8kv {

namespace fs = std::filesystem;

std::string read_option_file(const std::string& path, std::string_view option) {
  if (path.empty()) throw InputError(fmt::format("{}: empty path", option));
  const std::string kind = path_kind(path);
  if (kind == "missing") throw InputError(fmt::format("{} {}: no such file", option, path));
  if (kind != "a regular file") throw InputError(fmt::format("{} {}: is {}, expected a file", option, path, kind));
  if (::access(path.c_str(), R_OK) != 0)
    throw InputError(fmt::format("{} {}: cannot read: {}", option, path, std::strerror(errno)));
  try {
    return read_file(path);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{} {}", option, e.what()));
  }
}

std::string read_option_json(const std::string& path, std::string_view option) {
  std::string s = read_option_file(path, option);
  check_json_depth(s, fmt::format("{} {}", option, path));
  return s;
}

void check_writable_dir(const fs::path& dir, const std::string& path, std::string_view option) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (ec || !fs::exists(st))
    throw InputError(fmt::format("{} {}: directory {} does not exist", option, path, dir.string()));
  if (!fs::is_directory(st)) throw InputError(fmt::format("{} {}: {} is not a directory", option, path, dir.string()));
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(fmt::format("{} {}: cannot write in {}: {}", option, path, dir.string(), std::strerror(errno)));
  // access() says yes to root everywhere and knows nothing of /proc, /sys or
  // a full inode table: create (and remove) an empty probe file, the way the
  // output will be written (atomic_write_file's temp file in this directory).
  const fs::path probe = dir / fmt::format(".fp8kv-probe.{}", static_cast<long>(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw InputError(fmt::format("{} {}: cannot write in {}: {}", option, path, dir.string(), std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

namespace {
fs::path parent_of(const std::string& path) {
  fs::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "a/b/" -> "a/b"
  return p.has_parent_path() ? p.parent_path() : fs::path(".");
}
}  // namespace

void check_output_file(const std::string& path, std::string_view option) {
  if (path.empty()) throw InputError(fmt::format("{}: empty path", option));
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!ec && fs::is_directory(st)) throw InputError(fmt::format("{} {}: is a directory, expected a file path", option, path));
  // The output replaces the file by rename: a device (/dev/null), a FIFO or a
  // socket would be replaced by a regular file, so only a regular file (or a
  // new path) is accepted. A symlink is followed: its target must be regular.
  if (!ec && fs::exists(st) && !fs::is_regular_file(st))
    throw InputError(fmt::format("{} {}: is not a regular file (a device, FIFO or socket); give a file path", option, path));
  check_writable_dir(parent_of(path), path, option);
  // The file itself is replaced by rename (atomic_write_file), so only the
  // directory needs write permission.
}

void check_output_dir_parent(const std::string& path, std::string_view option) {
  if (path.empty()) throw InputError(fmt::format("{}: empty path", option));
  check_writable_dir(parent_of(path), path, option);
}

std::vector<int64_t> parse_int_list(std::string_view csv, std::string_view option, int64_t min, int64_t max) {
  std::vector<int64_t> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = csv.find(',', start);
    std::string_view item = csv.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    int64_t v = 0;
    const auto [ptr, err] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || err != std::errc() || ptr != item.data() + item.size() || v < min || v > max)
      throw InputError(fmt::format("{} '{}': '{}' is not an integer in [{}, {}]", option, csv, item, min, max));
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace fp8kv
