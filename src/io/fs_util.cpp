#include "io/fs_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include "io/errors.h"
#include "io/json_limits.h"

namespace fp8kv {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Retries short writes and EINTR.
bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

struct EvpCtx {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~EvpCtx() { EVP_MD_CTX_free(ctx); }
};

std::string to_hex(const unsigned char* d, unsigned n) {
  static const char* digits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (unsigned i = 0; i < n; ++i) {
    s[2 * i] = digits[d[i] >> 4];
    s[2 * i + 1] = digits[d[i] & 15];
  }
  return s;
}

}  // namespace

std::string read_file(const std::filesystem::path& p) {
  std::error_code ec;
  const auto st = std::filesystem::status(p, ec);
  if (std::filesystem::is_directory(st)) throw InputError(fmt::format("{}: is a directory, expected a file", p.string()));
  // A FIFO with no writer blocks open() forever, and /dev/zero never ends:
  // only a regular file (or a symlink to one) is read (docs/design.md
  // "Command line").
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw InputError(fmt::format("{}: is not a regular file ({}), expected a file", p.string(),
                                 std::filesystem::is_fifo(st)       ? "a FIFO"
                                 : std::filesystem::is_socket(st)   ? "a socket"
                                 : std::filesystem::is_character_file(st) ? "a character device"
                                 : std::filesystem::is_block_file(st)     ? "a block device"
                                                                          : "not a plain file"));
  std::ifstream in(p, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open: {}", p.string(), errno_text()));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw InputError(fmt::format("{}: read error", p.string()));
  return s;
}

std::string path_kind(const std::filesystem::path& p) {
  struct stat lst {};
  if (::lstat(p.c_str(), &lst) != 0) return errno == ENOENT ? "missing" : fmt::format("unreadable ({})", errno_text());
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) {
    if (errno == ELOOP) return "a symlink loop";
    if (errno == ENOENT) return "a dangling symlink";
    return fmt::format("unreadable ({})", errno_text());
  }
  if (S_ISREG(st.st_mode)) return "a regular file";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  return "not a plain file";
}

bool optional_file(const std::filesystem::path& p) {
  const std::string kind = path_kind(p);
  if (kind == "a regular file") return true;
  if (kind == "missing") return false;
  throw InputError(fmt::format("{}: is {}, expected a file (or nothing: it is optional)", p.string(), kind));
}

std::string read_json_text(const std::filesystem::path& p) {
  std::string s = read_file(p);
  check_json_depth(s, p.string());
  return s;
}

nlohmann::json read_json_file(const std::filesystem::path& p) {
  try {
    return nlohmann::json::parse(read_json_text(p));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: invalid JSON: {}", p.string(), e.what()));
  }
}

nlohmann::json read_json_object(const std::filesystem::path& p) {
  nlohmann::json j = read_json_file(p);
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object", p.string()));
  return j;
}

void atomic_write_file(const std::filesystem::path& p, std::string_view content) {
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  std::random_device rd;
  const std::string tmp =
      fmt::format("{}.tmp.{}.{:08x}", p.string(), static_cast<long>(::getpid()), static_cast<unsigned>(rd()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(fmt::format("{}: cannot create temporary file {}: {}", p.string(), tmp, errno_text()));
  auto fail = [&](const std::string& what) {
    const std::string msg = fmt::format("{}: {}: {}", p.string(), what, errno_text());
    ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError(msg);
  };
  if (!write_all(fd, content.data(), content.size())) fail("write failed");
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    const std::string msg = fmt::format("{}: close failed: {}", p.string(), errno_text());
    ::unlink(tmp.c_str());
    throw InputError(msg);
  }
  // rename() replaces the directory entry: a hard link to the old file keeps
  // the old content, and readers see either the old or the new file.
  if (::rename(tmp.c_str(), p.c_str()) != 0) {
    const std::string msg = fmt::format("{}: rename from {} failed: {}", p.string(), tmp, errno_text());
    ::unlink(tmp.c_str());
    throw InputError(msg);
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw InputError(fmt::format("{}: cannot open directory to fsync: {}", dir.string(), errno_text()));
  const int rc = ::fsync(dfd);
  const int saved = errno;
  ::close(dfd);
  if (rc != 0) throw InputError(fmt::format("{}: fsync of directory failed: {}", dir.string(), std::strerror(saved)));
}

std::string sha256_hex(std::span<const std::byte> data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("EVP_Digest(sha256) failed");
  return to_hex(md, len);
}

std::string sha256_file_hex(const std::filesystem::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{}: cannot open: {}", p.string(), errno_text()));
  EvpCtx c;
  if (!c.ctx || EVP_DigestInit_ex(c.ctx, EVP_sha256(), nullptr) != 1) {
    ::close(fd);
    throw std::runtime_error("EVP_DigestInit_ex(sha256) failed");
  }
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      const std::string msg = fmt::format("{}: read error: {}", p.string(), errno_text());
      ::close(fd);
      throw InputError(msg);
    }
    if (r == 0) break;
    EVP_DigestUpdate(c.ctx, buf.data(), static_cast<size_t>(r));
  }
  ::close(fd);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_DigestFinal_ex(c.ctx, md, &len) != 1) throw std::runtime_error("EVP_DigestFinal_ex failed");
  return to_hex(md, len);
}

}  // namespace fp8kv
