// libFuzzer target: the server's request bodies (/v1/completions and
// /v1/chat/completions, src/server/request.h). Any JSON body must either
// parse into a request whose prompt ids are < the vocabulary and whose
// max_tokens fits max_model_len, or be refused with ApiError (a 4xx naming
// the field). Any other exception would be a 500 "internal error" in the
// server; it, a crash, a hang or a sanitizer report is a bug. The tokenizer
// is the bundled model's (loaded once). Build and run: docs/fuzzing.md.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace {
using namespace fp8kv;
using namespace fp8kv::server;

const ModelContext& context() {
  static std::unique_ptr<Tokenizer> tok = Tokenizer::load(std::string(FP8KV_SOURCE_DIR) + "/models/fp8kv-mini");
  static ModelContext ctx = [] {
    ModelContext c;
    c.served_name = "mini";
    c.model_dir = std::string(FP8KV_SOURCE_DIR) + "/models/fp8kv-mini";
    c.tokenizer = tok.get();
    c.vocab_size = tok->vocab_size();
    c.max_model_len = 256;
    // A stand-in renderer: the messages as JSON text (the template engine
    // has its own target, fuzz_template).
    c.chat = [](const nlohmann::ordered_json& m, bool gen, const nlohmann::ordered_json& extra) {
      return m.dump() + (gen ? "<assistant>" : "") + extra.dump();
    };
    return c;
  }();
  return ctx;
}

void check(const ParsedRequest& r, const ModelContext& ctx) {
  for (int id : r.prompt)
    if (id < 0 || id >= ctx.vocab_size) __builtin_trap();
  if (r.prompt.empty()) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // The server refuses invalid JSON before these functions (parse_body).
  const nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(text, nullptr, false);
  const ModelContext& ctx = context();
  try {
    check_model_field(body, ctx);
  } catch (const ApiError&) {
  }
  try {
    check(parse_completion_request(body, ctx), ctx);
  } catch (const ApiError&) {
  }
  try {
    check(parse_chat_request(body, ctx, &ordered), ctx);
  } catch (const ApiError&) {
  }
  return 0;
}
