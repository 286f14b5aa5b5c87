// tokenizer.json loading and the encode / decode pipeline, mirroring
// `tokenizers`' Tokenizer::encode (added tokens split out first, then the
// normalizer, normalized added tokens, pre-tokenizer, model, post-processor).
#include "tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "io/errors.h"
#include "io/fs_util.h"
#include "io/json_limits.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

namespace fp8kv {
namespace tok {

// ---- TokenMatcher -----------------------------------------------------------

void TokenMatcher::add(const std::string& pattern, int value) {
  if (pattern.empty()) return;
  int n = 0;
  for (unsigned char c : pattern) {
    int child = -1;
    for (auto& [k, v] : nodes_[n].next)
      if (k == c) child = v;
    if (child < 0) {
      child = static_cast<int>(nodes_.size());
      nodes_[n].next.emplace_back(c, child);
      nodes_.emplace_back();
    }
    n = child;
  }
  if (nodes_[n].value < 0) nodes_[n].value = value;
  first_[static_cast<unsigned char>(pattern[0])] = true;
}

std::pair<size_t, int> TokenMatcher::longest_at(std::string_view s, size_t i) const {
  std::pair<size_t, int> best{0, -1};
  int n = 0;
  for (size_t k = i; k < s.size(); ++k) {
    int child = -1;
    for (auto& [c, v] : nodes_[n].next)
      if (c == static_cast<unsigned char>(s[k])) child = v;
    if (child < 0) break;
    n = child;
    if (nodes_[n].value >= 0) best = {k + 1 - i, nodes_[n].value};
  }
  return best;
}

// ---- loading ---------------------------------------------------------------

HfTokenizer::HfTokenizer(const json& j, std::shared_ptr<const BpeModel> model, const std::string& source,
                         const DirConfig* dir)
    : source_(source), model_(std::move(model)) {
  auto get = [&](const char* key) -> const json& {
    static const json null_json;
    auto it = j.find(key);
    return it == j.end() ? null_json : *it;
  };
  if (dir && dir->llama_rebuild) {
    // transformers 5 LlamaTokenizer.__init__: no normalizer, Metaspace with
    // prepend_scheme from add_prefix_space / legacy and split=false, and the
    // SentencePiece decoder (Strip of one leading space only with a prefix space).
    const char* scheme = !dir->add_prefix_space ? "never" : dir->legacy ? "always" : "first";
    json pre = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}, {"split", false}};
    json decs = json::array({json{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                             json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}}});
    if (dir->add_prefix_space) decs.push_back(json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    pre_ = make_pre_tokenizer(pre, source + ": LlamaTokenizer pre_tokenizer");
    decoder_ = make_decoder(json{{"type", "Sequence"}, {"decoders", decs}}, source + ": LlamaTokenizer decoder");
  } else {
    normalizer_ = make_normalizer(get("normalizer"), source + ": normalizer");
    pre_ = make_pre_tokenizer(get("pre_tokenizer"), source + ": pre_tokenizer");
    decoder_ = make_decoder(get("decoder"), source + ": decoder");
  }
  post_ = make_post_processor(get("post_processor"), source + ": post_processor");
  if (post_) {
    auto p = post_->prefix();
    if (!p.empty()) bos_id_ = p.front();
  }
  const json& added = get("added_tokens");
  if (!added.is_null()) build_added(added, source + ": added_tokens");
  if (dir) {
    split_special_ = dir->split_special_tokens;
    for (const std::string& c : dir->special_contents) {
      if (!added_ids_.count(c)) continue;  // only tokens the added vocabulary holds
      special_contents_.insert(c);
      for (auto& t : added_)
        if (t.content == c) t.special = true;
    }
  }

  // A post-processor id past the vocabulary would reach the model's
  // embedding as an out-of-range row (found by fuzz_tokenizer:
  // a TemplateProcessing BOS of 269 while the added token landed on 246).
  if (post_) {
    const int vs = vocab_size();
    for (int id : post_->inserted_ids())
      if (id >= vs)
        throw InputError(fmt::format("{}: post_processor: special token id {} is not in the vocabulary (size {})",
                                     source, id, vs));
  }

