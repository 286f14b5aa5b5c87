// The machine's physical memory, for refusing sizes by arithmetic before
// anything is allocated (docs/robustness.md "Sizes").
#pragma once
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace fp8kv {

// Bytes of physical memory (0 when unknown).
inline uint64_t host_physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// The most memory this process can have, and what sets it: the least of the
// physical memory, the address-space limit (`ulimit -v`: an mmap past it
// fails even for pages never touched) and the cgroup's memory limit (v2
// memory.max, v1 memory.limit_in_bytes: past it the process is OOM-killed).
// bytes 0: unknown.
struct HostMemoryLimit {
  uint64_t bytes = 0;
  std::string what = "this machine's physical memory";
};

namespace detail {
// A cgroup limit file's value; 0 for "max", unreadable or absent.
inline uint64_t read_cgroup_limit(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || s == "max") return 0;
  uint64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return 0;
    if (v > (UINT64_MAX - 9) / 10) return 0;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}
}  // namespace detail

inline HostMemoryLimit host_memory_limit() {
  HostMemoryLimit m;
  m.bytes = host_physical_memory();
  const auto lower = [&](uint64_t v, const char* what) {
    if (v > 0 && (m.bytes == 0 || v < m.bytes)) {
      m.bytes = v;
      m.what = what;
    }
  };
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    lower(static_cast<uint64_t>(rl.rlim_cur), "the address-space limit (ulimit -v)");
  // cgroup v2: "0::/path" in /proc/self/cgroup; v1: the memory controller's line.
  std::ifstream cg("/proc/self/cgroup");
  for (std::string line; std::getline(cg, line);) {
    if (line.rfind("0::", 0) == 0) {
      const std::string path = line.substr(3);
      lower(detail::read_cgroup_limit("/sys/fs/cgroup" + path + "/memory.max"), "the cgroup memory limit (memory.max)");
      lower(detail::read_cgroup_limit("/sys/fs/cgroup/memory.max"), "the cgroup memory limit (memory.max)");
    }
  }
  lower(detail::read_cgroup_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        "the cgroup memory limit (memory.limit_in_bytes)");
  return m;
}

}  // namespace fp8kv
