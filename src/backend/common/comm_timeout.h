// The default bound on waits between tensor-parallel ranks where no caller
// gives one: the CUDA communicators' TCP rendezvous (backend/cuda/comm/nccl.h)
// and the CUDA one-shot all-reduce's spin. The engine's own TCP channels
// (control, CPU collectives) take --collective-timeout instead
// (engine/tp_runner.h TpMultiProcess). FP8KV_COMM_TIMEOUT_S is one of the three
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
