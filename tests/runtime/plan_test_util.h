// Problems for the plan tests, built from the C struct as the C API takes them.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "api/problem_from_c.h"
#include "lfce/lfce.h"
#include "runtime/problem.h"
#include "tests/spec_error.h"

namespace lfce::runtime {

using api::problem_from_c;  // the C struct as the C API converts it

inline lfce_problem llama3(int64_t tokens) {
  lfce_problem p{};
  p.tokens = tokens;
  p.hidden = 4096;
  p.vocab = 128256;
  p.dtype = LFCE_DTYPE_BF16;
  p.ignore_index = -100;
  return p;
}

inline Problem problem(const lfce_problem& p) { return problem_from_c(&p); }

inline std::string error_of(const lfce_problem& p) {
  return testing_errors::spec_error([&] { problem_from_c(&p); });
}

// The SpecError of `p` names `text` (EXPECT, with the message on failure).
inline void expect_error_naming(const lfce_problem& p, const std::string& text) {
  const std::string message = error_of(p);
  EXPECT_NE(message.find(text), std::string::npos) << message;
}

}  // namespace lfce::runtime
