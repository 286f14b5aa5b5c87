// The one place a backend is chosen (backend/backend.h make_backend).
//
// The CUDA backend plugs in here: a build whose engine module links
// fp8kv_cuda (backend/cuda/cuda_backend.cpp, which defines
// make_cuda_backend, cuda_device_available and cuda_device_count) defines
// FP8KV_HAVE_CUDA_BACKEND, and `cuda` / `auto` then construct it. Until then
// `--backend cuda` is refused with one clear line (exit 2 in the CLI).
#include <string>

#include "backend/backend.h"
#include "io/errors.h"

namespace fp8kv {

#ifndef FP8KV_HAVE_CUDA_BACKEND
bool cuda_device_available() { return false; }
int cuda_device_count() { return 0; }
#endif

std::string resolve_backend_name(std::string_view name) {
  if (name == "cpu" || name == "cuda") return std::string(name);
  if (name != "auto") throw InputError("--backend must be auto, cpu or cuda (got '" + std::string(name) + "')");
#ifdef FP8KV_HAVE_CUDA_BACKEND
  if (cuda_device_available()) return "cuda";
#endif
  return "cpu";
}

std::string require_backend(std::string_view name) {
  const std::string n = resolve_backend_name(name);
  if (n == "cuda") {
#if defined(FP8KV_HAVE_CUDA_BACKEND)
    if (!cuda_device_available()) throw InputError("--backend cuda: no CUDA device is available; use --backend cpu");
#elif defined(FP8KV_HAVE_CUDA)
    throw InputError("--backend cuda: the CUDA engine path is not available yet; use --backend cpu");
#else
    throw InputError("--backend cuda: this build has no CUDA backend (configure with -DFP8KV_CUDA=ON); use --backend cpu");
#endif
  }
  return n;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const ModelConfig& cfg, const BackendOptions& opts) {
#if defined(FP8KV_HAVE_CUDA_BACKEND)
  if (require_backend(name) == "cuda") return make_cuda_backend(cfg, opts);
#else
  (void)require_backend(name);
#endif
  return make_cpu_backend(cfg, opts);
}

}  // namespace fp8kv
