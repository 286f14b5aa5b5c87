// The BPE model of tokenizer.json (`tokenizers::models::bpe`): vocab, merges
// (["a","b"] or "a b"), unk / fuse_unk, byte_fallback, ignore_merges,
// continuing_subword_prefix, end_of_word_suffix. Merging uses a rank-ordered
// priority queue over a linked list of symbols; results are cached per word.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pipeline.h"

namespace fp8kv::tok {

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using StrIdMap = std::unordered_map<std::string, int, SvHash, std::equal_to<>>;

// model.vocab and model.merges of a tokenizer.json, as the streaming loader
// (tokenizer.cpp) collects them: every string in one arena, no per-entry
// allocation. Entries are validated by BpeModel.
struct VocabData {
  std::string arena;
  struct Entry {
    uint32_t off, len;
    long long id;  // < 0: not a valid id (message names the key)
  };
  std::vector<Entry> vocab;
  struct Merge {
    uint32_t a_off, a_len, b_off, b_len;
  };
  std::vector<Merge> merges;
  bool has_vocab = false, has_merges = false;  // false: the field was absent (or not captured)
  std::string_view str(uint32_t off, uint32_t len) const { return std::string_view(arena).substr(off, len); }
  uint32_t add(std::string_view s) {
    auto off = static_cast<uint32_t>(arena.size());
    arena.append(s);
    return off;
  }
};

class BpeModel {
 public:
  // `m`: the model node without (or ignoring) vocab / merges, which come in `v`.
  BpeModel(const json& m, VocabData&& v, const std::string& ctx);
  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int>& out) const;
  size_t vocab_size() const { return n_tokens_; }
  // One past the largest model id.
  int end_id() const { return static_cast<int>(tok_off_.size()); }
  std::optional<int> token_to_id(std::string_view token) const;
  // nullopt for an id not in the vocab.
  std::optional<std::string_view> id_to_token(int id) const;

 private:
  void tokenize_chunk(std::string_view word, std::vector<int>& out) const;
  void merge_word(std::string_view w, std::vector<int>& out) const;
  int unk_id() const;

  struct MergeInfo {
    uint32_t rank;
    int new_id;
  };
  static uint64_t pair_key(int a, int b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

  int find_id(std::string_view token) const;  // -1 when absent
  const MergeInfo* find_merge(int a, int b) const;

  // Vocab: open addressing over entry indices; strings live in data_.arena.
  VocabData data_;
  std::vector<int32_t> slots_;  // index into data_.vocab, -1 empty
  size_t slot_mask_ = 0, n_tokens_ = 0;
  std::vector<uint32_t> tok_off_, tok_len_;  // by id; tok_len_ == UINT32_MAX: no token
  // Merges: open addressing on the (a, b) pair key.
  struct MergeSlot {
    uint64_t key;
    MergeInfo info;
  };
  std::vector<MergeSlot> merge_slots_;  // key == kNoKey: empty
  size_t merge_mask_ = 0;
  static constexpr uint64_t kNoKey = ~uint64_t{0};
  std::optional<std::string> unk_token_;
  std::string prefix_, suffix_;
  bool has_prefix_ = false, has_suffix_ = false;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  // SentencePiece-style models without a pre-tokenizer hand whole texts to
  // the model as one word. When no merge can build a token in which a
  // non-"▁" char is followed by "▁", no symbol ever spans such a boundary and
  // merging each "▁"-started chunk on its own gives the same ids (and lets
  // the per-word cache work).
  bool split_at_metaspace_ = false;
  int byte_ids_[256];  // <0xHH> ids for byte_fallback, -1 when absent

  static constexpr size_t kCacheCapacity = 10000;   // words, as `tokenizers`
  static constexpr size_t kCacheMaxWordBytes = 256;  // longer words are not cached, as `tokenizers`
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int>, SvHash, std::equal_to<>> cache_;
};

}  // namespace fp8kv::tok
