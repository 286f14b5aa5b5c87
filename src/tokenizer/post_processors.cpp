// Post-processors: TemplateProcessing (single sequence), ByteLevel (offsets
// only: no id change), RobertaProcessing / BertProcessing, Sequence.
#include <fmt/format.h>

#include "io/errors.h"
#include "tokenizer/pipeline.h"

namespace fp8kv::tok {

namespace {

class AffixProcessor final : public PostProcessor {
 public:
  AffixProcessor(std::vector<int> pre, std::vector<int> post) : pre_(std::move(pre)), post_(std::move(post)) {}
  void process(std::vector<int>& ids) const override {
    if (!pre_.empty()) ids.insert(ids.begin(), pre_.begin(), pre_.end());
    ids.insert(ids.end(), post_.begin(), post_.end());
  }
  size_t added_tokens() const override { return pre_.size() + post_.size(); }
  std::vector<int> prefix() const override { return pre_; }
  std::vector<int> inserted_ids() const override {
    std::vector<int> r = pre_;
    r.insert(r.end(), post_.begin(), post_.end());
    return r;
  }

 private:
  std::vector<int> pre_, post_;
};

class NoopProcessor final : public PostProcessor {
 public:
  void process(std::vector<int>&) const override {}
  size_t added_tokens() const override { return 0; }
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> v) : v_(std::move(v)) {}
  void process(std::vector<int>& ids) const override {
    for (auto& p : v_) p->process(ids);
  }
  size_t added_tokens() const override {
    size_t n = 0;
    for (auto& p : v_) n += p->added_tokens();
    return n;
  }
  std::vector<int> prefix() const override {
    std::vector<int> r;
    for (auto it = v_.rbegin(); it != v_.rend(); ++it) {
      auto p = (*it)->prefix();
      r.insert(r.begin(), p.begin(), p.end());
    }
    return r;
  }
  std::vector<int> inserted_ids() const override {
    std::vector<int> r;
    for (auto& p : v_) {
      auto q = p->inserted_ids();
      r.insert(r.end(), q.begin(), q.end());
    }
    return r;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> v_;
};

int as_id(const json& v, const std::string& ctx) {
  if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > INT32_MAX)
    throw InputError(fmt::format("{}: expected a token id, an integer in [0, 2147483647 (2^31 - 1)], got {}", ctx, v.dump()));
  return v.get<int>();
}

// {"sep": ["</s>", 2], "cls": ["<s>", 0]}
int pair_id(const json& j, const char* key, const std::string& ctx) {
  const json& v = req(j, key, ctx);
  if (!v.is_array() || v.size() != 2) throw InputError(fmt::format("{}: \"{}\" must be [token, id]", ctx, key));
  return as_id(v[1], fmt::format("{}.{}", ctx, key));
}

std::unique_ptr<PostProcessor> make_template(const json& j, const std::string& ctx) {
  const json& single = req(j, "single", ctx);
  static const json kNoSpecials = json::object();
  const json& specials = j.contains("special_tokens") ? j["special_tokens"] : kNoSpecials;
  if (!single.is_array()) throw InputError(fmt::format("{}: \"single\" must be an array", ctx));
  std::vector<int> pre, post;
  bool seen_seq = false;
  for (size_t i = 0; i < single.size(); ++i) {
    std::string ictx = fmt::format("{}.single[{}]", ctx, i);
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      if (seen_seq) throw InputError(fmt::format("{}: more than one sequence in a single template", ictx));
      seen_seq = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken"))
      throw InputError(fmt::format("{}: expected {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}", ictx));
    std::string name = req_str(item["SpecialToken"], "id", ictx);
    if (!specials.is_object() || !specials.contains(name))
      throw InputError(fmt::format("{}: special token \"{}\" missing from special_tokens", ictx, name));
    std::string sctx = fmt::format("{}.special_tokens[\"{}\"]", ctx, name);
    const json& ids = req(specials[name], "ids", sctx);
    if (!ids.is_array()) throw InputError(fmt::format("{}: special_tokens[\"{}\"].ids must be an array", ctx, name));
    for (const auto& id : ids) (seen_seq ? post : pre).push_back(as_id(id, ictx));
  }
  if (!seen_seq) throw InputError(fmt::format("{}: \"single\" template has no $A sequence", ctx));
  return std::make_unique<AffixProcessor>(std::move(pre), std::move(post));
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& ctx) {
  if (j.is_null()) return nullptr;
  std::string type = req_str(j, "type", ctx);
  if (type == "TemplateProcessing") return make_template(j, ctx);
  if (type == "ByteLevel") return std::make_unique<NoopProcessor>();
  if (type == "RobertaProcessing" || type == "BertProcessing")
    return std::make_unique<AffixProcessor>(std::vector<int>{pair_id(j, "cls", ctx)},
                                            std::vector<int>{pair_id(j, "sep", ctx)});
  if (type == "Sequence")
    return std::make_unique<SequenceProcessor>(make_sequence(j, "processors", ctx, make_post_processor));
  throw InputError(fmt::format("{}: unsupported post-processor type \"{}\" (supported: TemplateProcessing, "
                               "ByteLevel, RobertaProcessing, BertProcessing, Sequence)",
                               ctx, type));
}

}  // namespace fp8kv::tok
