// The server logs through the same stderr logger as the engine ("fp8kv"):
// stdout carries no logs (docs/design.md "Command line").
#pragma once
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace fp8kv::server {

inline spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> l = [] {
    auto x = spdlog::get("fp8kv");
    return x ? x : spdlog::stderr_color_mt("fp8kv");
  }();
  return *l;
}

}  // namespace fp8kv::server
