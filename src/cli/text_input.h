// Text files named by an option (--text-file, --corpus, --haystack): read
// through io/user_files.h (directories and unreadable files refused), then
// checked to be UTF-8 here, so that the error names the option and the file
// (with several files, the tokenizer's own message could not say which one).
#pragma once
#include <fmt/format.h>

#include <string>
#include <string_view>

#include "io/errors.h"
#include "io/user_files.h"
#include "tokenizer/utf8.h"

namespace fp8kv::cli {

inline std::string read_text_option_file(const std::string& path, std::string_view option) {
  std::string s = read_option_file(path, option);
  const size_t bad = utf8::first_invalid(s);
  if (bad != std::string_view::npos)
    throw InputError(fmt::format("{} {}: not valid UTF-8 (first invalid byte 0x{:02X} at byte offset {})", option, path,
                                 static_cast<unsigned char>(s[bad]), bad));
  return s;
}

}  // namespace fp8kv::cli
