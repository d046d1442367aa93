// For misuse tests: the message of the SpecError (or OutOfResources) a call throws, so a test can
// check that it names the bad value (or the resource and its numbers).
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

// What `f` throws as an OutOfResources: "<resource>: <required> over <limit>: <message>", or
// "no error" when it returns.
template <typename F>
std::string resource_error(F&& f) {
  try {
    f();
  } catch (const OutOfResources& e) {
    return e.resource() + ": " + std::to_string(e.required()) + " over " + std::to_string(e.limit()) + ": " + e.what();
  }
  return "no error";
}

}  // namespace lfce::testing_errors
