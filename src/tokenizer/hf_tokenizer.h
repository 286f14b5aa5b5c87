// The tokenizer.json implementation behind fp8kv::Tokenizer (internal).
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::tok {

struct AddedToken {
  std::string content;
  std::string decode_form;  // what decode() feeds the decoder (normalized content when normalized)
  int id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Leftmost-longest multi-pattern matcher over bytes (what `tokenizers` gets
// from aho-corasick with MatchKind::LeftmostLongest).
class TokenMatcher {
 public:
  void add(const std::string& pattern, int value);  // first added wins on equal patterns
  bool empty() const { return nodes_.size() <= 1; }
  // Longest pattern starting at s[i]: (length, value) or (0, -1).
  std::pair<size_t, int> longest_at(std::string_view s, size_t i) const;
  bool may_start(unsigned char c) const { return first_[c]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int value = -1;
  };
  std::vector<Node> nodes_{Node{}};
  bool first_[256] = {};
};

struct Segment {
  size_t begin, end;
  int token;  // added token index or -1
};

// What a model directory's tokenizer_config.json changes (transformers 5
// AutoTokenizer; see src/tokenizer/README.md, "Model directories").
struct DirConfig {
  bool split_special_tokens = false;
  // Contents named by the special-token attributes (bos_token, ..., the
  // class defaults): special for skip_special_tokens.
  std::vector<std::string> special_contents;
  // LlamaTokenizer[Fast] over a SentencePiece-style (Metaspace) vocab: the
  // class rebuilds normalizer / pre-tokenizer / decoder.
  bool llama_rebuild = false;
  bool add_prefix_space = true, legacy = false;
};

// tokenizer.json, parsed once: everything but model.vocab / model.merges as
// JSON, and the BPE model built from those (streamed, no DOM). Several
// tokenizers (file and directory semantics) can share one.
struct ParsedTokenizerJson {
  json rest;
  std::shared_ptr<const BpeModel> model;
  std::string source;
};
ParsedTokenizerJson parse_tokenizer_json(const std::filesystem::path& p);
// Reads tokenizer_config.json (the class name, legacy, add_prefix_space,
// special tokens, split_special_tokens) against the parsed tokenizer.json.
DirConfig read_dir_config(const json& cfg, const ParsedTokenizerJson& t, const std::string& cfg_source);
std::unique_ptr<Tokenizer> make_tokenizer(const ParsedTokenizerJson& t, const DirConfig* dir = nullptr);

class HfTokenizer final : public Tokenizer {
 public:
  // `source` names the file in error messages.
  HfTokenizer(const json& j, std::shared_ptr<const BpeModel> model, const std::string& source,
              const DirConfig* dir = nullptr);

  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const override;
  std::string decode(std::span<const int> ids, bool skip_special_tokens = false) const override;
  int vocab_size() const override;
  std::optional<int> token_to_id(std::string_view token) const override;
  bool is_special(int id) const override;
  std::optional<std::string> id_to_token(int id) const override;
  std::optional<int> bos_id() const override;

  // transformers' split_special_tokens: special tokens in text are not matched.
  void set_split_special_tokens(bool v) { split_special_ = v; }

 private:
  void build_added(const json& arr, const std::string& ctx);
  std::vector<Segment> find_matches(std::string_view s, const TokenMatcher& m) const;
  void encode_segment(std::string_view raw, bool at_start, std::vector<int>& ids) const;

  std::string source_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_;
  std::shared_ptr<const BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<PostProcessor> post_;
  std::optional<int> bos_id_;

  std::vector<AddedToken> added_;  // specials first, then the others (pattern order)
  StrIdMap added_ids_;             // content -> id
  std::unordered_map<int, size_t> added_by_id_;
  std::unordered_set<std::string> special_contents_;
  TokenMatcher raw_matcher_, norm_matcher_;
  bool split_special_ = false;

  // tokenizer.json "truncation" / "padding" (single sequence).
  std::optional<size_t> trunc_max_;
  bool trunc_left_ = false;
  std::optional<size_t> pad_fixed_;
  bool pad_batch_longest_ = false, pad_left_ = false;
  size_t pad_multiple_ = 0;
  int pad_id_ = 0;
};

}  // namespace fp8kv::tok
