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
