// Hugging Face tokenizer.json (byte-level BPE and SentencePiece-style BPE),
// bit-exact with HF `tokenizers` encode/decode.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp8kv {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // A bare tokenizer.json: `tokenizers` semantics.
  static std::unique_ptr<Tokenizer> from_file(const std::filesystem::path& tokenizer_json);
  // A model directory: tokenizer.json plus tokenizer_config.json honored as
  // transformers' AutoTokenizer does (e.g. add_bos_token).
  static std::unique_ptr<Tokenizer> from_dir(const std::filesystem::path& dir);
  // Either of the above, by what the path is.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& dir_or_file);

  // Throws InputError on invalid UTF-8 input.
  virtual std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  // Invalid UTF-8 in the decoded bytes becomes U+FFFD.
  virtual std::string decode(std::span<const int> ids, bool skip_special_tokens = false) const = 0;
  // One past the largest id of the model vocab and the added tokens: every id
  // encode() returns is < vocab_size().
  virtual int vocab_size() const = 0;
  virtual std::optional<int> token_to_id(std::string_view token) const = 0;
  virtual bool is_special(int id) const = 0;
  // The token's string (added tokens first, then the model vocab), as
  // `tokenizers`' id_to_token; nullopt for an unknown id.
  virtual std::optional<std::string> id_to_token(int id) const = 0;
  // The id of the post-processor's first special token when it adds one
  // before the text (the BOS a model expects), nullopt when none is added.
  virtual std::optional<int> bos_id() const = 0;
};

// Streaming detokenizer: push ids one at a time; returns only text that is
// complete (never a broken UTF-8 sequence); flush() returns the rest.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok, bool skip_special_tokens = false);
  std::string push(int id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string step(bool final);

  std::vector<int> ids_;
  size_t prefix_offset_ = 0;  // start of the decode window (ids before it are dropped)
  size_t read_offset_ = 0;    // ids whose text has been emitted
};

}  // namespace fp8kv
