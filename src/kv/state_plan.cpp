#include "kv/state_plan.h"

#include <limits>

#include <fmt/format.h>

#include "io/errors.h"

namespace fp8kv {

namespace {
uint64_t mul(std::string_view what, uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a)
    throw InputError(fmt::format("{} does not fit in 64 bits: {} x {}", what, a, b));
  return a * b;
}
}  // namespace

std::string_view state_dtype_name(StateDtype d) { return d == StateDtype::f32 ? "float32" : "bfloat16"; }

uint64_t StatePlan::conv_bytes_per_layer() const {
  return mul("conv state bytes", mul("conv state elements", static_cast<uint64_t>(conv_dim), conv_width),
             state_dtype_bytes(conv_dtype));
}
uint64_t StatePlan::ssm_bytes_per_layer() const {
  return mul("recurrent state bytes",
             mul("recurrent state elements", static_cast<uint64_t>(num_v_heads) * k_head_dim, v_head_dim),
             state_dtype_bytes(ssm_dtype));
}
uint64_t StatePlan::bytes_per_sequence() const {
  return mul("state bytes per sequence (linear_attention layers x conv + recurrent state)", layers.size(),
             conv_bytes_per_layer() + ssm_bytes_per_layer());
}
uint64_t StatePlan::pool_bytes() const {
  return mul("state pool bytes (--max-num-seqs x state bytes per sequence)", static_cast<uint64_t>(num_slots),
             bytes_per_sequence());
}

uint64_t StatePlan::snapshot_pool_bytes() const {
  return mul("state snapshot pool bytes (snapshot slots x state bytes per sequence)",
             static_cast<uint64_t>(snapshot_slots), bytes_per_sequence());
}

StatePlan plan_state(const ModelConfig& cfg, int max_num_seqs, int tp, StateDtype conv_dtype, StateDtype ssm_dtype) {
  StatePlan p;
  if (!cfg.gdn) return p;
  const GatedDeltaNetConfig& g = *cfg.gdn;
  if (tp <= 0 || g.num_k_heads % tp != 0 || g.num_v_heads % tp != 0)
    throw InputError(fmt::format("--tensor-parallel-size {} does not divide linear_num_key_heads {} and "
                                 "linear_num_value_heads {}",
                                 tp, g.num_k_heads, g.num_v_heads));
  for (int l = 0; l < cfg.num_layers; ++l)
    if (cfg.is_linear(l)) p.layers.push_back(l);
  p.num_slots = max_num_seqs;
  p.num_k_heads = g.num_k_heads / tp;
  p.num_v_heads = g.num_v_heads / tp;
  p.k_head_dim = g.k_head_dim;
  p.v_head_dim = g.v_head_dim;
  p.conv_dim = g.conv_dim() / tp;
  p.conv_width = g.conv_kernel - 1;
  p.conv_dtype = conv_dtype;
  p.ssm_dtype = ssm_dtype;
  (void)p.pool_bytes();  // overflow checks up front
  return p;
}

}  // namespace fp8kv
