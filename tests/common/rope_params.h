// The scaled RoPE parameters the RoPE tests cover (model/config.h
// RopeParams): Llama 3.1's llama3 scaling and a factor-4 yarn.
#pragma once
#include "model/config.h"

namespace fp8kv::test_util {

// type llama3 at theta 500000: factor 8, low_freq_factor 1, high_freq_factor 4.
inline RopeParams llama3_rope(int original_max_position_embeddings) {
  return {.type = "llama3",
          .theta = 500000.0,
          .factor = 8.0,
          .low_freq_factor = 1.0,
          .high_freq_factor = 4.0,
          .original_max_position_embeddings = original_max_position_embeddings};
}

// type yarn, factor 4.
inline RopeParams yarn_rope(double theta, int original_max_position_embeddings) {
  return {.type = "yarn", .theta = theta, .factor = 4.0, .original_max_position_embeddings = original_max_position_embeddings};
}

}  // namespace fp8kv::test_util