  const json& trunc = get("truncation");
  if (!trunc.is_null()) {
    std::string c = source + ": truncation";
    const json& ml = req(trunc, "max_length", c);
    if (!ml.is_number_unsigned()) throw InputError(fmt::format("{}: \"max_length\" must be a non-negative integer", c));
    trunc_max_ = ml.get<size_t>();
    if (trunc.contains("direction") && trunc["direction"] == "Left") trunc_left_ = true;
  }
  const json& pad = get("padding");
  if (!pad.is_null()) {
    std::string c = source + ": padding";
    const json& strat = req(pad, "strategy", c);
    if (strat.is_object() && strat.contains("Fixed") && strat["Fixed"].is_number_unsigned())
      pad_fixed_ = strat["Fixed"].get<size_t>();
    else if (strat == "BatchLongest")
      pad_batch_longest_ = true;
    else
      throw InputError(fmt::format("{}: \"strategy\" must be \"BatchLongest\" or {{\"Fixed\": N}}", c));
    pad_left_ = pad.contains("direction") && pad["direction"] == "Left";
    if (pad.contains("pad_to_multiple_of") && pad["pad_to_multiple_of"].is_number_unsigned())
      pad_multiple_ = pad["pad_to_multiple_of"].get<size_t>();
    if (pad.contains("pad_id") && pad["pad_id"].is_number_unsigned()) pad_id_ = pad["pad_id"].get<int>();
  }
}

void HfTokenizer::build_added(const json& arr, const std::string& ctx) {
  if (!arr.is_array()) throw InputError(fmt::format("{}: must be an array", ctx));
  std::vector<AddedToken> in_order;
  for (size_t i = 0; i < arr.size(); ++i) {
    std::string c = fmt::format("{}[{}]", ctx, i);
    const json& e = arr[i];
    AddedToken t;
    t.content = req_str(e, "content", c);
    t.special = opt_bool(e, "special", false, c);
    t.single_word = opt_bool(e, "single_word", false, c);
    t.lstrip = opt_bool(e, "lstrip", false, c);
    t.rstrip = opt_bool(e, "rstrip", false, c);
    t.normalized = opt_bool(e, "normalized", !t.special, c);
    const json& id = req(e, "id", c);
    if (!id.is_number_unsigned() || id.get<unsigned long long>() > (1ULL << 26))
      throw InputError(fmt::format("{}: \"id\" must be an integer in [0, 67108864 (2^26)], got {}", c, id.dump()));
    t.id = id.get<int>();
    if (t.content.empty()) continue;  // `tokenizers` ignores empty added tokens
    in_order.push_back(std::move(t));
  }
  // Ids as AddedVocabulary::add_tokens assigns them: the existing id of the
  // content (added or model vocab), else the next free id past the vocab.
  int model_size = static_cast<int>(model_->vocab_size());
  int max_added = -1;  // largest id given to an added token so far
  for (auto& t : in_order) {
    int want = t.id;
    int id;
    if (auto it = added_ids_.find(t.content); it != added_ids_.end()) {
      id = it->second;
    } else if (auto m = model_->token_to_id(t.content)) {
      id = *m;
    } else {
      int mx = max_added;
      id = mx < 0 ? model_size : ((mx >= model_size || model_size == 0) ? mx + 1 : model_size);
    }
    if (id != want)
      std::fprintf(stderr, "warning: %s: token \"%s\" was expected to have id %d but was given id %d\n", ctx.c_str(),
                   t.content.c_str(), want, id);
    t.id = id;
    max_added = std::max(max_added, id);
    added_ids_[t.content] = id;
    if (t.special) special_contents_.insert(t.content);
  }
  for (int pass = 0; pass < 2; ++pass)
    for (auto& t : in_order)
      if (t.special == (pass == 0)) added_.push_back(t);
  for (size_t k = 0; k < added_.size(); ++k) {
    added_by_id_[added_[k].id] = k;  // the last definition of an id wins
    added_[k].decode_form = added_[k].content;
    if (!added_[k].normalized) {
      raw_matcher_.add(added_[k].content, static_cast<int>(k));
    } else {
      std::string n = added_[k].content;
      if (normalizer_) normalizer_->normalize(n);
      norm_matcher_.add(n, static_cast<int>(k));
      // `tokenizers` decodes a normalized added token from its normalized form.
      added_[k].decode_form = n;
    }
  }
}

