// fp8kv: one binary, one file per subcommand (src/cli/cmd_*.cpp).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"fp8kv: LLM inference with a calibrated FP8 KV cache"};
  app.require_subcommand(1);
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
    app.exit(e);
    return 2;  // usage errors are exit code 2 (docs/design.md "Exit codes and errors")
  }
  return fp8kv::cli::run_selected(app);
}
