#include "api/problem_from_c.h"

#include <algorithm>
#include <limits>
#include <string>

#include "compiler/errors.h"

namespace lfce::api {

using runtime::check_problem;
using runtime::kDefaultWorkspaceBudget;
using runtime::Problem;

namespace {

template <typename E>
E checked_enum(int32_t value, int32_t count, const char* field, const char* accepted) {
  if (value < 0 || value >= count)
    throw SpecError(std::string("lfce_problem.") + field + " = " + std::to_string(value) +
                    " is not valid; expected " + accepted);
  return static_cast<E>(value);
}

// A float option: the C struct's 0 or `none` mean none; else a normal float in [lowest, highest].
// NaN fails both comparisons. A positive value below FLT_MIN (subnormal) is refused too: the
// kernels flush it to 0 or divide by it (a softcap's 1 / c is inf there, and its slope NaN).
float checked_option(float value, float none, float lowest, float highest, const char* field, const char* range) {
  if (value == 0.f || value == none) return none;
  if (!(value >= std::max(lowest, std::numeric_limits<float>::min()) && value <= highest))
    throw SpecError(std::string(field) + " must be " + range + ", got " + float_text(value));
  return value;
}

bool checked_flag(int32_t value, const char* field) {
  if (value != 0 && value != 1) throw SpecError(std::string(field) + " must be 0 or 1, got " + std::to_string(value));
  return value == 1;
}

// runtime::check_problem's messages in the C API's names: lfce_problem's fields and constants.
const runtime::ProblemNames& c_names() {
  static const runtime::ProblemNames names = [] {
    runtime::ProblemNames n;
    n.field_prefix = "lfce_problem.";
    n.bias = "has_bias";
    n.class_weight = "has_class_weight";
    n.recompute_mode = "LFCE_MODE_RECOMPUTE";
    n.outputs = "outputs";
    n.drop_outputs = "LFCE_OUTPUT_ENTROPY and LFCE_OUTPUT_LOGPROB from outputs";
    n.lse_gradient = "lfce_backward_args.grad_lse";
    return n;
  }();
  return names;
}

}  // namespace

Problem problem_from_c(const lfce_problem* c) {
  if (!c) throw SpecError("lfce_problem pointer is NULL");
  Problem p;
  p.tokens = c->tokens;
  p.hidden = c->hidden;
  p.vocab = c->vocab;
  p.dtype = checked_enum<DType>(c->dtype, 3, "dtype", "LFCE_DTYPE_BF16, _FP16 or _FP32");
  p.targets = checked_enum<IndexType>(c->target_dtype, 2, "target_dtype", "LFCE_INDEX_INT64 or _INT32");
  p.bias = checked_flag(c->has_bias, "lfce_problem.has_bias");
  p.reduction = checked_enum<Reduction>(c->reduction, 3, "reduction", "LFCE_REDUCTION_MEAN, _SUM or _NONE");
  p.mode = checked_enum<Mode>(c->mode, 2, "mode", "LFCE_MODE_RECOMPUTE or _EAGER");
  // The loss options (runtime/problem_options.def), in the table's order.
#define LFCE_PROBLEM_FLOAT(member, c_field, option, none, lowest, highest, range, help) \
  p.member = checked_option(c->c_field, none, lowest, highest, "lfce_problem." #c_field, range);
#define LFCE_PROBLEM_FLAG(member, c_field, ...) p.member = checked_flag(c->c_field, "lfce_problem." #c_field);
#include "runtime/problem_options.def"
  if (c->outputs < 0 || c->outputs > (LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_LOGPROB | LFCE_OUTPUT_PREDICTED))
    throw SpecError("lfce_problem.outputs = " + std::to_string(c->outputs) +
                    " is not valid; expected a sum of LFCE_OUTPUT_ENTROPY (1), LFCE_OUTPUT_LOGPROB (2) and "
                    "LFCE_OUTPUT_PREDICTED (4)");
  p.entropy = (c->outputs & LFCE_OUTPUT_ENTROPY) != 0;
  p.logprob = (c->outputs & LFCE_OUTPUT_LOGPROB) != 0;
  p.predicted = (c->outputs & LFCE_OUTPUT_PREDICTED) != 0;
  p.ignore_index = c->ignore_index;
  p.chunk_size = c->chunk_size;
  if (c->workspace_budget < 0)
    throw SpecError("lfce_problem.workspace_budget must be >= 1 byte (or 0 for 256 MiB), got " +
                    std::to_string(c->workspace_budget));
  // (Eager mode's 0 means one token chunk for the three-GEMM schedule; Plan reads it as 256 MiB
  // for the vocabulary chunk of the recompute backward.)
  p.workspace_budget = c->workspace_budget || p.mode == Mode::Eager ? c->workspace_budget : kDefaultWorkspaceBudget;
  p.sequence_length = c->sequence_length;
  check_problem(p, c_names());
  return p;
}

}  // namespace lfce::api
