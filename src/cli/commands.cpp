#include "cli/commands.h"

#include <cstdio>
#include <map>

#include "io/errors.h"

namespace fp8kv::cli {

std::vector<RegisterFn>& registry() {
  static std::vector<RegisterFn> r;
  return r;
}

namespace {
std::map<CLI::App*, std::function<int()>>& actions() {
  static std::map<CLI::App*, std::function<int()>> a;
  return a;
}
}  // namespace

void set_action(CLI::App* sub, std::function<int()> action) { actions()[sub] = std::move(action); }

int run_selected(CLI::App& app) {
  for (auto& [sub, action] : actions()) {
    if (!sub->parsed()) continue;
    try {
      return action();
    } catch (const UsageError& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    } catch (const InputError& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "internal error: %s\n", e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "error: no subcommand given (see --help)\n");
  (void)app;
  return 2;
}

}  // namespace fp8kv::cli
