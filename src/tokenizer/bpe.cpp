#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <queue>

#include "io/errors.h"
#include "tokenizer/utf8.h"

namespace fp8kv::tok {

namespace {
constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581 ▁

// True when s holds a char other than ▁ directly followed by ▁.
bool spans_metaspace(std::string_view s) {
  for (size_t p = s.find(kMeta, 1); p != std::string_view::npos; p = s.find(kMeta, p + 1))
    if (p >= 3 ? s.substr(p - 3, 3) != kMeta : true) return true;
  return false;
}

std::optional<std::string> opt_str(const json& j, const char* key, const std::string& ctx) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw InputError(fmt::format("{}: field \"{}\" must be a string or null", ctx, key));
  return it->get<std::string>();
}
}  // namespace

namespace {
size_t pow2_at_least(size_t n) {
  size_t p = 16;
  while (p < n) p <<= 1;
  return p;
}
uint64_t mix(uint64_t k) {  // splitmix64 finalizer
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ULL;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebULL;
  k ^= k >> 31;
  return k;
}
}  // namespace

int BpeModel::find_id(std::string_view token) const {
  if (slots_.empty()) return -1;
  size_t h = std::hash<std::string_view>{}(token) & slot_mask_;
  while (true) {
    int32_t e = slots_[h];
    if (e < 0) return -1;
    const auto& en = data_.vocab[static_cast<size_t>(e)];
    if (en.len == token.size() && data_.str(en.off, en.len) == token) return static_cast<int>(en.id);
    h = (h + 1) & slot_mask_;
  }
}

const BpeModel::MergeInfo* BpeModel::find_merge(int a, int b) const {
  if (merge_slots_.empty()) return nullptr;
  uint64_t key = pair_key(a, b);
  size_t h = mix(key) & merge_mask_;
  while (true) {
    const MergeSlot& s = merge_slots_[h];
    if (s.key == kNoKey) return nullptr;
    if (s.key == key) return &s.info;
    h = (h + 1) & merge_mask_;
  }
}

BpeModel::BpeModel(const json& m, VocabData&& v, const std::string& ctx) : data_(std::move(v)) {
  if (!data_.has_vocab) {
    auto it = m.find("vocab");
    if (it == m.end()) throw InputError(fmt::format("{}: missing field \"vocab\"", ctx));
    throw InputError(fmt::format("{}: \"vocab\" must be an object {{token: id}}", ctx));
  }
  // Vocab table; a repeated key keeps its last id, as a JSON object does.
  slots_.assign(pow2_at_least(data_.vocab.size() * 2 + 1), -1);
  slot_mask_ = slots_.size() - 1;
  int max_id = -1;
  for (size_t i = 0; i < data_.vocab.size(); ++i) {
    const auto& en = data_.vocab[i];
    std::string_view key = data_.str(en.off, en.len);
    if (en.id < 0 || en.id > (1LL << 26))
      throw InputError(fmt::format("{}: vocab entry {:?} has an invalid id (expected an integer in [0, 2^26])", ctx,
                                   std::string(key)));
    size_t h = std::hash<std::string_view>{}(key) & slot_mask_;
    while (true) {
      int32_t e = slots_[h];
      if (e < 0) {
        slots_[h] = static_cast<int32_t>(i);
        ++n_tokens_;
        break;
      }
      const auto& other = data_.vocab[static_cast<size_t>(e)];
      if (other.len == en.len && data_.str(other.off, other.len) == key) {
        slots_[h] = static_cast<int32_t>(i);
        break;
      }
      h = (h + 1) & slot_mask_;
    }
    max_id = std::max(max_id, static_cast<int>(en.id));
  }
  tok_off_.assign(static_cast<size_t>(max_id + 1), 0);
  tok_len_.assign(static_cast<size_t>(max_id + 1), UINT32_MAX);
  for (int32_t e : slots_) {
    if (e < 0) continue;
    const auto& en = data_.vocab[static_cast<size_t>(e)];
    tok_off_[static_cast<size_t>(en.id)] = en.off;
    tok_len_[static_cast<size_t>(en.id)] = en.len;
  }
  if (static_cast<size_t>(max_id + 1) > 0 && n_tokens_ < data_.vocab.size()) {
    // Ids only reachable through an overwritten key have no token.
    max_id = -1;
    for (size_t id = 0; id < tok_len_.size(); ++id)
      if (tok_len_[id] != UINT32_MAX) max_id = static_cast<int>(id);
    tok_off_.resize(static_cast<size_t>(max_id + 1));
    tok_len_.resize(static_cast<size_t>(max_id + 1));
  }

  unk_token_ = opt_str(m, "unk_token", ctx);
  if (auto p = opt_str(m, "continuing_subword_prefix", ctx)) {
    prefix_ = *p;
    has_prefix_ = true;
  }
  if (auto s = opt_str(m, "end_of_word_suffix", ctx)) {
    suffix_ = *s;
    has_suffix_ = true;
  }
  fuse_unk_ = opt_bool(m, "fuse_unk", false, ctx);
  byte_fallback_ = opt_bool(m, "byte_fallback", false, ctx);
  ignore_merges_ = opt_bool(m, "ignore_merges", false, ctx);
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() != 0.0)
    throw InputError(fmt::format("{}: BPE dropout is not supported (encoding would be random)", ctx));
  for (int b = 0; b < 256; ++b) byte_ids_[b] = find_id(fmt::format("<0x{:02X}>", b));

  bool crosses = false;
  merge_slots_.assign(pow2_at_least(data_.merges.size() * 2 + 1), MergeSlot{kNoKey, {0, 0}});
  merge_mask_ = merge_slots_.size() - 1;
  std::string merged;
  size_t cut = has_prefix_ ? prefix_.size() : 0;
  for (size_t i = 0; i < data_.merges.size(); ++i) {
    const auto& mg = data_.merges[i];
    std::string_view a = data_.str(mg.a_off, mg.a_len), b = data_.str(mg.b_off, mg.b_len);
    int ia = find_id(a), ib = find_id(b);
    if (ia < 0) throw InputError(fmt::format("{}: merges[{}]: token {:?} is not in the vocab", ctx, i, std::string(a)));
    if (ib < 0) throw InputError(fmt::format("{}: merges[{}]: token {:?} is not in the vocab", ctx, i, std::string(b)));
    if (cut > b.size())
      throw InputError(
          fmt::format("{}: merges[{}]: token {:?} is shorter than the subword prefix", ctx, i, std::string(b)));
    merged.assign(a);
    merged.append(b.substr(cut));
    int in = find_id(merged);
    if (in < 0) throw InputError(fmt::format("{}: merges[{}]: merged token {:?} is not in the vocab", ctx, i, merged));
    // A repeated pair keeps its last rank, as a HashMap insert does in `tokenizers`.
    uint64_t key = pair_key(ia, ib);
    size_t h = mix(key) & merge_mask_;
    while (merge_slots_[h].key != kNoKey && merge_slots_[h].key != key) h = (h + 1) & merge_mask_;
    merge_slots_[h] = MergeSlot{key, MergeInfo{static_cast<uint32_t>(i), in}};
    if (!crosses && spans_metaspace(merged)) crosses = true;
  }
  split_at_metaspace_ = !crosses && find_id(kMeta) >= 0 && !has_prefix_ && !has_suffix_ && !ignore_merges_;
  data_.merges.clear();
  data_.merges.shrink_to_fit();
}

