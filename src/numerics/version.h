#pragma once
#include <string>
namespace fp8kv {
// "0.1.0 (abc123def456)": goes into every JSON result as "fp8kv_version".
inline std::string version_string() { return std::string(FP8KV_VERSION) + " (" + FP8KV_GIT_COMMIT + ")"; }
}  // namespace fp8kv
