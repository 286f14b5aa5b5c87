#include "numerics/version.h"

namespace fp8kv {
std::string version_string() { return std::string(FP8KV_VERSION) + " (" + FP8KV_GIT_COMMIT + ")"; }
}  // namespace fp8kv