// ---- encode ----------------------------------------------------------------

namespace {
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  return utf8::is_word_char(utf8::prev_cp(s, s.size()));
}
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return utf8::is_word_char(utf8::next_cp(s, i));
}
// Start of the trailing whitespace run of s.
size_t space_leftmost_at_end(std::string_view s) {
  size_t e = s.size();
  while (e > 0) {
    size_t st = 0;
    if (!utf8::is_whitespace(utf8::prev_cp(s, e, &st))) break;
    e = st;
  }
  return e;
}
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t n = i;
    if (!utf8::is_whitespace(utf8::next_cp(s, n))) break;
    i = n;
  }
  return i;
}
}  // namespace

std::vector<Segment> HfTokenizer::find_matches(std::string_view s, const TokenMatcher& m) const {
  std::vector<Segment> out;
  if (s.empty()) return out;
  size_t start_offset = 0;
  size_t i = 0;
  if (!m.empty()) {
    while (i < s.size()) {
      if (!m.may_start(static_cast<unsigned char>(s[i]))) {
        ++i;
        continue;
      }
      auto [len, k] = m.longest_at(s, i);
      if (len == 0) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + len;
      i = stop;  // matches never overlap, whether kept or discarded
      const AddedToken& t = added_[k];
      if (split_special_ && t.special) continue;
      if (t.single_word) {
        bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
        bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) start = std::max(space_leftmost_at_end(s.substr(0, start)), start_offset);
      if (t.rstrip) stop += space_rightmost_at_start(s.substr(stop));
      if (start_offset < start) out.push_back(Segment{start_offset, start, -1});
      out.push_back(Segment{start, stop, static_cast<int>(k)});
      start_offset = stop;
    }
  }
  if (start_offset < s.size()) out.push_back(Segment{start_offset, s.size(), -1});
  return out;
}

void HfTokenizer::encode_segment(std::string_view raw, bool at_start, std::vector<int>& ids) const {
  std::string norm(raw);
  if (normalizer_) normalizer_->normalize(norm);
  std::vector<Piece> pieces;
  for (const Segment& sg : find_matches(norm, norm_matcher_)) {
    if (sg.token >= 0) {
      ids.push_back(added_[sg.token].id);
      continue;
    }
    if (sg.end == sg.begin) continue;
    pieces.clear();
    pieces.push_back(Piece{norm.substr(sg.begin, sg.end - sg.begin), at_start && sg.begin == 0});
    if (pre_) pre_->pre_tokenize(pieces);
    for (const Piece& p : pieces)
      if (!p.text.empty()) model_->tokenize(p.text, ids);
  }
}

std::vector<int> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  size_t bad = utf8::first_invalid(text);
  if (bad != std::string_view::npos)
    throw InputError(fmt::format("input text is not valid UTF-8 (first invalid byte 0x{:02X} at offset {})",
                                 static_cast<unsigned char>(text[bad]), bad));
  std::vector<int> ids;
  for (const Segment& sg : find_matches(text, raw_matcher_)) {
    if (sg.token >= 0)
      ids.push_back(added_[sg.token].id);
    else
      encode_segment(text.substr(sg.begin, sg.end - sg.begin), sg.begin == 0, ids);
  }
  if (trunc_max_) {
    size_t added = add_special_tokens && post_ ? post_->added_tokens() : 0;
    size_t keep = *trunc_max_ > added ? *trunc_max_ - added : 0;
    if (ids.size() > keep) {
      if (trunc_left_)
        ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(keep));
      else
        ids.resize(keep);
    }
  }
  if (add_special_tokens && post_) post_->process(ids);
  if (pad_fixed_ || pad_batch_longest_) {
    size_t target = pad_fixed_ ? std::max(*pad_fixed_, ids.size()) : ids.size();
    if (pad_multiple_ > 0 && target % pad_multiple_ != 0) target += pad_multiple_ - target % pad_multiple_;
    if (target > ids.size()) {
      size_t n = target - ids.size();
      if (pad_left_)
        ids.insert(ids.begin(), n, pad_id_);
      else
        ids.insert(ids.end(), n, pad_id_);
    }
  }
  return ids;
}

