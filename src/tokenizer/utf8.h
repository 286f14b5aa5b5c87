// UTF-8 helpers with the exact semantics the tokenizer needs: validation,
// Rust's String::from_utf8_lossy (one U+FFFD per maximal invalid subpart) and
// the Unicode property predicates Rust's char / regex crate use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fp8kv::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length in bytes of the valid UTF-8 sequence starting at s[i], or 0 when the
// bytes there are not a complete valid sequence.
size_t valid_seq_len(std::string_view s, size_t i);
// Byte offset of the first invalid byte, or npos when s is valid UTF-8.
size_t first_invalid(std::string_view s);
inline bool is_valid(std::string_view s) { return first_invalid(s) == std::string_view::npos; }
// Rust String::from_utf8_lossy.
std::string lossy(std::string_view bytes);

// Decodes the code point at s[i] (s must be valid) and advances i.
char32_t next_cp(std::string_view s, size_t& i);
// Code point that ends at s[end] (exclusive); s valid.
char32_t prev_cp(std::string_view s, size_t end, size_t* start = nullptr);
void append_cp(std::string& out, char32_t cp);
inline size_t cp_len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// Rust char::is_whitespace (Unicode White_Space).
bool is_whitespace(char32_t c);
// Rust regex `\w` (Alphabetic, marks, decimal numbers, connector punctuation, joiners).
bool is_word_char(char32_t c);
// Rust char::is_numeric (Nd, Nl, No).
bool is_numeric(char32_t c);
// Rust char::is_alphanumeric.
bool is_alphanumeric(char32_t c);
// tokenizers' is_punc: ASCII punctuation or Unicode P*.
bool is_punctuation(char32_t c);

}  // namespace fp8kv::utf8
