// The startup part of FP8KV_PROFILE (backend/common/profile.h): one dated
// stderr line per startup phase (weights made or read, backend init, weight
// upload, activation buffers, KV pool), so that a GPU run says where a model
// load's time goes (docs/cuda_backend.md "Startup"). Off: nothing is printed
// and a phase costs one clock read. Header only: the engine and the backends
// use it.
#pragma once
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "backend/common/profile.h"

namespace fp8kv {

inline bool startup_profile_on() { return profile_config().startup; }

// Times one phase from construction to destruction (or done()) and prints
//   [YYYY-MM-DD hh:mm:ss.mmm] startup: <name>: 1.234 s<detail>
// when the profile is on. detail: appended as given (e.g. ", 16.1 GB, 12.0 GB/s").
class StartupPhase {
 public:
  // Reads the switch here, not in the destructor: a bad FP8KV_PROFILE value
  // throws InputError from the constructor.
  explicit StartupPhase(std::string name)
      : name_(std::move(name)), on_(startup_profile_on()), t0_(std::chrono::steady_clock::now()) {}
  StartupPhase(const StartupPhase&) = delete;
  StartupPhase& operator=(const StartupPhase&) = delete;
  ~StartupPhase() { done(); }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  void set_detail(std::string d) { detail_ = std::move(d); }
  void done() {
    if (printed_) return;
    printed_ = true;
    if (!on_) return;
    const double s = seconds();
    const auto now = std::chrono::system_clock::now();
    const std::time_t tt = std::chrono::system_clock::to_time_t(now);
    const long ms = static_cast<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
    std::tm tm{};
    gmtime_r(&tt, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    fmt::print(stderr, "[{}.{:03d}] startup: {}: {:.3f} s{}\n", stamp, ms, name_, s, detail_);
    std::fflush(stderr);
  }

 private:
  std::string name_, detail_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
  bool printed_ = false;
};

}  // namespace fp8kv
