// FP8KV_PROFILE: the one profiling switch (docs/design.md "No switches in
// src"), read here and nowhere else. Profiles print to stderr; none changes
// what a kernel computes.
//
//   unset, "" or "0"   off
//   "1" or "all"       every part below, with its default
//   a comma list of    step[=N]      per replayed decode step: graph, sample
//                                    tail and idle times; and one eager,
//                                    op-timed copy of the N-th replayed step
//                                    (default 20)
//                      prefill[=R]   per-op event times of steps with a
//                                    prefill part and at least R rows
//                                    (default 64)
//                      startup       one dated line per startup phase
// e.g. FP8KV_PROFILE=step=5,startup. A bad value throws InputError naming it.
#pragma once
#include <string_view>

namespace fp8kv {

struct ProfileConfig {
  bool step = false;
  int step_op_step = 20;  // the replayed decode step that gets the op-timed eager copy
  bool prefill = false;
  int prefill_min_rows = 64;
  bool startup = false;
  bool operator==(const ProfileConfig&) const = default;
};

// Parses an FP8KV_PROFILE value (the grammar above).
ProfileConfig parse_profile_config(std::string_view spec);

// FP8KV_PROFILE, parsed on first use (or the value set for a test).
ProfileConfig profile_config();

// For tests: replaces profile_config() until the next call. Objects that
// read it at construction (CudaBackend) see the new value when made after it.
void set_profile_config_for_testing(const ProfileConfig& c);

}  // namespace fp8kv
