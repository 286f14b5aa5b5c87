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

// Per model layer, its index in plan.layers (the layers with a state in
// the pool), -1 for a layer without one.
inline std::vector<int> state_layer_index(const StatePlan& plan, int num_layers) {
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

// gated_delta_net's checks both backends make: the layer's index among the
// state layers (state_index from state_layer_index; invalid_argument
// when it has none) ...
inline int gdn_state_layer(const char* backend, const std::vector<int>& state_index, int layer) {
  if (layer < 0 || layer >= static_cast<int>(state_index.size()) || state_index[layer] < 0)
    bad(backend, "gated_delta_net",
        fmt::format("layer {} has no state (not a linear_attention layer, or allocate_kv not called)", layer));
  return state_index[layer];
}

// invalid_argument "NAME is [r][c] dtype, expected [rows][cols]" unless t
// has that shape.
inline void expect_shape(const char* backend, const char* op, const char* name, const Tensor& t, int64_t rows,
                         int64_t cols) {
  if (t.rows != rows || t.cols != cols)
    bad(backend, op, fmt::format("{} is {}, expected [{}][{}]", name, shape(t), rows, cols));
}

// ... and the shapes for T rows: qkv [T][C], z and out [T][VD], b and a
// [T][Hv], conv1d [C][K].
inline void check_gdn_shapes(const char* backend, int64_t T, int64_t C, int64_t Hv, int64_t VD, int64_t K,
                             const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a, const Tensor& out,
                             const Tensor& conv1d) {
  const char* op = "gated_delta_net";
  expect_shape(backend, op, "qkv", qkv, T, C);
  expect_shape(backend, op, "z", z, T, VD);
  expect_shape(backend, op, "b", b, T, Hv);
  expect_shape(backend, op, "a", a, T, Hv);
  expect_shape(backend, op, "out", out, T, VD);
  expect_shape(backend, op, "conv1d", conv1d, C, K);
}

// The state pool of a backend that keeps one conv and one SSM state buffer
// per state layer, each holding every slot: the buffers from alloc(bytes).
template <class Alloc>
void allocate_state_rows(const StatePlan& plan, std::vector<DeviceBuffer>& conv, std::vector<DeviceBuffer>& ssm,
                         Alloc&& alloc) {
  conv.clear();
  ssm.clear();
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    conv.push_back(alloc(plan.total_slots() * plan.conv_bytes_per_layer()));
    ssm.push_back(alloc(plan.total_slots() * plan.ssm_bytes_per_layer()));
  }
}

// copy_state_slot of a backend that keeps one conv and one SSM state buffer
// per state layer: the slots checked, then copy(to, from, bytes) for every
// layer's conv and SSM rows of slot src onto slot dst (nothing when equal).
template <class Copy>
void copy_state_slot_rows(const StatePlan& plan, const std::vector<DeviceBuffer>& conv,
                          const std::vector<DeviceBuffer>& ssm, int src, int dst, const char* backend, Copy&& copy) {
  check_state_slots(plan, src, dst, backend);
  if (src == dst) return;
  const uint64_t cb = plan.conv_bytes_per_layer(), sb = plan.ssm_bytes_per_layer();
  for (size_t i = 0; i < conv.size(); ++i) {
    char* c = static_cast<char*>(conv[i].data());
    char* r = static_cast<char*>(ssm[i].data());
    copy(c + dst * cb, c + src * cb, cb);
    copy(r + dst * sb, r + src * sb, sb);
  }
}

}  // namespace fp8kv::op_checks
