#include "api/problem_from_c.h"

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

}  // namespace

Problem problem_from_c(const lfce_problem* c) {
  if (!c) throw SpecError("lfce_problem pointer is NULL");
  Problem p;
  p.tokens = c->tokens;
  p.hidden = c->hidden;
  p.vocab = c->vocab;
  p.dtype = checked_enum<DType>(c->dtype, 3, "dtype", "LFCE_DTYPE_BF16, _FP16 or _FP32");
  p.targets = checked_enum<IndexType>(c->target_dtype, 2, "target_dtype", "LFCE_INDEX_INT64 or _INT32");
  if (c->has_bias != 0 && c->has_bias != 1)
    throw SpecError("lfce_problem.has_bias must be 0 or 1, got " + std::to_string(c->has_bias));
  p.bias = c->has_bias == 1;
  p.reduction = checked_enum<Reduction>(c->reduction, 3, "reduction", "LFCE_REDUCTION_MEAN, _SUM or _NONE");
  p.mode = checked_enum<Mode>(c->mode, 2, "mode", "LFCE_MODE_RECOMPUTE or _EAGER");
  // NaN fails both comparisons. A positive value below FLT_MIN (subnormal) is refused too: the
  // kernels flush it to 0 or divide by it (a softcap's 1 / c is inf there, and its slope NaN).
  auto normal_or_zero = [](float value, float hi) {
    return value == 0.f || (value >= std::numeric_limits<float>::min() && value <= hi);
  };
  if (!normal_or_zero(c->softcap, KernelSpec::kMaxSoftcap))
    throw SpecError("lfce_problem.softcap must be 0 (none) or a positive cap in [" +
                    float_text(std::numeric_limits<float>::min()) + ", 1e6], got " + float_text(c->softcap));
  p.softcap = c->softcap;
  // 0 is a zero-initialised struct's temperature: none, as 1.
  const float t = c->temperature == 0.f ? 1.f : c->temperature;
  if (!(t >= KernelSpec::kMinTemperature && t <= KernelSpec::kMaxTemperature))
    throw SpecError("lfce_problem.temperature must be 0 or 1 (none) or a temperature in [1e-6, 1e6], got " +
                    float_text(c->temperature));
  p.temperature = t;
  if (!normal_or_zero(c->z_loss_scale, KernelSpec::kMaxZLossScale))
    throw SpecError("lfce_problem.z_loss_scale must be 0 (none) or a positive scale in [" +
                    float_text(std::numeric_limits<float>::min()) + ", 1e6], got " + float_text(c->z_loss_scale));
  p.z_loss_scale = c->z_loss_scale;
  if (!normal_or_zero(c->label_smoothing, 1.f))
    throw SpecError("lfce_problem.label_smoothing must be 0 (none) or in [" +
                    float_text(std::numeric_limits<float>::min()) + ", 1], got " + float_text(c->label_smoothing));
  p.label_smoothing = c->label_smoothing;
  if (c->has_class_weight != 0 && c->has_class_weight != 1)
    throw SpecError("lfce_problem.has_class_weight must be 0 or 1, got " + std::to_string(c->has_class_weight));
  p.class_weight = c->has_class_weight == 1;
  auto flag = [](int32_t value, const char* field) {
    if (value != 0 && value != 1)
      throw SpecError(std::string("lfce_problem.") + field + " must be 0 or 1, got " + std::to_string(value));
    return value == 1;
  };
  p.accumulate_grad_weight = flag(c->accumulate_grad_weight, "accumulate_grad_weight");
  p.accumulate_grad_bias = flag(c->accumulate_grad_bias, "accumulate_grad_bias");
  p.token_scaling = flag(c->token_scaling, "token_scaling");
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
  check_problem(p);
  return p;
}

}  // namespace lfce::api
