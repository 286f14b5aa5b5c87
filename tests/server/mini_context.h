// The server unit tests' request context: the bundled model's tokenizer,
// served as "mini", with a small max_model_len (64) and no chat template.
#pragma once
#include <filesystem>
#include <memory>

#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace fp8kv::server::test_support {

struct MiniContext {
  std::unique_ptr<Tokenizer> tok =
      Tokenizer::load(std::filesystem::path(FP8KV_SOURCE_DIR) / "models/fp8kv-mini");
  ModelContext ctx;
  MiniContext() {
    ctx.served_name = "mini";
    ctx.tokenizer = tok.get();
    ctx.vocab_size = 8192;
    ctx.max_model_len = 64;
    ctx.chat_unavailable_reason = "no chat template support in this build";
  }
};

}  // namespace fp8kv::server::test_support
