// `fp8kv tokenize` and `fp8kv detokenize`: Hugging Face tokenizer.json (or a
// model directory) encode / decode, result as JSON on stdout.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/text_input.h"
#include "io/errors.h"
#include "io/user_files.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::cli {
namespace {

// "1,2,3" (spaces allowed) or a JSON-style "[1, 2, 3]"; "" and "[]" are the
// empty list.
std::vector<int> parse_ids(const std::string& s) {
  std::string_view body = s;
  const size_t b = body.find_first_not_of(" \t\n");
  if (b != std::string_view::npos && body[b] == '[') {
    const size_t e = body.find_last_of(']');
    if (e == std::string_view::npos || e < b) throw UsageError("--ids: unbalanced '['");
    body = body.substr(b + 1, e - b - 1);
  }
  if (body.find_first_not_of(" \t\n") == std::string_view::npos) return {};
  std::vector<int> ids;
  for (int64_t v : parse_int_list(body, "--ids", 0, std::numeric_limits<int32_t>::max()))
    ids.push_back(static_cast<int>(v));
  return ids;
}

void print_json(nlohmann::ordered_json& j) {
  j["fp8kv_version"] = version_string();
  std::cout << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

Registrar reg_tokenize([](CLI::App& app) {
  auto* sub = app.add_subcommand("tokenize", "Encode text with a Hugging Face tokenizer.json or model directory");
  auto path = std::make_shared<std::string>();
  auto text = std::make_shared<std::string>();
  auto text_file = std::make_shared<std::string>();
  auto no_special = std::make_shared<bool>(false);
  sub->add_option("path", *path, "Model directory or tokenizer.json")->required();
  auto* o_text = sub->add_option("--text", *text, "Literal text to encode")->check(utf8_text());
  auto* o_file = sub->add_option("--text-file", *text_file, "File whose bytes (UTF-8) are encoded");
  o_text->excludes(o_file);
  sub->add_flag("--no-special", *no_special, "Do not add the post-processor's special tokens (BOS/EOS)");
  set_action(sub, [=]() {
    if (o_text->count() == 0 && o_file->count() == 0) throw UsageError("tokenize: give --text or --text-file");
    std::string input = o_file->count() ? read_text_option_file(*text_file, "--text-file") : *text;
    auto tok = Tokenizer::load(*path);
    auto ids = tok->encode(input, !*no_special);
    nlohmann::ordered_json out;
    out["ids"] = ids;
    print_json(out);
    return 0;
  });
});

Registrar reg_detokenize([](CLI::App& app) {
  auto* sub = app.add_subcommand("detokenize", "Decode token ids with a Hugging Face tokenizer.json or model directory");
  auto path = std::make_shared<std::string>();
  auto ids = std::make_shared<std::string>();
  auto skip_special = std::make_shared<bool>(false);
  sub->add_option("path", *path, "Model directory or tokenizer.json")->required();
  sub->add_option("--ids", *ids, "Comma-separated token ids, e.g. 1,2,3")->required();
  sub->add_flag("--skip-special", *skip_special, "Drop special tokens from the text");
  set_action(sub, [=]() {
    auto list = parse_ids(*ids);
    auto tok = Tokenizer::load(*path);
    // `tokenizers` skips an unknown id silently; an id the vocabulary lacks is
    // a mistake in the input, so it is refused (exit 2), naming the id.
    for (int id : list)
      if (!tok->id_to_token(id))
        throw UsageError(fmt::format("--ids: id {} is not in the vocabulary of {} (size {})", id, *path,
                                     tok->vocab_size()));
    nlohmann::ordered_json out;
    out["text"] = tok->decode(list, *skip_special);
    print_json(out);
    return 0;
  });
});

}  // namespace
}  // namespace fp8kv::cli
