// Argument checks both backends' ops share (backend/cpu/op_checks.h and
// backend/cuda/backend_checks.h wrap them with their class name): errors name
// the backend, the op and the tensor with its shape.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/tensor.h"
#include "io/errors.h"
#include "kv/state_plan.h"

namespace fp8kv::op_checks {

// std::invalid_argument "BACKEND::OP: WHAT".
[[noreturn]] inline void bad(const char* backend, const char* op, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}::{}: {}", backend, op, what));
}

// "[rows][cols] dtype", for messages.
inline std::string shape(const Tensor& t) {
  return fmt::format("[{}][{}] {}", t.rows, t.cols, scalar_type_name(t.dtype));
}

// The recurrent-state pool of a backend that keeps float32 states
// (allocate_state): InputError naming the backend ("the CPU backend") for
// another state dtype; per layer its index in plan.layers, -1 without state.
inline std::vector<int> f32_state_layer_index(const StatePlan& plan, int num_layers, const char* backend) {
  if (!plan.empty() && plan.ssm_dtype != StateDtype::f32)
    throw InputError(fmt::format("{} keeps the recurrent state in float32 (got {})", backend,
                                 state_dtype_name(plan.ssm_dtype)));
  std::vector<int> index(static_cast<size_t>(num_layers), -1);
  for (size_t i = 0; i < plan.layers.size(); ++i) index.at(plan.layers[i]) = static_cast<int>(i);
  return index;
}

// copy_state_slot's slots, both in the pool (invalid_argument otherwise).
inline void check_state_slots(const StatePlan& plan, int src, int dst, const char* backend) {
  if (src < 0 || dst < 0 || src >= plan.total_slots() || dst >= plan.total_slots())
    bad(backend, "copy_state_slot",
        fmt::format("slots {} -> {} outside the pool of {} slots", src, dst, plan.total_slots()));
}

}  // namespace fp8kv::op_checks