// ---- decode & vocab -----------------------------------------------------------

std::optional<std::string> HfTokenizer::id_to_token(int id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
  if (auto t = model_->id_to_token(id)) return std::string(*t);
  return std::nullopt;
}

std::string HfTokenizer::decode(std::span<const int> ids, bool skip_special_tokens) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int id : ids) {
    std::optional<std::string_view> t;
    if (auto it = added_by_id_.find(id); it != added_by_id_.end())
      t = added_[it->second].decode_form;
    else
      t = model_->id_to_token(id);
    if (!t) continue;  // unknown ids are dropped, as in `tokenizers`
    if (skip_special_tokens && special_contents_.count(std::string(*t))) continue;
    toks.emplace_back(*t);
  }
  std::string out;
  if (decoder_) {
    decoder_->decode_chain(toks);
    for (auto& t : toks) out += t;
  } else {
    for (size_t k = 0; k < toks.size(); ++k) {
      if (k) out.push_back(' ');
      out += toks[k];
    }
  }
  return out;
}

int HfTokenizer::vocab_size() const {
  int n = model_->end_id();
  for (auto& [c, id] : added_ids_) n = std::max(n, id + 1);
  return n;
}

std::optional<int> HfTokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_ids_.find(token); it != added_ids_.end()) return it->second;
  return model_->token_to_id(token);
}

