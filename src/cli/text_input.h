// Text files named by an option (--text-file, --corpus, --haystack), and JSON
// files (--token-ids-file, --corpus-ids-file, --report): read
// through io/user_files.h (directories and unreadable files refused), then
// checked to be UTF-8 here, so that the error names the option and the file
// (with several files, the tokenizer's own message could not say which one).
#pragma once
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "io/errors.h"
#include "io/user_files.h"
#include "tokenizer/utf8.h"

namespace fp8kv::cli {

inline void check_utf8_option_text(const std::string& s, const std::string& path, std::string_view option) {
  const size_t bad = utf8::first_invalid(s);
  if (bad != std::string_view::npos)
    throw InputError(fmt::format("{} {}: not valid UTF-8 (first invalid byte 0x{:02X} at byte offset {})", option, path,
                                 static_cast<unsigned char>(s[bad]), bad));
}

inline std::string read_text_option_file(const std::string& path, std::string_view option) {
  std::string s = read_option_file(path, option);
  check_utf8_option_text(s, path, option);
  return s;
}

// A JSON file named by an option (--token-ids-file, --corpus-ids-file,
// --report): read_option_json (nesting bounded), then UTF-8 (JSON text is
// UTF-8, RFC 8259), then parsed; every error names the option and the path:
// "--report r.json: invalid JSON: ...".
inline nlohmann::json parse_json_option_file(const std::string& path, std::string_view option) {
  const std::string s = read_option_json(path, option);
  check_utf8_option_text(s, path, option);
  try {
    return nlohmann::json::parse(s);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{} {}: invalid JSON: {}", option, path, e.what()));
  }
}

}  // namespace fp8kv::cli