std::optional<int> BpeModel::token_to_id(std::string_view token) const {
  int id = find_id(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::optional<std::string_view> BpeModel::id_to_token(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= tok_len_.size() || tok_len_[id] == UINT32_MAX) return std::nullopt;
  return data_.str(tok_off_[id], tok_len_[id]);
}

int BpeModel::unk_id() const {
  int id = find_id(*unk_token_);
  if (id < 0) throw InputError(fmt::format("tokenizer.json: model.unk_token {:?} is not in the vocab", *unk_token_));
  return id;
}

void BpeModel::tokenize(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    int id = find_id(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (split_at_metaspace_) {
    size_t start = 0;
    for (size_t p = word.find(kMeta, 1); p != std::string_view::npos; p = word.find(kMeta, p + 1)) {
      if (p >= 3 && word.substr(p - 3, 3) == kMeta) continue;
      tokenize_chunk(word.substr(start, p - start), out);
      start = p;
    }
    tokenize_chunk(word.substr(start), out);
    return;
  }
  tokenize_chunk(word, out);
}

void BpeModel::tokenize_chunk(std::string_view word, std::vector<int>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() >= kCacheMaxWordBytes) return;
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
}

void BpeModel::merge_word(std::string_view w, std::vector<int>& out) const {
  struct Symbol {
    int c;
    int prev;
    int next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(w.size());
  auto add = [&](int c) {
    int n = static_cast<int>(sym.size());
    if (!sym.empty()) sym.back().next = n;
    sym.push_back(Symbol{c, n - 1, -1, true});
  };
  int unk = -1;  // pending unk id (fuse_unk fuses runs of unknown chars)
  std::string buf;
  size_t i = 0;
  while (i < w.size()) {
    size_t b = i;
    size_t n = utf8::cp_len(static_cast<unsigned char>(w[i]));
    i = std::min(w.size(), i + n);
    bool is_first = b == 0, is_last = i >= w.size();
    std::string_view piece = w.substr(b, i - b);
    if ((!is_first && has_prefix_) || (is_last && has_suffix_)) {
      buf.clear();
      if (!is_first && has_prefix_) buf += prefix_;
      buf += piece;
      if (is_last && has_suffix_) buf += suffix_;
      piece = buf;
    }
    if (int id = find_id(piece); id >= 0) {
      if (unk >= 0) {
        add(unk);
        unk = -1;
      }
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : piece) all = all && byte_ids_[c] >= 0;
      if (all) {
        // As in `tokenizers`, a pending unk is not flushed before byte tokens.
        for (unsigned char c : piece) add(byte_ids_[c]);
        continue;
      }
    }
    if (unk_token_) {
      if (unk >= 0 && fuse_unk_) continue;
      if (unk >= 0) add(unk);
      unk = unk_id();
    }
  }
  if (unk >= 0) add(unk);

  struct Merge {
    uint32_t rank;
    int pos;
    int new_id;
    bool operator<(const Merge& o) const {  // max-heap: lowest rank, then lowest pos first
      if (rank != o.rank) return rank > o.rank;
      return pos > o.pos;
    }
  };
  std::priority_queue<Merge> q;
  auto find = [&](int a, int b) -> const MergeInfo* { return find_merge(a, b); };
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (auto* mi = find(sym[k].c, sym[k + 1].c)) q.push(Merge{mi->rank, static_cast<int>(k), mi->new_id});
  while (!q.empty()) {
    Merge top = q.top();
    q.pop();
    Symbol& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    Symbol& right = sym[cur.next];
    auto* mi = find(cur.c, right.c);
    if (!mi || mi->new_id != top.new_id) continue;  // stale entry
    cur.c = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) sym[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (auto* pm = find(sym[cur.prev].c, cur.c)) q.push(Merge{pm->rank, cur.prev, pm->new_id});
    if (cur.next >= 0)
      if (auto* nm = find(cur.c, sym[cur.next].c)) q.push(Merge{nm->rank, top.pos, nm->new_id});
  }
  for (auto& s : sym)
    if (s.alive) out.push_back(s.c);
}

}  // namespace fp8kv::tok
