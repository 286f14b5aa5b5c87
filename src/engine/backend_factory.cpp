// The one place a backend is chosen (backend/backend.h make_backend).
//
// The CUDA backend plugs in here: a build whose engine module links
// fp8kv_cuda (backend/cuda/cuda_backend.cpp, which defines
// make_cuda_backend, cuda_device_available and cuda_device_count) defines
// FP8KV_HAVE_CUDA_BACKEND, and `cuda` / `auto` then construct it. Until then
// `--backend cuda` is refused with one clear line (exit 2 in the CLI).
#include "backend/backend.h"
#include "io/errors.h"

namespace fp8kv {

#ifndef FP8KV_HAVE_CUDA_BACKEND
bool cuda_device_available() { return false; }
int cuda_device_count() { return 0; }
#endif

BackendKind resolve_backend(BackendChoice choice) {
  switch (choice) {
    case BackendChoice::cpu: return BackendKind::cpu;
    case BackendChoice::cuda: return BackendKind::cuda;
    case BackendChoice::auto_: break;
  }
#ifdef FP8KV_HAVE_CUDA_BACKEND
  if (cuda_device_available()) return BackendKind::cuda;
#endif
  return BackendKind::cpu;
}

namespace {
BackendKind require_kind(BackendKind k) {
  if (k == BackendKind::cuda) {
#if defined(FP8KV_HAVE_CUDA_BACKEND)
    if (!cuda_device_available()) throw InputError("--backend cuda: no CUDA device is available; use --backend cpu");
#elif defined(FP8KV_HAVE_CUDA)
    throw InputError("--backend cuda: the CUDA engine path is not available yet; use --backend cpu");
#else
    throw InputError("--backend cuda: this build has no CUDA backend (configure with -DFP8KV_CUDA=ON); use --backend cpu");
#endif
  }
  return k;
}
}  // namespace

BackendKind require_backend(BackendChoice choice) { return require_kind(resolve_backend(choice)); }

std::unique_ptr<Backend> make_backend(BackendKind kind, const ModelConfig& cfg, const BackendOptions& opts) {
#if defined(FP8KV_HAVE_CUDA_BACKEND)
  if (require_kind(kind) == BackendKind::cuda) return make_cuda_backend(cfg, opts);
#else
  (void)require_kind(kind);
#endif
  return make_cpu_backend(cfg, opts);
}

std::unique_ptr<Backend> make_backend(BackendChoice choice, const ModelConfig& cfg, const BackendOptions& opts) {
  return make_backend(resolve_backend(choice), cfg, opts);
}

}  // namespace fp8kv