bool HfTokenizer::is_special(int id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

std::optional<int> HfTokenizer::bos_id() const { return bos_id_; }

// ---- loading tokenizer.json (streamed) ------------------------------------------
// nlohmann's SAX parser feeds a DOM builder for everything except
// model.vocab and model.merges, which go straight into VocabData (one string
// arena, no per-entry allocation). That and the flat tables of BpeModel make
// the Gemma-3 file (33 MB) load in about a third of the time of a full DOM.

namespace {
std::string slurp(const std::filesystem::path& p) {
  std::error_code ec;
  if (const std::string kind = path_kind(p); kind != "a regular file")
    throw InputError(fmt::format("{}: {}", p.string(), kind == "missing" ? "no such file" : "is " + kind + ", expected a file"));
  std::ifstream f(p, std::ios::binary);
  if (!f) throw InputError(fmt::format("{}: cannot open", p.string()));
  auto size = std::filesystem::file_size(p, ec);
  std::string data;
  if (!ec) {
    data.resize(size);
    f.read(data.data(), static_cast<std::streamsize>(size));
    data.resize(static_cast<size_t>(f.gcount()));
  } else {
    std::stringstream ss;
    ss << f.rdbuf();
    data = ss.str();
  }
  return data;
}

json read_json(const std::filesystem::path& p) {
  std::string data = slurp(p);
  check_json_depth(data, p.string());
  try {
    return json::parse(data);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON: {}", p.string(), e.what()));
  }
}

class TokenizerSax {
 public:
  using Dom = nlohmann::detail::json_sax_dom_parser<json>;
  TokenizerSax(json& out, VocabData& v, std::string ctx) : dom_(out, true), v_(v), ctx_(std::move(ctx)) {}

  bool null() { return cap_ ? cap_scalar(false) : dom_.null(); }
  bool boolean(bool b) { return cap_ ? cap_scalar(false) : dom_.boolean(b); }
  bool number_integer(json::number_integer_t x) { return cap_ ? cap_number(x) : dom_.number_integer(x); }
  bool number_unsigned(json::number_unsigned_t x) {
    return cap_ ? cap_number(x > (1ULL << 40) ? -1 : static_cast<long long>(x)) : dom_.number_unsigned(x);
  }
  bool number_float(json::number_float_t x, const std::string& s) {
    return cap_ ? cap_scalar(false) : dom_.number_float(x, s);
  }
  bool binary(json::binary_t& b) { return cap_ ? cap_scalar(false) : dom_.binary(b); }
  bool string(std::string& s) {
    if (!cap_) return dom_.string(s);
    if (skip_) return true;
    if (cap_ == Vocab) return cap_scalar(false);
    if (in_pair_) {  // ["a", "b"]
      if (pair_n_ < 2) pair_[pair_n_] = {v_.add(s), static_cast<uint32_t>(s.size())};
      ++pair_n_;
      return true;
    }
    size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      throw InputError(fmt::format("{}: merges[{}] = {:?} must be two tokens separated by one space", ctx_,
                                   v_.merges.size(), s));
    uint32_t off = v_.add(s);
    v_.merges.push_back({off, static_cast<uint32_t>(sp), static_cast<uint32_t>(off + sp + 1),
                         static_cast<uint32_t>(s.size() - sp - 1)});
    return true;
  }
  bool start_object(std::size_t n) { return open("vocab", Vocab, v_.has_vocab, [&] { return dom_.start_object(n); }); }
  bool end_object() { return close([&] { return dom_.end_object(); }); }
  bool start_array(std::size_t n) { return open("merges", Merges, v_.has_merges, [&] { return dom_.start_array(n); }); }
  bool end_array() { return close([&] { return dom_.end_array(); }); }
  bool key(std::string& k) {
    if (cap_) {
      if (!skip_) key_ = {v_.add(k), static_cast<uint32_t>(k.size())};
      return true;
    }
    if (depth_ == 1) in_model_ = k == "model";
    if (depth_ == 2) key2_ = k;
    return dom_.key(k);
  }
  bool parse_error(std::size_t pos, const std::string& tok, const nlohmann::detail::exception& ex) {
    return dom_.parse_error(pos, tok, ex);  // throws
  }

 private:
  enum Cap { None, Vocab, Merges };
  // A container starts: model.<key> (once: seen) is captured as `cap`, a
  // null in the DOM; any other goes to the DOM (dom_start).
  template <class F>
  bool open(const char* key, Cap cap, bool& seen, F&& dom_start) {
    if (cap_) return cap_open();
    if (depth_ == 2 && in_model_ && key2_ == key && !seen) {
      cap_ = cap;
      seen = true;
      ++depth_;
      return dom_.null();
    }
    ++depth_;
    return dom_start();
  }
  template <class F>
  bool close(F&& dom_end) {
    if (cap_) return cap_close();
    --depth_;
    return dom_end();
  }
  // A scalar inside the captured container (ok: a valid vocab id).
  bool cap_scalar(bool ok) {
    if (skip_) return true;
    if (cap_ == Vocab) {
      v_.vocab.push_back({key_.first, key_.second, ok ? id_ : -1});
      return true;
    }
    if (in_pair_) {
      pair_n_ = 3;  // not a string: invalid pair
      return true;
    }
    throw InputError(fmt::format("{}: merges[{}] must be \"a b\" or [\"a\", \"b\"]", ctx_, v_.merges.size()));
  }
  bool cap_number(long long x) {
    id_ = x;
    return cap_scalar(x >= 0);
  }
  bool cap_open() {
    if (skip_) {
      ++skip_;
      return true;
    }
    if (cap_ == Merges && !in_pair_) {
      in_pair_ = true;
      pair_n_ = 0;
      return true;
    }
    if (cap_ == Vocab) v_.vocab.push_back({key_.first, key_.second, -1});
    if (cap_ == Merges) pair_n_ = 3;
    skip_ = 1;
    return true;
  }
  bool cap_close() {
    if (skip_) {
      --skip_;
      return true;
    }
    if (in_pair_) {
      in_pair_ = false;
      if (pair_n_ != 2)
        throw InputError(fmt::format("{}: merges[{}] must be \"a b\" or [\"a\", \"b\"]", ctx_, v_.merges.size()));
      v_.merges.push_back({pair_[0].first, pair_[0].second, pair_[1].first, pair_[1].second});
      return true;
    }
    cap_ = None;
    --depth_;
    return true;
  }

  Dom dom_;
  VocabData& v_;
  std::string ctx_;
  int depth_ = 0;
  bool in_model_ = false;
  std::string key2_;
  Cap cap_ = None;
  int skip_ = 0;
  std::pair<uint32_t, uint32_t> key_{0, 0};
  long long id_ = 0;
  bool in_pair_ = false;
  int pair_n_ = 0;
  std::pair<uint32_t, uint32_t> pair_[2];
};

bool config_bool(const json& cfg, const char* key, bool dflt, const std::string& ctx) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) throw InputError(fmt::format("{}: \"{}\" must be true or false", ctx, key));
  return it->get<bool>();
}

