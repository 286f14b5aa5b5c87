#include "backend/common/profile.h"

#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

#include "backend/common/list_items.h"
#include "io/errors.h"

namespace fp8kv {

namespace {

std::mutex g_mu;
std::optional<ProfileConfig> g_config;

int positive(std::string_view spec, std::string_view item, std::string_view v) {
  int n = 0;
  for (char c : v) {
    if (c < '0' || c > '9' || n > 100'000'000) n = -1;
    if (n < 0) break;
    n = n * 10 + (c - '0');
  }
  if (v.empty() || n <= 0)
    throw InputError("FP8KV_PROFILE='" + std::string(spec) + "': '" + std::string(item) +
                     "' needs a positive whole number after '='");
  return n;
}

}  // namespace

ProfileConfig parse_profile_config(std::string_view spec) {
  ProfileConfig c;
  if (spec.empty() || spec == "0") return c;
  if (spec == "1" || spec == "all") {
    c.step = c.prefill = c.startup = true;
    return c;
  }
  for_each_list_item(spec, [&](std::string_view item) {
    const size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    const bool has_value = eq != std::string_view::npos;
    const std::string_view val = has_value ? item.substr(eq + 1) : std::string_view();
    if (key == "step") {
      c.step = true;
      if (has_value) c.step_op_step = positive(spec, item, val);
    } else if (key == "prefill") {
      c.prefill = true;
      if (has_value) c.prefill_min_rows = positive(spec, item, val);
    } else if (key == "startup" && !has_value) {
      c.startup = true;
    } else {
      throw InputError("FP8KV_PROFILE='" + std::string(spec) + "': unknown part '" + std::string(item) +
                       "' (1, all, or a comma list of step[=N], prefill[=ROWS], startup)");
    }
  });
  return c;
}

ProfileConfig profile_config() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_config) {
    const char* e = std::getenv("FP8KV_PROFILE");
    g_config = parse_profile_config(e ? e : "");
  }
  return *g_config;
}

void set_profile_config_for_testing(const ProfileConfig& c) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_config = c;
}

}  // namespace fp8kv
