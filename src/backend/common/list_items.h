// Comma-separated settings strings (FP8KV_PROFILE, the GEMV route table):
// their items one by one.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace fp8kv {

// f(item) for each non-empty item of the comma-separated `spec`, in order.
template <class F>
void for_each_list_item(std::string_view spec, F&& f) {
  size_t i = 0;
  while (i <= spec.size()) {
    const size_t j = std::min(spec.find(',', i), spec.size());
    const std::string_view item = spec.substr(i, j - i);
    i = j + 1;
    if (!item.empty()) f(item);
  }
}

}  // namespace fp8kv
