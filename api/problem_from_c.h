// The C API's problem (lfce_problem, include/lfce/lfce.h) as the runtime's Problem: the one place
// that reads the C struct, so the runtime below speaks its own types only.
#pragma once

#include "lfce/lfce.h"
#include "runtime/problem.h"

namespace lfce::api {

// Converts and validates the C struct; throws SpecError naming the first bad field as
// lfce_problem.<field>. Runs runtime::check_problem on the result, its messages in the C struct's names.
runtime::Problem problem_from_c(const lfce_problem* problem);

}  // namespace lfce::api
