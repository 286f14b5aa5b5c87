// compressed-tensors' "re:" ignore entries (model/quant_config): Python's
// re.match semantics (anchored at the start, not at the end), run by PCRE2; a
// pattern that does not compile is refused at parse time, naming it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../common/errors.h"
#include "io/errors.h"
#include "model/quant_config.h"

namespace fp8kv {
namespace {

using ::testing::HasSubstr;

nlohmann::json ct_config(const nlohmann::json& ignore) {
  return {{"quantization_config",
           {{"quant_method", "compressed-tensors"},
            {"format", "float-quantized"},
            {"config_groups",
             {{"group_0",
               {{"targets", {"Linear"}},
                {"weights", {{"num_bits", 8}, {"type", "float"}, {"strategy", "channel"}}},
                {"input_activations", {{"num_bits", 8}, {"type", "float"}, {"dynamic", true}}}}}}},
            {"ignore", ignore}}}};
}

TEST(QuantConfigIgnore, RegexEntriesMatchFromTheStartLikePythonReMatch) {
  const auto q = parse_weight_quant_config(ct_config({"lm_head", "re:.*mlp\\.gate_proj$", "re:model\\.layers\\.1\\."}),
                                           "config.json");
  ASSERT_TRUE(q.quantized());
  EXPECT_TRUE(q.is_excluded("lm_head"));
  EXPECT_FALSE(q.is_excluded("lm_head_extra"));  // plain entries: the exact name
  EXPECT_TRUE(q.is_excluded("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(q.is_excluded("model.layers.0.mlp.gate_proj_x"));  // $ anchors the end
  EXPECT_TRUE(q.is_excluded("model.layers.1.self_attn.q_proj"));  // a prefix match is enough
  EXPECT_FALSE(q.is_excluded("model.layers.11.self_attn.q_proj"));
  EXPECT_FALSE(q.is_excluded("x.model.layers.1.self_attn.q_proj"));  // anchored at the start
}

TEST(QuantConfigIgnore, InvalidRegexIsRefusedNamingIt) {
  EXPECT_THAT(
      test_util::input_error_of([&] { parse_weight_quant_config(ct_config({"re:model.layers.(0"}), "config.json"); }),
              HasSubstr("quantization_config.ignore: 're:model.layers.(0' is not a valid regular expression"));
}

}  // namespace
}  // namespace fp8kv
