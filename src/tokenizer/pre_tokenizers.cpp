// Pre-tokenizers: ByteLevel, Split, Metaspace, Digits, WhitespaceSplit,
// Whitespace, Punctuation, BertPreTokenizer, CharDelimiterSplit, Sequence;
// and the split machinery (NormalizedString::split) they share.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>

#include "io/errors.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/utf8.h"

namespace fp8kv::tok {

namespace {
struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 512> to_byte;  // stand-ins are all < U+0200
  ByteTables() {
    to_byte.fill(-1);
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = printable[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8::append_cp(to_unicode[b], cp);
      to_byte[cp] = b;
    }
  }
};
const ByteTables& tables() {
  static const ByteTables t;
  return t;
}
}  // namespace

const std::string& byte_to_unicode(unsigned char b) { return tables().to_unicode[b]; }
int unicode_to_byte(char32_t c) { return c < 512 ? tables().to_byte[c] : -1; }

SplitBehavior parse_behavior(const std::string& name, const std::string& ctx) {
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  throw InputError(fmt::format("{}: unknown split behavior \"{}\"", ctx, name));
}

std::vector<std::pair<Span, bool>> covering_matches(std::string_view s, const std::vector<Span>& found) {
  std::vector<std::pair<Span, bool>> out;
  if (s.empty()) {
    out.push_back({{0, 0}, false});
    return out;
  }
  size_t prev = 0;
  for (auto [b, e] : found) {
    if (prev != b) out.push_back({{prev, b}, false});
    out.push_back({{b, e}, true});
    prev = e;
  }
  if (prev != s.size()) out.push_back({{prev, s.size()}, false});
  return out;
}

namespace {
// A char predicate as a pattern: every matching char is its own match.
std::vector<std::pair<Span, bool>> char_matches(std::string_view s, const std::function<bool(char32_t)>& pred) {
  std::vector<std::pair<Span, bool>> out;
  if (s.empty()) {
    out.push_back({{0, 0}, false});
    return out;
  }
  size_t last = 0, i = 0;
  while (i < s.size()) {
    size_t b = i;
    char32_t c = utf8::next_cp(s, i);
    if (pred(c)) {
      if (last < b) out.push_back({{last, b}, false});
      out.push_back({{b, i}, true});
      last = i;
    }
  }
  if (s.size() > last) out.push_back({{last, s.size()}, false});
  return out;
}
}  // namespace

std::vector<Span> apply_behavior(const std::vector<std::pair<Span, bool>>& matches, SplitBehavior b) {
  std::vector<std::pair<Span, bool>> splits;  // (span, remove)
  switch (b) {
    case SplitBehavior::Isolated:
      for (auto& [sp, m] : matches) splits.push_back({sp, false});
      break;
    case SplitBehavior::Removed:
      splits = matches;
      break;
    case SplitBehavior::Contiguous:
    case SplitBehavior::MergedWithPrevious: {
      // A span joins the one before it: Contiguous, when both are matches or
      // both are not; MergedWithPrevious, when it is a match after a non-match.
      const bool contiguous = b == SplitBehavior::Contiguous;
      bool prev = false;
      for (auto& [sp, m] : matches) {
        if ((contiguous ? m == prev : m && !prev) && !splits.empty())
          splits.back().first.second = sp.second;
        else
          splits.push_back({sp, false});
        prev = m;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        auto& [sp, m] = *it;
        if (m && !prev && !splits.empty())
          splits.back().first.first = sp.first;
        else
          splits.push_back({sp, false});
        prev = m;
      }
      std::reverse(splits.begin(), splits.end());
      break;
    }
  }
  std::vector<Span> out;
  for (auto& [sp, remove] : splits)
    if (!remove) out.push_back(sp);
  return out;
}

namespace {

using MatchFn = std::function<std::vector<std::pair<Span, bool>>(std::string_view)>;

void split_pieces(std::vector<Piece>& pieces, const MatchFn& fn, SplitBehavior behavior) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (auto& p : pieces) {
    for (auto [b, e] : apply_behavior(fn(p.text), behavior)) {
      if (e == b) continue;
      out.push_back(Piece{p.text.substr(b, e - b), p.at_start && b == 0});
    }
  }
  pieces.swap(out);
}

MatchFn regex_fn(std::shared_ptr<Regex> re, bool invert) {
  return [re = std::move(re), invert](std::string_view s) {
    thread_local std::vector<Span> found;
    re->find_all(s, found);
    auto m = covering_matches(s, found);
    // A huge input must not leave its match list behind (a server worker keeps its thread_locals).
    if (found.capacity() > (size_t{1} << 16)) std::vector<Span>().swap(found);
    if (invert)
      for (auto& x : m) x.second = !x.second;
    return m;
  };
}

