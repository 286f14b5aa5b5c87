// Decoders (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
// BPEDecoder, Sequence) with `tokenizers`' decode_chain semantics.
#include <fmt/format.h>

#include "io/errors.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/utf8.h"

namespace fp8kv::tok {

namespace {

class ByteLevelDec final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      std::string mapped;
      bool all = true;
      size_t i = 0;
      while (i < t.size()) {
        int b = unicode_to_byte(utf8::next_cp(t, i));
        if (b < 0) {
          all = false;
          break;
        }
        mapped.push_back(static_cast<char>(b));
      }
      bytes += all ? mapped : t;
    }
    tokens.assign(1, utf8::lossy(bytes));
  }
};

class MetaspaceDec final : public Decoder {
 public:
  MetaspaceDec(char32_t repl, bool strip_first) : repl_(repl), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string& t = tokens[k];
      std::string out;
      size_t i = 0;
      while (i < t.size()) {
        size_t b = i;
        char32_t c = utf8::next_cp(t, i);
        if (c == repl_) {
          if (!(k == 0 && strip_first_)) out.push_back(' ');
        } else {
          out.append(t, b, i - b);
        }
      }
      tokens[k].swap(out);
    }
  }

 private:
  char32_t repl_;
  bool strip_first_;
};

class ReplaceDec final : public Decoder {
 public:
  ReplaceDec(std::unique_ptr<Regex> re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<Span> found;
    for (auto& t : tokens) replace_matches(*re_, content_, t, found);
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

int parse_byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

class ByteFallbackDec final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t pending_n = 0;
    auto flush = [&] {
      if (pending_n == 0) return;
      if (utf8::is_valid(pending)) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending_n; ++k) out.emplace_back(utf8::kReplacement);
      }
      pending.clear();
      pending_n = 0;
    };
    for (auto& t : tokens) {
      int b = parse_byte_token(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
        ++pending_n;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDec final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDec final : public Decoder {
 public:
  StripDec(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, cp)
      size_t i = 0;
      while (i < t.size()) {
        size_t b = i;
        chars.push_back({b, utf8::next_cp(t, i)});
      }
      size_t start_cut = 0;
      for (size_t k = 0; k < start_ && k < chars.size(); ++k) {
        if (chars[k].second != content_) break;
        start_cut = k + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t k = 0; k < stop_ && k < chars.size(); ++k) {
        size_t idx = chars.size() - k - 1;
        if (chars[idx].second != content_) break;
        stop_cut = idx;
      }
      if (start_cut >= stop_cut) {
        t.clear();
        continue;
      }
      size_t bb = chars[start_cut].first;
      size_t be = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(bb, be - bb);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class BpeDec final : public Decoder {
 public:
  explicit BpeDec(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (suffix_.empty()) return;
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string repl = k + 1 == tokens.size() ? "" : " ";
      std::string& t = tokens[k];
      std::string out;
      size_t prev = 0, pos;
      while ((pos = t.find(suffix_, prev)) != std::string::npos) {
        out.append(t, prev, pos - prev);
        out += repl;
        prev = pos + suffix_.size();
      }
      out.append(t, prev, std::string::npos);
      t.swap(out);
    }
  }

 private:
  std::string suffix_;
};

class SequenceDec final : public Decoder {
 public:
  explicit SequenceDec(std::vector<std::unique_ptr<Decoder>> v) : v_(std::move(v)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& d : v_) d->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> v_;
};

size_t req_size(const json& j, const char* key, const std::string& ctx) {
  const json& v = req(j, key, ctx);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<long long>() >= 0))
    throw InputError(fmt::format("{}: field \"{}\" must be a non-negative integer", ctx, key));
  return v.get<size_t>();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& ctx) {
  if (j.is_null()) return nullptr;
  std::string type = req_str(j, "type", ctx);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
  if (type == "Metaspace") {
    char32_t repl = req_char(j, "replacement", ctx);
    bool strip_first = true;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string())
      strip_first = j["prepend_scheme"].get<std::string>() != "never";
    else if (j.contains("add_prefix_space"))
      strip_first = opt_bool(j, "add_prefix_space", true, ctx);
    return std::make_unique<MetaspaceDec>(repl, strip_first);
  }
  if (type == "Replace") return std::make_unique<ReplaceDec>(make_pattern(j, ctx), req_str(j, "content", ctx));
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (type == "Fuse") return std::make_unique<FuseDec>();
  if (type == "Strip")
    return std::make_unique<StripDec>(req_char(j, "content", ctx), req_size(j, "start", ctx), req_size(j, "stop", ctx));
  if (type == "BPEDecoder") {
    std::string suffix = "</w>";
    if (j.contains("suffix") && j["suffix"].is_string()) suffix = j["suffix"].get<std::string>();
    return std::make_unique<BpeDec>(suffix);
  }
  if (type == "Sequence") return std::make_unique<SequenceDec>(make_sequence(j, "decoders", ctx, make_decoder));
  throw InputError(fmt::format("{}: unsupported decoder type \"{}\" (supported: ByteLevel, Metaspace, Replace, "
                               "ByteFallback, Fuse, Strip, BPEDecoder, Sequence)",
                               ctx, type));
}

}  // namespace fp8kv::tok
