#include "server/stop_matcher.h"

#include <algorithm>

namespace fp8kv::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

StopMatcher::Result StopMatcher::push(std::string_view delta) {
  Result r;
  if (stopped_) return r;
  pending_.append(delta);
  // Earliest match wins (ties: the longer string, as it was found first at that place).
  size_t best = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stops_) {
    const size_t p = pending_.find(s);
    if (p != std::string::npos && (p < best || (p == best && s.size() > which->size()))) {
      best = p;
      which = &s;
    }
  }
  if (which) {
    r.text = pending_.substr(0, best);
    r.stop = *which;
    pending_.clear();
    stopped_ = true;
    return r;
  }
  // Hold back the longest suffix of pending_ that is a proper prefix of a stop
  // string: emitted text never contains the start of a possible match.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  r.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

}  // namespace fp8kv::server
