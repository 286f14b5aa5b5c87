// Replays the config.json fuzz corpus (tests/data/fuzz_config, kept from
// tests/fuzz/fuzz_config.cpp runs: docs/fuzzing.md) through the parser, in
// every build including ASan+UBSan: each input is accepted or refused with
// InputError, never another exception, crash or sanitizer report.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <typeinfo>
#include <utility>

#include <nlohmann/json.hpp>

#include "../common/fuzz_corpus.h"
#include "io/errors.h"
#include "model/config.h"

namespace fs = std::filesystem;

TEST(ConfigFuzzCorpus, EveryInputParsedOrRefusedWithInputError) {
  const auto corpus = fp8kv::test_util::fuzz_corpus("fuzz_config");
  ASSERT_GE(corpus.size(), 20u) << "tests/data/fuzz_config";
  int accepted = 0, refused = 0, not_json = 0;
  for (const auto& [path, text] : corpus) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      ++not_json;
      continue;
    }
    try {
      const fp8kv::ModelConfig c = fp8kv::parse_model_config(j, path.filename().string());
      EXPECT_EQ(static_cast<int>(c.layer_types.size()), c.num_layers) << path;
      EXPECT_EQ(c.num_sliding_layers() > 0, c.sliding_window.has_value()) << path;
      // The fuzz target's other invariants (tests/fuzz/fuzz_config.cpp).
      EXPECT_GT(c.rope_full.theta, 0) << path;
      EXPECT_GT(c.rope_sliding.theta, 0) << path;
      EXPECT_GT(c.attention_scale(), 0) << path;
      ++accepted;
    } catch (const fp8kv::InputError& err) {
      // The message names the file given as source.
      EXPECT_NE(std::string(err.what()).find(path.filename().string()), std::string::npos) << err.what();
      ++refused;
    } catch (const std::exception& err) {
      ADD_FAILURE() << path << ": " << typeid(err).name() << ": " << err.what();
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
  std::printf("fuzz_config corpus: %zu files, %d accepted, %d refused, %d not JSON\n", corpus.size(), accepted, refused,
              not_json);
}

// fuzz_config found (2026-12-01) that a config without rope_scaling took a
// negative rope_theta as it was; the same for Gemma's rope_local_base_freq.
TEST(ConfigFuzzCorpus, NonPositiveRopeThetaIsRefusedWithoutRopeScaling) {
  const fs::path dir = fs::path(FP8KV_SOURCE_DIR) / "tests" / "data" / "fuzz_config";
  for (const auto& [file, field] : {std::pair{"bad_rope_theta_negative.json", "rope_theta"},
                                    std::pair{"bad_rope_local_base_freq_zero.json", "rope_local_base_freq"}}) {
    std::ifstream in(dir / file);
    const nlohmann::json j = nlohmann::json::parse(in);
    try {
      (void)fp8kv::parse_model_config(j, file);
      ADD_FAILURE() << file << " was accepted";
    } catch (const fp8kv::InputError& err) {
      EXPECT_NE(std::string(err.what()).find(field), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find(file), std::string::npos) << err.what();
    }
  }
}
