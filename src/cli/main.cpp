// fp8kv: one binary, one file per subcommand (src/cli/cmd_*.cpp).
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"

namespace {

// The option named `name` on the parsed command chain, or nullptr.
const CLI::Option* find_option(const CLI::App& app, const std::string& name) {
  if (const CLI::Option* o = app.get_option_no_throw(name)) return o;
  for (const CLI::App* sub : app.get_subcommands())
    if (const CLI::Option* o = find_option(*sub, name)) return o;
  return nullptr;
}

// CLI11's "Could not convert: --max-tokens = abc" says neither what was
// expected nor the range: name both, as every other flag error does.
std::string parse_error_text(const CLI::App& app, const CLI::ParseError& e) {
  const std::string m = e.what(), pre = "Could not convert: ";
  const size_t eq = m.find(" = ");
  if (m.rfind(pre, 0) != 0 || eq == std::string::npos) return m;
  const std::string name = m.substr(pre.size(), eq - pre.size()), value = m.substr(eq + 3);
  const CLI::Option* o = find_option(app, name);
  const std::string type = o ? o->get_type_name() : "";
  const std::string rule = type.find(':') == std::string::npos ? "" : "; this option: " + type.substr(type.find(':') + 1);
  const bool is_int = type.rfind("INT", 0) == 0, is_uint = type.rfind("UINT", 0) == 0;
  if (is_int || is_uint) {
    const size_t digits = !value.empty() && (value[0] == '+' || value[0] == '-') ? 1 : 0;
    const bool integral = !value.empty() && digits < value.size() &&
                          value.find_first_not_of("0123456789", digits) == std::string::npos;
    // The value is an integer that did not fit: the type's range. Options are
    // 32-bit unless the value fits in 64 bits and still failed.
    std::string range = is_uint ? "[0, 18446744073709551615]" : "[-2147483648, 2147483647]";
    if (integral && !is_uint) {
      errno = 0;
      (void)std::strtoll(value.c_str(), nullptr, 10);
      if (errno == ERANGE) range = "[-9223372036854775808, 9223372036854775807]";
    }
    if (integral && is_uint && value[0] == '-') return fmt::format("{}: {} is negative (expected an integer in {}{})", name, value, range, rule);
    if (integral) return fmt::format("{}: {} is out of range (expected an integer in {}{})", name, value, range, rule);
    return fmt::format("{}: '{}' is not an integer (expected an integer in {}{})", name, value, range, rule);
  }
  if (type.rfind("FLOAT", 0) == 0) return fmt::format("{}: '{}' is not a number{}", name, value, rule);
  return fmt::format("{}: '{}' is not a valid value{}", name, value, rule);
}

}  // namespace

int main(int argc, char** argv) {
  // Every log line goes to stderr, never stdout (--json output stays clean):
  // spdlog's default logger is the engine's "fp8kv" stderr logger.
  spdlog::set_default_logger(spdlog::stderr_color_mt("fp8kv"));
  CLI::App app{"fp8kv: LLM inference with a calibrated FP8 KV cache"};
  app.require_subcommand(1);
  // --help shows every option's default value (subcommands inherit this).
  app.option_defaults()->always_capture_default();
  // vLLM's -tp N (a two-letter single-dash name, which CLI11 cannot declare).
  std::vector<std::string> args(argv, argv + argc);
  for (auto& s : args) {
    if (s == "-tp") s = "--tensor-parallel-size";
    else if (s.rfind("-tp=", 0) == 0) s = "--tensor-parallel-size=" + s.substr(4);
  }
  std::vector<char*> argp;
  for (auto& s : args) argp.push_back(s.data());
  argv = argp.data();
  app.set_version_flag("--version", fp8kv::version_string());
  for (auto& reg : fp8kv::cli::registry()) reg(app);
  // CLI11 2.1 answers an unknown first word with "A subcommand is required":
  // name the word and list the subcommands instead.
  if (argc > 1 && argv[1][0] != '-' && !fp8kv::cli::is_subcommand(app, argv[1])) {
    std::fprintf(stderr, "error: unknown subcommand '%s' (subcommands: %s; see fp8kv --help)\n", argv[1],
                 fp8kv::cli::subcommand_list(app).c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One "error: " line naming the flag, then where to look.
    std::fprintf(stderr, "error: %s\nRun with --help for more information.\n", parse_error_text(app, e).c_str());
    return 2;  // usage errors are exit code 2 (docs/design.md "Exit codes and errors")
  }
  return fp8kv::cli::run_selected(app);
}
