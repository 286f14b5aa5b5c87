// Internal pipeline stages of a tokenizer.json, each built from its JSON node
// and mirroring the `tokenizers` component of the same name.
#pragma once
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/errors.h"
#include "tokenizer/regex.h"

namespace fp8kv::tok {

using json = nlohmann::json;

// A piece of text on its way to the model. at_start: the piece begins at
// original offset 0 (what Metaspace's prepend_scheme "first" looks at).
struct Piece {
  std::string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits / rewrites pieces; empty pieces are dropped by the caller.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Applied only when special tokens are requested.
  virtual void process(std::vector<int>& ids) const = 0;
  virtual size_t added_tokens() const = 0;
  // Ids placed before the text (e.g. BOS).
  virtual std::vector<int> prefix() const { return {}; }
  // Every id it may insert (checked against the vocabulary at load).
  virtual std::vector<int> inserted_ids() const { return {}; }
};

// Each returns nullptr for a JSON null. `ctx` names the node in errors
// (e.g. "tokenizer.json: normalizer"). Unknown types throw InputError.
std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& ctx);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& ctx);
std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& ctx);
std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& ctx);

// SplitDelimiterBehavior of `tokenizers`.
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
SplitBehavior parse_behavior(const std::string& name, const std::string& ctx);
// Pieces of `s` given the match list (covering s, each flagged match / not).
std::vector<Span> apply_behavior(const std::vector<std::pair<Span, bool>>& matches, SplitBehavior b);
// Matches of a regex turned into the covering list `tokenizers` builds.
std::vector<std::pair<Span, bool>> covering_matches(std::string_view s, const std::vector<Span>& found);

// GPT-2 bytes_to_unicode: byte -> UTF-8 of its printable stand-in, and back.
const std::string& byte_to_unicode(unsigned char b);
// -1 when c is not one of the 256 stand-ins.
int unicode_to_byte(char32_t c);

// {"String": s} or {"Regex": r} under j["pattern"] (Replace, Split).
std::unique_ptr<Regex> make_pattern(const json& j, const std::string& ctx);

// JSON access with errors that name the field.
const json& req(const json& j, const char* key, const std::string& ctx);
std::string req_str(const json& j, const char* key, const std::string& ctx);
bool opt_bool(const json& j, const char* key, bool dflt, const std::string& ctx);
// A string field holding exactly one character (Metaspace's replacement,
// Strip's content, CharDelimiterSplit's delimiter).
char32_t req_char(const json& j, const char* key, const std::string& ctx);

// The stages of a `Sequence` node: j[key] must be an array; each element is
// made by `make` (ctx "CTX.KEY[i]"), and null elements are skipped.
template <class Stage>
std::vector<std::unique_ptr<Stage>> make_sequence(const json& j, const char* key, const std::string& ctx,
                                                  std::unique_ptr<Stage> (*make)(const json&, const std::string&)) {
  const json& arr = req(j, key, ctx);
  if (!arr.is_array()) throw InputError(fmt::format("{}: \"{}\" must be an array", ctx, key));
  std::vector<std::unique_ptr<Stage>> v;
  for (size_t i = 0; i < arr.size(); ++i) {
    auto s = make(arr[i], fmt::format("{}.{}[{}]", ctx, key, i));
    if (s) v.push_back(std::move(s));
  }
  return v;
}

// Replace (normalizer and decoder): every match of `re` in s replaced by
// `content`; `found` is scratch.
void replace_matches(const Regex& re, const std::string& content, std::string& s, std::vector<Span>& found);

}  // namespace fp8kv::tok
