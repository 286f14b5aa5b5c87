// Stop strings over a stream of text deltas: a stop string may span token
// boundaries, is never emitted, and text that could still become the start of
// a stop string is held back until it cannot (so a streamed client never sees
// part of a stop string).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace fp8kv::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are not allowed (checked by the caller)

  struct Result {
    std::string text;                  // safe to emit now
    std::optional<std::string> stop;   // set when a stop string matched (text ends right before it)
  };
  // Feeds newly decoded text. After a match, further pushes return nothing.
  Result push(std::string_view delta);
  // End of generation without a match: the held-back text.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace fp8kv::server
