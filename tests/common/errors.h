// The message of the InputError (bad input: exit 2) that a call throws, for
// tests that check what the user is told.
#pragma once
#include <string>
#include <utility>

#include "io/errors.h"

namespace fp8kv::test_util {

// f()'s InputError message, or "(no error)" when f returns (so a substring
// check fails and shows it); any other exception propagates.
template <class F>
std::string input_error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace fp8kv::test_util
