// A progress bar on stderr for long CLI runs (calibrate, eval): redrawn in
// place at most every 200 ms on a terminal, one line every 5 s otherwise (CI
// logs), and always once at the end. Used as a callback(done, total).
#pragma once
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace fp8kv::cli {

class Progress {
 public:
  // what: the label ("calibrate"); unit: what is counted ("tokens"), may be
  // empty.
  explicit Progress(std::string what, std::string unit = "") : what_(std::move(what)), unit_(std::move(unit)) {}

  void operator()(uint64_t done, uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    const bool last = done >= total;
    if (!last && now - shown_ < std::chrono::milliseconds(tty_ ? 200 : 5000)) return;
    shown_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const int width = 30, fill = total ? static_cast<int>(width * std::min(done, total) / total) : width;
    const std::string unit = unit_.empty() ? "" : " " + unit_;
    std::fprintf(stderr, "%s%s [%s%s] %llu/%llu%s, %.1f s, %.0f%s/s%s", tty_ ? "\r" : "", what_.c_str(),
                 std::string(fill, '#').c_str(), std::string(width - fill, ' ').c_str(),
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total), unit.c_str(), secs,
                 secs > 0 ? done / secs : 0.0, unit.c_str(), tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  std::string what_, unit_;
  bool tty_ = ::isatty(2) != 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), shown_{};
};

}  // namespace fp8kv::cli
