// fp8kv's config parser against what transformers itself derives from the
// same config.json (tests/golden/config_parity/expected.json, produced by
// tools/check_config_parity.py on the GPU machine from
// tests/data/config_cases/cases.json). Skips while the golden is absent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "io/errors.h"
#include "model/config.h"

using namespace fp8kv;
using ::testing::HasSubstr;
using nlohmann::json;
namespace fs = std::filesystem;

TEST(ConfigParity, MatchesTransformers) {
  const fs::path src(FP8KV_SOURCE_DIR);
  const fs::path golden = src / "tests/golden/config_parity/expected.json";
  if (!fs::exists(golden))
    GTEST_SKIP() << "golden missing: run `python3 tools/check_config_parity.py` on the GPU machine";
  const json cases = json::parse(std::ifstream(src / "tests/data/config_cases/cases.json"));
  const json exp = json::parse(std::ifstream(golden))["cases"];
  int compared = 0;
  for (const auto& [name, want] : exp.items()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(cases.contains(name));
    // Cases fp8kv rejects although transformers builds a config: checked by
    // name, the error must name the field.
    if (name == "mistral_bad_gqa" || name == "qwen3_bad_gqa") {
      EXPECT_THAT(test_util::input_error_of([&] { parse_model_config(cases[name], name); }),
                  HasSubstr("num_key_value_heads"));
      continue;
    }
    if (want.contains("error")) {
      EXPECT_THROW(parse_model_config(cases[name], name), InputError) << "transformers rejects: " << want["error"];
      continue;
    }
    const ModelConfig c = parse_model_config(cases[name], name);
    EXPECT_EQ(c.num_kv_heads, want["num_kv_heads"].get<int>());
    EXPECT_EQ(c.head_dim, want["head_dim"].get<int>());
    EXPECT_EQ(c.vocab_size, want["vocab_size"].get<int>());
    std::vector<int> windows;
    for (int l = 0; l < c.num_layers; ++l) windows.push_back(c.window_for_layer(l));
    EXPECT_EQ(windows, want["windows"].get<std::vector<int>>());
    for (const auto& [rope, key] : {std::pair{&c.rope_full, "rope_full"}, std::pair{&c.rope_sliding, "rope_sliding"}}) {
      EXPECT_EQ(rope->type, want[key]["rope_type"].get<std::string>()) << key;
      EXPECT_EQ(rope->theta, want[key]["rope_theta"].get<double>()) << key;
      EXPECT_EQ(rope->factor, want[key]["factor"].get<double>()) << key;
    }
    EXPECT_EQ(c.tie_word_embeddings, want["tie_word_embeddings"].get<bool>());
    std::vector<int> eos;
    if (want["eos_token_id"].is_array()) eos = want["eos_token_id"].get<std::vector<int>>();
    else if (want["eos_token_id"].is_number_integer()) eos = {want["eos_token_id"].get<int>()};
    EXPECT_EQ(c.eos_token_ids, eos);
    if (want.contains("query_pre_attn_scalar")) {
      EXPECT_EQ(c.query_pre_attn_scalar, want["query_pre_attn_scalar"].get<double>());
    }
    ++compared;
  }
  EXPECT_GE(compared, 15);
}
