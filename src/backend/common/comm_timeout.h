// The bound on every wait between tensor-parallel ranks: the TCP rendezvous
// (backend/common/tcp_rendezvous.h), the collectives built on it and the
// CUDA one-shot all-reduce's spin. FP8KV_COMM_TIMEOUT_S is one of the three
// environment variables read under src/ (docs/design.md); this is its one
// reader. It changes no numerics, only how long a rank waits for a dead peer.
#pragma once
#include <chrono>

namespace fp8kv {

// Default when FP8KV_COMM_TIMEOUT_S is unset or invalid.
inline constexpr double kDefaultCommTimeoutSeconds = 60.0;

// FP8KV_COMM_TIMEOUT_S (seconds, a number in (0, 1e6)) if set and valid,
// else kDefaultCommTimeoutSeconds. Read on every call (not cached), so a
// test can set the variable, build a group, and unset it.
double comm_timeout_seconds();

// comm_timeout_seconds() as a duration (whole milliseconds).
inline std::chrono::milliseconds comm_timeout() {
  return std::chrono::milliseconds(static_cast<long long>(comm_timeout_seconds() * 1000));
}

}  // namespace fp8kv
