// Per-projection GEMV routes (routes.h).
#include "backend/cuda/linear/routes.h"

#include <fmt/format.h>

#include <atomic>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>

#include "backend/common/list_items.h"
#include "io/errors.h"

namespace fp8kv::cuda {

// Measured in the engine (H200, batch 1 1K fp8 with CUDA graphs, one route
// changed at a time): the SIMT GEMV on every projection was at least as fast
// as mma / cuBLASLt (whose standalone bench_linear wins for qkv, o_proj (mma)
// and down (cuBLASLt) did not carry over to the PDL chain), and the fused
// store saved ~0.04 ms per step. The projections whose SIMT GEMV was
// furthest from the copy bandwidth in bench_linear (qkv 0.79, o_proj 0.63,
// down 0.66 of it; gate_up 0.98, lm_head 1.06) take the split-K SIMT kernel
// (qkv, o_proj "simtk" = 4 warps per column at the 8B shape; down 8 warps:
// the best of simt / simt2 / simtk / simt8 / lt), and the activation is fused
// into the gate|up GEMV: 4.586 ms/step against 4.769 with auto everywhere.
// docs/cuda_backend.md "The GEMV route table".
const char* const kDefaultLinearRoutes =
    "qkv=simtk,o_proj=simtk,gate_up=auto,down=simt8,lm_head=auto,store=fused,act=fused";

namespace {

// A route value that is a whole decimal count, or -1 (not one).
int parse_count(std::string_view val) {
  try {
    size_t used = 0;
    const int v = std::stoi(std::string(val), &used);
    return used == val.size() ? v : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

constexpr const char* kProjNames[kNumLinearProj] = {"qkv", "o_proj", "gate_up", "down", "lm_head"};
constexpr const char* kKernelNames[] = {"auto", "lt", "simt", "mma", "simt2", "simt4", "simt8", "simtk"};
constexpr int kNumKernels = static_cast<int>(std::size(kKernelNames));

std::mutex g_mu;
LinearRoutes g_routes;
bool g_init = false;
std::atomic<uint64_t> g_gen{0};

void init_locked() {
  if (g_init) return;
  g_routes = parse_linear_routes(kDefaultLinearRoutes, "kDefaultLinearRoutes");
  g_init = true;
}

}  // namespace

LinearRoutes parse_linear_routes(std::string_view spec, std::string_view source) {
  if (spec.empty() || spec == "default") spec = kDefaultLinearRoutes;
  LinearRoutes r;
  for_each_list_item(spec, [&](std::string_view item) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      throw InputError(fmt::format("{}: '{}' is not PROJECTION=KERNEL (e.g. down=lt)", source, item));
    const std::string_view key = item.substr(0, eq), val = item.substr(eq + 1);
    // key=on or key=off (the two words given); InputError for another value.
    auto two_way = [&](std::string_view on, std::string_view off) {
      if (val != on && val != off)
        throw InputError(fmt::format("{}: {} must be {} or {}, got '{}'", source, key, on, off, val));
      return val == on;
    };
    // key=N for a count N in lo..2^20; InputError naming `what` for another value.
    auto count = [&](int lo, std::string_view what) {
      const int v = parse_count(val);
      if (v < lo || v > (1 << 20)) throw InputError(fmt::format("{}: {} must be {}, got '{}'", source, key, what, val));
      return v;
    };
    if (key == "store") {
      r.fused_store = two_way("fused", "separate");
    } else if (key == "sample") {
      r.sample_in_graph = two_way("graph", "separate");
    } else if (key == "dsplit") {
      r.decode_split_tokens = count(0, "a key count 0..1048576 (0: automatic)");
    } else if (key == "w8a8rows") {
      r.w8a8_min_rows = count(1, "a row count 1..1048576");
    } else if (key == "act") {
      r.fused_act = two_way("fused", "separate");
    } else {
      int p = -1, k = -1;
      for (int x = 0; x < kNumLinearProj; ++x)
        if (key == kProjNames[x]) p = x;
      for (int x = 0; x < kNumKernels; ++x)
        if (val == kKernelNames[x]) k = x;
      if (p < 0)
        throw InputError(fmt::format("{}: unknown projection '{}' (qkv, o_proj, gate_up, down, lm_head, store, act, sample, dsplit, w8a8rows)",
                                     source, key));
      if (k < 0)
        throw InputError(fmt::format("{}: unknown kernel '{}' for {} (auto, lt, simt, mma, simt2, simt4, simt8, simtk)",
                                     source, val, key));
      r.kernel[static_cast<size_t>(p)] = static_cast<GemvKernel>(k);
    }
  });
  return r;
}

std::string linear_routes_string(const LinearRoutes& r) {
  std::string s;
  for (int p = 0; p < kNumLinearProj; ++p)
    s += fmt::format("{}{}={}", p ? "," : "", kProjNames[p], kKernelNames[static_cast<int>(r.kernel[p])]);
  // sample=, dsplit= and w8a8rows= only when not the default, so the canonical strings of earlier runs stay the same.
  return s + (r.fused_store ? ",store=fused" : ",store=separate") + (r.fused_act ? ",act=fused" : ",act=separate") +
         (r.sample_in_graph ? "" : ",sample=separate") +
         (r.decode_split_tokens ? fmt::format(",dsplit={}", r.decode_split_tokens) : std::string()) +
         (r.w8a8_min_rows != LinearRoutes{}.w8a8_min_rows ? fmt::format(",w8a8rows={}", r.w8a8_min_rows)
                                                          : std::string());
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
