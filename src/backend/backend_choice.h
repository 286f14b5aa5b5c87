// The --backend choice and the backend it resolves to: a small header, so
// that EngineOptions (engine/engine.h) names them without the Backend
// interface.
#pragma once
#include <cstdint>
#include <string_view>

namespace fp8kv {

// --backend, parsed once by the CLI (cli/engine_flags.h EngineFlags::options()).
// auto_: cuda when the build has the CUDA backend and a GPU is present, else cpu.
enum class BackendChoice : uint8_t { auto_, cpu, cuda };
// "auto" | "cpu" | "cuda": the flag's spelling (logs, reports).
constexpr std::string_view backend_choice_name(BackendChoice c) {
  switch (c) {
    case BackendChoice::auto_: return "auto";
    case BackendChoice::cpu: return "cpu";
    case BackendChoice::cuda: return "cuda";
  }
  return "?";
}
// The backend a BackendChoice resolves to on this machine (never auto).
enum class BackendKind : uint8_t { cpu, cuda };
// "cpu" | "cuda" (the JSON / log spelling; the same as Backend::name()).
constexpr std::string_view backend_kind_name(BackendKind k) { return k == BackendKind::cuda ? "cuda" : "cpu"; }

}  // namespace fp8kv