// A special-token value of tokenizer_config.json: "text" or {"content": "text", ...}.
void add_token_value(const json& v, std::vector<std::string>& out) {
  if (v.is_string()) out.push_back(v.get<std::string>());
  if (v.is_object() && v.contains("content") && v["content"].is_string()) out.push_back(v["content"].get<std::string>());
}

// Does the pipeline work on "▁" text (SentencePiece style) rather than bytes?
bool uses_byte_level(const json& node) {
  if (node.is_object()) {
    auto t = node.find("type");
    if (t != node.end() && t->is_string() && *t == "ByteLevel") return true;
    for (auto& [k, v] : node.items())
      if (uses_byte_level(v)) return true;
  } else if (node.is_array()) {
    for (auto& v : node)
      if (uses_byte_level(v)) return true;
  }
  return false;
}
}  // namespace

ParsedTokenizerJson parse_tokenizer_json(const std::filesystem::path& p) {
  std::string data = slurp(p);
  ParsedTokenizerJson out;
  out.source = p.string();
  VocabData v;
  std::string mctx = out.source + ": model";
  check_json_depth(data, out.source);  // the stages are built recursively (Sequence)
  try {
    TokenizerSax sax(out.rest, v, mctx);
    json::sax_parse(data, &sax);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON: {}", p.string(), e.what()));
  }
  data.clear();
  data.shrink_to_fit();
  const json& j = out.rest;
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object at the top level", out.source));
  const json& model = req(j, "model", out.source);
  if (!model.is_object()) throw InputError(fmt::format("{}: must be an object", mctx));
  std::string type;
  if (model.contains("type")) {
    type = req_str(model, "type", mctx);
  } else if (model.contains("merges")) {
    type = "BPE";  // older files omit the type
  } else {
    throw InputError(fmt::format("{}: missing field \"type\"", mctx));
  }
  if (type != "BPE")
    throw InputError(fmt::format("{}: model type \"{}\" is unsupported (fp8kv supports BPE tokenizers: byte-level and "
                                 "SentencePiece-style)",
                                 mctx, type));
  // A vocab that is not an object is left to BpeModel's error; merges that
  // are not an array were not captured either.
  if (!v.has_merges) {
    auto it = model.find("merges");
    if (it != model.end() && !it->is_null()) throw InputError(fmt::format("{}: \"merges\" must be an array", mctx));
  }
  out.model = std::make_shared<BpeModel>(model, std::move(v), mctx);
  return out;
}

DirConfig read_dir_config(const json& cfg, const ParsedTokenizerJson& t, const std::string& src) {
  if (!cfg.is_object()) throw InputError(fmt::format("{}: expected a JSON object", src));
  DirConfig d;
  d.split_special_tokens = config_bool(cfg, "split_special_tokens", false, src);
  std::string cls;
  if (auto it = cfg.find("tokenizer_class"); it != cfg.end() && it->is_string()) cls = it->get<std::string>();
  // Special-token attributes (and the class's defaults for those not set):
  // transformers registers them as special tokens of the backend.
  static const char* kAttrs[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                 "mask_token", "cls_token", "sep_token"};
  std::vector<std::pair<const char*, const char*>> defaults;
  if (cls == "GemmaTokenizer" || cls == "GemmaTokenizerFast")
    defaults = {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}, {"unk_token", "<unk>"}, {"pad_token", "<pad>"},
                {"mask_token", "<mask>"}};
  for (const char* a : kAttrs) {
    auto it = cfg.find(a);
    if (it != cfg.end()) {
      add_token_value(*it, d.special_contents);
      continue;
    }
    for (auto& [k, v] : defaults)
      if (std::string_view(k) == a) d.special_contents.push_back(v);
  }
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    auto it = cfg.find(key);
    if (it == cfg.end()) continue;
    if (it->is_array())
      for (auto& v : *it) add_token_value(v, d.special_contents);
    if (it->is_object())
      for (auto& [k, v] : it->items()) add_token_value(v, d.special_contents);
  }
  // LlamaTokenizer[Fast] rebuilds a SentencePiece-style pipeline. Over a
  // byte-level vocab (DeepSeek-V3) transformers 5 breaks the tokenizer (spaces
  // are dropped); we follow tokenizer.json there.
  if ((cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast") && !uses_byte_level(t.rest)) {
    d.llama_rebuild = true;
    d.legacy = config_bool(cfg, "legacy", false, src);
    d.add_prefix_space = config_bool(cfg, "add_prefix_space", true, src);
  }
  return d;
}

