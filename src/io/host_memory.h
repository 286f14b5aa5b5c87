// The machine's physical memory, for refusing sizes by arithmetic before
// anything is allocated (docs/robustness.md "Sizes").
#pragma once
#include <unistd.h>

#include <cstdint>

namespace fp8kv {

// Bytes of physical memory (0 when unknown).
inline uint64_t host_physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace fp8kv
