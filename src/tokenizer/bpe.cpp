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

BpeModel::BpeModel(const json& m, const std::string& ctx) {
  const json& vocab = req(m, "vocab", ctx);
  if (!vocab.is_object()) throw InputError(fmt::format("{}: \"vocab\" must be an object {{token: id}}", ctx));
  int max_id = -1;
  vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const json& v = it.value();
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > (1LL << 26))
      throw InputError(fmt::format("{}: vocab entry {:?} has an invalid id (expected an integer in [0, 2^26])", ctx,
                                   it.key()));
    int id = v.get<int>();
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (auto& [tok, id] : vocab_) {
    id_to_token_[id] = tok;
    has_id_[id] = true;
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
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  bool crosses = false;
  static const json kNoMerges = json::array();
  const json& merges = m.contains("merges") ? m["merges"] : kNoMerges;
  if (!merges.is_array()) throw InputError(fmt::format("{}: \"merges\" must be an array", ctx));
  merges_.reserve(merges.size() * 2);
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw InputError(fmt::format("{}: merges[{}] = {:?} must be two tokens separated by one space", ctx, i, s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw InputError(fmt::format("{}: merges[{}] must be \"a b\" or [\"a\", \"b\"]", ctx, i));
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end()) throw InputError(fmt::format("{}: merges[{}]: token {:?} is not in the vocab", ctx, i, a));
    if (ib == vocab_.end()) throw InputError(fmt::format("{}: merges[{}]: token {:?} is not in the vocab", ctx, i, b));
    size_t cut = has_prefix_ ? prefix_.size() : 0;
    if (cut > b.size())
      throw InputError(fmt::format("{}: merges[{}]: token {:?} is shorter than the subword prefix", ctx, i, b));
    std::string merged = a + b.substr(cut);
    auto in = vocab_.find(merged);
    if (in == vocab_.end())
      throw InputError(fmt::format("{}: merges[{}]: merged token {:?} is not in the vocab", ctx, i, merged));
    // A repeated pair keeps its last rank, as a HashMap insert does in `tokenizers`.
    merges_[pair_key(ia->second, ib->second)] = MergeInfo{static_cast<uint32_t>(i), in->second};
    if (spans_metaspace(merged)) crosses = true;
  }
  split_at_metaspace_ = !crosses && vocab_.count(kMeta) && !has_prefix_ && !has_suffix_ && !ignore_merges_;
}

std::optional<int> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

int BpeModel::unk_id() const {
  auto it = vocab_.find(*unk_token_);
  if (it == vocab_.end())
    throw InputError(fmt::format("tokenizer.json: model.unk_token {:?} is not in the vocab", *unk_token_));
  return it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
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
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      if (unk >= 0) {
        add(unk);
        unk = -1;
      }
      add(it->second);
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
  auto find = [&](int a, int b) -> const MergeInfo* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
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
