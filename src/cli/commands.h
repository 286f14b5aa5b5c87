// Subcommand registration. Each cmd_*.cpp defines a static Registrar that adds
// its subcommand to the CLI::App and sets a callback returning the exit code.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "numerics/version.h"

namespace fp8kv::cli {

using RegisterFn = std::function<void(CLI::App&)>;
std::vector<RegisterFn>& registry();
struct Registrar {
  explicit Registrar(RegisterFn f) { registry().push_back(std::move(f)); }
};

// Bad input or usage: exit code 2, message printed as one line on stderr.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Sets the action run when `sub` was selected; the action returns the exit
// code. Exceptions map to exit codes: UsageError / std::invalid_argument /
// fp8kv::InputError -> 2; std::bad_alloc -> 2 with a hint (the sizes asked
// for are the user's: --kv-memory, --max-model-len, --block-size); anything
// else -> 1 (docs/design.md "Exit codes and errors").
void set_action(CLI::App* sub, std::function<int()> action);
// Top-level subcommand names, for the unknown-subcommand error.
bool is_subcommand(CLI::App& app, const std::string& name);
std::string subcommand_list(CLI::App& app);  // "calibrate, capacity, ..." (sorted)
int run_selected(CLI::App& app);

// A lower bound for a numeric option, worded as the engine flags are
// ("--flag: must be >= 1 (got 0)"), where CLI::PositiveNumber /
// NonNegativeNumber print "Value 0 not in range 0.000000 to 1797..." (issue
// 15 item 11). Non-numbers are left to CLI11's conversion error.
CLI::Validator at_least(double min);
// As at_least, strictly: "--flag: must be > 0 (got 0)".
CLI::Validator greater_than(double min);
// A range for a numeric option: "--top-p: must be in (0, 1], got 2" (each
// end closed unless open_* says so). The project's own wording for every
// numeric option (issue 15): never CLI::Range's "Value 2 not in range ...".
CLI::Validator in_range(double lo, double hi, bool open_lo = false, bool open_hi = false);

// Every `--seed` (generate, eval compare|niah, bench): an integer in [0,
// 2^64 - 1], or -1 for a random seed (vLLM's SamplingParams rule), which is
// drawn here, logged on stderr ("--seed -1: drew random seed N") so the run
// can be repeated, and stored in place of -1. Anything else (other negatives,
// 2^64, 1.5, abc) is refused: "--seed: must be -1 (random) or an integer in
// [0, 18446744073709551615] (got -2)". Use with ->transform(), not ->check()
// (it rewrites -1). docs/design.md "Command line", "One rule per flag".
CLI::Validator seed_rule();

// A token count with vLLM's human-readable suffixes (--max-model-len):
// k/m/g multiply by 1000, K/M/G by 1024 ("32k" = 32000, "32K" = 32768,
// "25.6k" = 25600); the result must be a whole number of at most 2^31 - 1.
// Rewrites the value to digits; use with ->transform().
CLI::Validator token_count_rule();

// A string option given as "" is refused, never read as "not given":
// "--kv-memory: empty value (give WHAT, or omit the flag for the default)".
CLI::Validator non_empty(const std::string& what);

// A text option (--prompt, --text, --control-prefix, --served-model-name,
// bench serve --model): invalid UTF-8 is refused naming the flag, as a text
// file's is (cli/text_input.h): "--prompt: not valid UTF-8 (first invalid
// byte 0xFF at byte offset 1)".
CLI::Validator utf8_text();

// JSON printed or written by a command: a string that came from the user (a
// path as given) and is not UTF-8 becomes U+FFFD, never an exception from
// the serializer (which was exit 1 "internal error").
template <class Json>
std::string dump_json(const Json& j, int indent = 2) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

// A size flag (--kv-memory, --gpu-memory): parse_size's errors name the flag,
// and 0 is refused ("--kv-memory must be > 0"). UsageError -> exit 2.
uint64_t parse_size_flag(const std::string& flag, const std::string& value);

// The shared "bench" parent (latency, throughput, serve): created by whichever
// registrar runs first, found by the others.
CLI::App* bench_parent(CLI::App& app);

}  // namespace fp8kv::cli
