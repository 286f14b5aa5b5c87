// Per-projection GEMV routes (linear_routes.h).
#include "backend/cuda/linear_routes.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "io/errors.h"

namespace fp8kv::cuda {

// Predicted from bench_linear at T = 1 (run E, 2026-12-01: us per call,
// cuBLASLt / simt / mma: qkv 14.6 / 14.3 / 13.1, o_proj 13.9 / 12.7 / 9.4,
// gate_up 56.4 / 55.9 / 61.1, down 31.9 / 41.7 / 41.1, lm_head 239 / 237 /
// 264); docs/cuda_backend.md "GEMV routes" has the engine-level measurement.
const char* const kDefaultLinearRoutes = "qkv=mma,o_proj=mma,gate_up=simt,down=lt,lm_head=simt";

namespace {

constexpr const char* kProjNames[kNumLinearProj] = {"qkv", "o_proj", "gate_up", "down", "lm_head"};
constexpr const char* kKernelNames[] = {"auto", "lt", "simt", "mma"};

std::mutex g_mu;
LinearRoutes g_routes;
bool g_init = false;
std::atomic<uint64_t> g_gen{0};

void init_locked() {
  if (g_init) return;
  const char* e = std::getenv("FP8KV_GEMV_ROUTES");
  g_routes = parse_linear_routes(e ? e : "", "FP8KV_GEMV_ROUTES");
  g_init = true;
}

}  // namespace

LinearRoutes parse_linear_routes(std::string_view spec, std::string_view source) {
  if (spec.empty() || spec == "default") spec = kDefaultLinearRoutes;
  LinearRoutes r;
  size_t i = 0;
  while (i <= spec.size()) {
    const size_t j = std::min(spec.find(',', i), spec.size());
    const std::string_view item = spec.substr(i, j - i);
    i = j + 1;
    if (item.empty()) {
      if (j == spec.size()) break;
      continue;
    }
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      throw InputError(fmt::format("{}: '{}' is not PROJECTION=KERNEL (e.g. down=lt)", source, item));
    const std::string_view key = item.substr(0, eq), val = item.substr(eq + 1);
    if (key == "store") {
      if (val != "fused" && val != "separate")
        throw InputError(fmt::format("{}: store must be fused or separate, got '{}'", source, val));
      r.fused_store = val == "fused";
      continue;
    }
    int p = -1, k = -1;
    for (int x = 0; x < kNumLinearProj; ++x)
      if (key == kProjNames[x]) p = x;
    for (int x = 0; x < 4; ++x)
      if (val == kKernelNames[x]) k = x;
    if (p < 0)
      throw InputError(fmt::format("{}: unknown projection '{}' (qkv, o_proj, gate_up, down, lm_head, store)", source, key));
    if (k < 0) throw InputError(fmt::format("{}: unknown kernel '{}' for {} (auto, lt, simt, mma)", source, val, key));
    r.kernel[static_cast<size_t>(p)] = static_cast<GemvKernel>(k);
  }
  return r;
}

std::string linear_routes_string(const LinearRoutes& r) {
  std::string s;
  for (int p = 0; p < kNumLinearProj; ++p)
    s += fmt::format("{}{}={}", p ? "," : "", kProjNames[p], kKernelNames[static_cast<int>(r.kernel[p])]);
  return s + (r.fused_store ? ",store=fused" : ",store=separate");
}

LinearRoutes linear_routes() {
  std::lock_guard<std::mutex> lock(g_mu);
  init_locked();
  return g_routes;
}

void set_linear_routes(const LinearRoutes& r) {
  std::lock_guard<std::mutex> lock(g_mu);
  init_locked();
  if (r == g_routes) return;
  g_routes = r;
  g_gen.fetch_add(1);
}

uint64_t linear_routes_generation() { return g_gen.load(); }

}  // namespace fp8kv::cuda
