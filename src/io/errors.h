// Error type for bad input (malformed files, bad config, bad scales, ...).
// The message names the file / tensor / field and what was expected. The CLI
// maps InputError to exit code 2.
#pragma once
#include <stdexcept>
#include <string>

namespace fp8kv {
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace fp8kv
