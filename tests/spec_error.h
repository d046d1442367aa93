// For misuse tests: the message of the SpecError a call throws, so a test can check that it
// names the bad value.
#pragma once

#include <string>

#include "compiler/errors.h"

namespace lfce::testing_errors {

// What `f` throws as a SpecError, or "no error" when it returns.
template <typename F>
std::string spec_error(F&& f) {
  try {
    f();
  } catch (const SpecError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace lfce::testing_errors