MatchFn char_fn(std::function<bool(char32_t)> pred) {
  return [pred = std::move(pred)](std::string_view s) { return char_matches(s, pred); };
}

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) split_ = regex_fn(std::make_shared<Regex>(kGpt2Pattern, "ByteLevel"), false);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_)
      for (auto& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text = " " + p.text;
    if (split_) split_pieces(pieces, split_, SplitBehavior::Isolated);
    const auto& t = tables();
    for (auto& p : pieces) {
      std::string mapped;
      mapped.reserve(p.text.size() * 2);
      for (unsigned char c : p.text) mapped += t.to_unicode[c];
      p.text.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  MatchFn split_;
};

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(MatchFn fn, SplitBehavior b) : fn_(std::move(fn)), b_(b) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override { split_pieces(pieces, fn_, b_); }

 private:
  MatchFn fn_;
  SplitBehavior b_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePre final : public PreTokenizer {
 public:
  MetaspacePre(char32_t repl, PrependScheme scheme, bool split) : repl_(repl), scheme_(scheme), split_(split) {
    utf8::append_cp(repl_str_, repl);
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      std::string r;
      r.reserve(p.text.size() + 8);
      for (char c : p.text) {
        if (c == ' ')
          r += repl_str_;
        else
          r.push_back(c);
      }
      bool starts = r.compare(0, repl_str_.size(), repl_str_) == 0;
      if (!starts && (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && p.at_start))) r = repl_str_ + r;
      p.text.swap(r);
    }
    if (split_) {
      char32_t repl = repl_;
      split_pieces(pieces, char_fn([repl](char32_t c) { return c == repl; }), SplitBehavior::MergedWithNext);
    }
  }

 private:
  char32_t repl_;
  std::string repl_str_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> v) : v_(std::move(v)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (auto& p : v_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> v_;
};

}  // namespace


std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& ctx) {
  if (j.is_null()) return nullptr;
  std::string type = req_str(j, "type", ctx);
  if (type == "ByteLevel")
    return std::make_unique<ByteLevelPre>(opt_bool(j, "add_prefix_space", true, ctx), opt_bool(j, "use_regex", true, ctx));
  if (type == "Split") {
    std::shared_ptr<Regex> re = make_pattern(j, ctx);
    auto b = parse_behavior(req_str(j, "behavior", ctx), ctx);
    return std::make_unique<SplitPre>(regex_fn(re, opt_bool(j, "invert", false, ctx)), b);
  }
  if (type == "Metaspace") {
    char32_t repl = req_char(j, "replacement", ctx);
    PrependScheme scheme = PrependScheme::Always;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      std::string s = j["prepend_scheme"].get<std::string>();
      if (s == "always") scheme = PrependScheme::Always;
      else if (s == "first") scheme = PrependScheme::First;
      else if (s == "never") scheme = PrependScheme::Never;
      else throw InputError(fmt::format("{}: unknown prepend_scheme \"{}\"", ctx, s));
    } else if (j.contains("add_prefix_space")) {
      scheme = opt_bool(j, "add_prefix_space", true, ctx) ? PrependScheme::Always : PrependScheme::Never;
    }
    return std::make_unique<MetaspacePre>(repl, scheme, opt_bool(j, "split", true, ctx));
  }
  if (type == "Digits") {
    bool individual = opt_bool(j, "individual_digits", false, ctx);
    return std::make_unique<SplitPre>(char_fn(utf8::is_numeric),
                                      individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
  }
  if (type == "WhitespaceSplit") return std::make_unique<SplitPre>(char_fn(utf8::is_whitespace), SplitBehavior::Removed);
  if (type == "Whitespace")
    return std::make_unique<SplitPre>(regex_fn(std::make_shared<Regex>(R"(\w+|[^\w\s]+)", ctx), true),
                                      SplitBehavior::Removed);
  if (type == "Punctuation") {
    SplitBehavior b = SplitBehavior::Isolated;
    if (j.contains("behavior")) b = parse_behavior(req_str(j, "behavior", ctx), ctx);
    return std::make_unique<SplitPre>(char_fn(utf8::is_punctuation), b);
  }
  if (type == "CharDelimiterSplit") {
    char32_t d = req_char(j, "delimiter", ctx);
    return std::make_unique<SplitPre>(char_fn([d](char32_t c) { return c == d; }), SplitBehavior::Removed);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> v;
    v.push_back(std::make_unique<SplitPre>(char_fn(utf8::is_whitespace), SplitBehavior::Removed));
    v.push_back(std::make_unique<SplitPre>(char_fn(utf8::is_punctuation), SplitBehavior::Isolated));
    return std::make_unique<SequencePre>(std::move(v));
  }
  if (type == "Sequence")
    return std::make_unique<SequencePre>(make_sequence(j, "pretokenizers", ctx, make_pre_tokenizer));
  throw InputError(fmt::format("{}: unsupported pre-tokenizer type \"{}\" (supported: ByteLevel, Split, Metaspace, "
                               "Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, "
                               "CharDelimiterSplit, Sequence)",
                               ctx, type));
}

}  // namespace fp8kv::tok
