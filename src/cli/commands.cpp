#include "cli/commands.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <new>
#include <random>

#include <fmt/format.h>

#include "backend/common/rank_failure.h"
#include "io/errors.h"
#include "kv/planner.h"  // parse_size
#include "tokenizer/utf8.h"

namespace fp8kv::cli {

namespace {
// A lower bound for a number: v > min (strict) or v >= min.
CLI::Validator lower_bound(double min, bool strict) {
  const char* op = strict ? ">" : ">=";
  return CLI::Validator(
      [min, strict, op](std::string& s) -> std::string {
        double v = 0.0;
        if (!CLI::detail::lexical_cast(s, v)) return {};  // not a number: the conversion names it
        if (!std::isfinite(v)) return fmt::format("must be a finite number {} {} (got {})", op, min, s);
        if (strict ? !(v > min) : v < min) return fmt::format("must be {} {} (got {})", op, min, s);
        return {};
      },
      fmt::format("{}{}", op, min));
}
}  // namespace

CLI::Validator at_least(double min) { return lower_bound(min, false); }
CLI::Validator greater_than(double min) { return lower_bound(min, true); }

CLI::Validator in_range(double lo, double hi, bool open_lo, bool open_hi) {
  const std::string range = fmt::format("{}{}, {}{}", open_lo ? "(" : "[", lo, hi, open_hi ? ")" : "]");
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0.0;
        if (!CLI::detail::lexical_cast(s, v)) return {};  // not a number: the conversion names it
        const bool below = open_lo ? !(v > lo) : !(v >= lo);
        const bool above = open_hi ? !(v < hi) : !(v <= hi);
        if (below || above) return fmt::format("must be in {}, got {}", range, s);
        return {};
      },
      range);
}

CLI::Validator seed_rule() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s == "-1") {
          std::random_device rd;
          const uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
          std::fprintf(stderr, "--seed -1: drew random seed %llu\n", static_cast<unsigned long long>(seed));
          s = std::to_string(seed);
          return {};
        }
        uint64_t v = 0;
        const auto [ptr, err] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || err != std::errc() || ptr != s.data() + s.size())
          return fmt::format("must be -1 (random) or an integer in [0, 18446744073709551615] (got {})", s);
        return {};
      },
      "-1|UINT64");
}

CLI::Validator token_count_rule() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty()) return "empty value (give a token count such as 4096 or 32k)";
        double mult = 1.0;
        std::string num = s;
        switch (s.back()) {
          case 'k': mult = 1e3; break;
          case 'm': mult = 1e6; break;
          case 'g': mult = 1e9; break;
          case 'K': mult = 1024.0; break;
          case 'M': mult = 1024.0 * 1024.0; break;
          case 'G': mult = 1024.0 * 1024.0 * 1024.0; break;
          default: break;
        }
        if (mult == 1.0) return {};  // plain digits: the conversion and the range check name errors
        num.pop_back();
        double v = 0.0;
        const auto [ptr, err] = std::from_chars(num.data(), num.data() + num.size(), v);
        if (num.empty() || err != std::errc() || ptr != num.data() + num.size() || !std::isfinite(v))
          return fmt::format("'{}' is not a token count (N, or N with k/m/g x1000 or K/M/G x1024)", s);
        const double total = v * mult, whole = std::round(total);  // 25.6 * 1000 is 25600.000000000004
        if (std::fabs(total - whole) > 1e-6 * std::max(1.0, whole) || whole < 1 || whole > 2147483647.0)
          return fmt::format("'{}' = {:.6g} is not a whole number of tokens in [1, 2147483647]", s, total);
        s = fmt::format("{:.0f}", whole);
        return {};
      },
      "N|Nk|NK");
}

CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& s) -> std::string {
        if (!s.empty()) return {};
        return fmt::format("empty value (give {}, or omit the flag)", what);
      },
      "");
}

CLI::Validator utf8_text() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const size_t bad = utf8::first_invalid(s);
        if (bad == std::string_view::npos) return {};
        return fmt::format("not valid UTF-8 (first invalid byte 0x{:02X} at byte offset {})",
                           static_cast<unsigned char>(s[bad]), bad);
      },
      "");
}

uint64_t parse_size_flag(const std::string& flag, const std::string& value) {
  uint64_t v = 0;
  try {
    v = parse_size(value);
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("{}: {}", flag, e.what()));
  }
  if (v == 0) throw UsageError(fmt::format("{} must be > 0", flag));
  return v;
}

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
    // The one line a failed subcommand prints, and its exit code.
    auto fail = [](const char* prefix, const std::exception& e, int code) {
      std::fprintf(stderr, "%s%s\n", prefix, e.what());
      return code;
    };
    try {
      return action();
    } catch (const UsageError& e) {
      return fail("error: ", e, 2);
    } catch (const InputError& e) {
      return fail("error: ", e, 2);
    } catch (const std::invalid_argument& e) {
      return fail("error: ", e, 2);
    } catch (const std::bad_alloc&) {
      // What is allocated at this size is what the flags and the model ask
      // for (issue 15 items 5, 8): say which knobs set it.
      std::fprintf(stderr,
                   "error: out of memory: the run asked for more memory than the machine has. The KV cache is sized "
                   "by --kv-memory; without it the budget follows max_model_len (max_num_seqs requests of "
                   "max_model_len, at least one full request), and --block-size sets the page size. Give a smaller "
                   "--kv-memory, --max-model-len or --block-size\n");
      return 2;
    } catch (const RankFailure& e) {
      // The tensor-parallel watchdog: a peer process gone or silent past
      // --collective-timeout. One line; every rank exits 1 (docs/tp.md).
      return fail("fp8kv: ", e, 1);
    } catch (const std::exception& e) {
      return fail("internal error: ", e, 1);
    }
  }
  std::fprintf(stderr, "error: no subcommand given (see --help)\n");
  (void)app;
  return 2;
}

bool is_subcommand(CLI::App& app, const std::string& name) {
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->check_name(name)) return true;
  return false;
}

std::string subcommand_list(CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

CLI::App* bench_parent(CLI::App& app) {
  try {
    return app.get_subcommand("bench");
  } catch (const CLI::OptionNotFound&) {
    auto* b = app.add_subcommand("bench", "Benchmarks: latency, throughput, serve");
    b->require_subcommand(1);
    return b;
  }
}

}  // namespace fp8kv::cli
