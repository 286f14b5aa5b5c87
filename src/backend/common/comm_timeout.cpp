#include "backend/common/comm_timeout.h"

#include <cstdlib>

namespace fp8kv {

double comm_timeout_seconds() {
  if (const char* v = std::getenv("FP8KV_COMM_TIMEOUT_S")) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end != v && *end == '\0' && s > 0 && s < 1e6) return s;
  }
  return kDefaultCommTimeoutSeconds;
}

}  // namespace fp8kv