std::unique_ptr<Tokenizer> make_tokenizer(const ParsedTokenizerJson& t, const DirConfig* dir) {
  return std::make_unique<HfTokenizer>(t.rest, t.model, t.source, dir);
}

}  // namespace tok

// ---- public API --------------------------------------------------------------

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  return tok::make_tokenizer(tok::parse_tokenizer_json(tokenizer_json));
}

// A model directory as transformers 5's AutoTokenizer loads it; the rules,
// each pinned by a golden, are listed in src/tokenizer/README.md ("Model
// directories").
std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::filesystem::path& dir) {
  auto tj = dir / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(tj, ec))
    throw InputError(fmt::format("{}: no tokenizer.json in this directory (fp8kv reads the Hugging Face "
                                 "tokenizer.json format only)",
                                 dir.string()));
  tok::ParsedTokenizerJson t = tok::parse_tokenizer_json(tj);
  auto cfg_path = dir / "tokenizer_config.json";
  if (!optional_file(cfg_path)) return tok::make_tokenizer(t);  // a FIFO or directory there: refused
  tok::DirConfig d = tok::read_dir_config(tok::read_json(cfg_path), t, cfg_path.string());
  return tok::make_tokenizer(t, &d);
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& dir_or_file) {
  if (dir_or_file.empty())
    throw InputError("the tokenizer path is empty (expected a model directory or a tokenizer.json)");
  const std::string kind = path_kind(dir_or_file);
  if (kind == "a directory") return from_dir(dir_or_file);
  if (kind == "missing") throw InputError(fmt::format("{}: no such file or directory", dir_or_file.string()));
  if (kind != "a regular file")
    throw InputError(fmt::format("{}: is {}, expected a model directory or a tokenizer.json", dir_or_file.string(), kind));
  if (dir_or_file.filename() == "config.json")
    throw InputError(fmt::format("{}: is a model's config.json, not a tokenizer: give the model directory {}",
                                 dir_or_file.string(), dir_or_file.parent_path().empty() ? std::string(".") : dir_or_file.parent_path().string()));
  return from_file(dir_or_file);
}

// ---- IncrementalDecoder ---------------------------------------------------------
// The window approach of HF's DecodeStream / vLLM: decode ids[prefix:read] and
// ids[prefix:], emit the difference once it no longer ends in U+FFFD (an
// incomplete UTF-8 sequence). Keeping one already-emitted token in the window
// preserves the spaces decoders strip from a sequence's first token.

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {}

std::string IncrementalDecoder::step(bool final) {
  std::span<const int> all(ids_);
  std::string prefix_text = tok_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  std::string new_text = tok_.decode(all.subspan(prefix_offset_), skip_special_);
  bool extends = new_text.size() >= prefix_text.size() && new_text.compare(0, prefix_text.size(), prefix_text) == 0;
  if (!final) {
    if (!extends || new_text.size() == prefix_text.size()) return {};
    if (new_text.size() >= 3 && new_text.compare(new_text.size() - 3, 3, utf8::kReplacement) == 0) return {};
  }
  std::string out;
  if (extends) {
    out = new_text.substr(prefix_text.size());
  } else {
    // The decoder rewrote already emitted text; emit what follows the common
    // prefix (cut at a character boundary) so nothing is lost.
    size_t k = 0;
    while (k < prefix_text.size() && k < new_text.size() && prefix_text[k] == new_text[k]) ++k;
    while (k > 0 && (static_cast<unsigned char>(new_text[k]) & 0xC0) == 0x80) --k;
    out = new_text.substr(k);
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (prefix_offset_ > 64) {  // drop ids no longer in the window
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
  return out;
}

std::string IncrementalDecoder::push(int id) {
  ids_.push_back(id);
  return step(false);
}

std::string IncrementalDecoder::flush() {
  if (read_offset_ == ids_.size()) return {};
  return step(true);
}

}  // namespace fp8kv
