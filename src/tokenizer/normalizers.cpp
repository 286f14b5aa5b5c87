// Normalizers (NFC/NFD/NFKC/NFKD via utf8proc, Lowercase, Prepend, Replace,
// Strip, StripAccents, Sequence) and the JSON helpers shared by the stages.
#include <fmt/format.h>
#include <utf8proc.h>

#include <cstdlib>

#include "io/errors.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/utf8.h"

namespace fp8kv::tok {

const json& req(const json& j, const char* key, const std::string& ctx) {
  if (!j.is_object()) throw InputError(fmt::format("{}: expected a JSON object", ctx));
  auto it = j.find(key);
  if (it == j.end()) throw InputError(fmt::format("{}: missing field \"{}\"", ctx, key));
  return *it;
}

std::string req_str(const json& j, const char* key, const std::string& ctx) {
  const json& v = req(j, key, ctx);
  if (!v.is_string()) throw InputError(fmt::format("{}: field \"{}\" must be a string", ctx, key));
  return v.get<std::string>();
}

char32_t req_char(const json& j, const char* key, const std::string& ctx) {
  const std::string s = req_str(j, key, ctx);
  size_t i = 0;
  if (s.empty() || !utf8::is_valid(s)) throw InputError(fmt::format("{}: \"{}\" must be one character", ctx, key));
  const char32_t c = utf8::next_cp(s, i);
  if (i != s.size()) throw InputError(fmt::format("{}: \"{}\" must be one character", ctx, key));
  return c;
}

void replace_matches(const Regex& re, const std::string& content, std::string& s, std::vector<Span>& found) {
  re.find_all(s, found);
  if (found.empty()) return;
  std::string out;
  size_t prev = 0;
  for (auto [b, e] : found) {
    out.append(s, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(s, prev, std::string::npos);
  s.swap(out);
}

bool opt_bool(const json& j, const char* key, bool dflt, const std::string& ctx) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) throw InputError(fmt::format("{}: field \"{}\" must be true or false", ctx, key));
  return it->get<bool>();
}

namespace {

class UnicodeNorm final : public Normalizer {
 public:
  explicit UnicodeNorm(int options) : options_(options) {}
  void normalize(std::string& s) const override {
    if (s.empty()) return;
    utf8proc_uint8_t* dst = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                      static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                      static_cast<utf8proc_option_t>(options_));
    if (n < 0) throw InputError(fmt::format("unicode normalization failed: {}", utf8proc_errmsg(n)));
    s.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
  }

 private:
  int options_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      char32_t c = utf8::next_cp(s, i);
      if (c == 0x130) {  // Rust's to_lowercase: U+0130 -> "i\u0307"
        out += "i\xCC\x87";
        continue;
      }
      utf8::append_cp(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
    s.swap(out);
  }
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s = p_ + s;
  }

 private:
  std::string p_;
};

class Replace final : public Normalizer {
 public:
  Replace(std::unique_ptr<Regex> re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void normalize(std::string& s) const override {
    std::vector<Span> found;
    replace_matches(*re_, content_, s, found);
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        size_t i = b;
        if (!utf8::is_whitespace(utf8::next_cp(s, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t st = 0;
        if (!utf8::is_whitespace(utf8::prev_cp(s, e, &st))) break;
        e = st;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class StripAccents final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
      size_t b = i;
      char32_t c = utf8::next_cp(s, i);
      if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_MN) continue;
      out.append(s, b, i - b);
    }
    s.swap(out);
  }
};

class SequenceNorm final : public Normalizer {
 public:
  explicit SequenceNorm(std::vector<std::unique_ptr<Normalizer>> v) : v_(std::move(v)) {}
  void normalize(std::string& s) const override {
    for (auto& n : v_) n->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> v_;
};

}  // namespace

// {"String": s} or {"Regex": r} as used by Replace and Split.
std::unique_ptr<Regex> make_pattern(const json& j, const std::string& ctx) {
  const json& p = req(j, "pattern", ctx);
  if (p.is_object() && p.contains("String") && p["String"].is_string())
    return std::make_unique<Regex>(Regex::literal(p["String"].get<std::string>(), ctx));
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string())
    return std::make_unique<Regex>(p["Regex"].get<std::string>(), ctx);
  throw InputError(fmt::format("{}: \"pattern\" must be {{\"String\": ...}} or {{\"Regex\": ...}}", ctx));
}

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& ctx) {
  if (j.is_null()) return nullptr;
  std::string type = req_str(j, "type", ctx);
  if (type == "NFC") return std::make_unique<UnicodeNorm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNorm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeNorm>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeNorm>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Prepend") return std::make_unique<Prepend>(req_str(j, "prepend", ctx));
  if (type == "Replace") return std::make_unique<Replace>(make_pattern(j, ctx), req_str(j, "content", ctx));
  if (type == "Strip")
    return std::make_unique<Strip>(opt_bool(j, "strip_left", true, ctx), opt_bool(j, "strip_right", true, ctx));
  if (type == "Sequence") return std::make_unique<SequenceNorm>(make_sequence(j, "normalizers", ctx, make_normalizer));
  throw InputError(fmt::format("{}: unsupported normalizer type \"{}\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, "
                               "StripAccents, Prepend, Replace, Strip, Sequence)",
                               ctx, type));
}

}  // namespace fp8kv::tok
