#include "runtime/problem.h"

#include <limits>
#include <string>
#include <utility>

#include "compiler/errors.h"

namespace lfce::runtime {
namespace {

template <typename E>
E checked_enum(int32_t value, int32_t count, const char* field, const char* accepted) {
  if (value < 0 || value >= count)
    throw SpecError(std::string("lfce_problem.") + field + " = " + std::to_string(value) +
                    " is not valid; expected " + accepted);
  return static_cast<E>(value);
}

}  // namespace

std::string problem_text(const Problem& p) {
  return std::to_string(p.tokens) + "," + std::to_string(p.hidden) + "," + std::to_string(p.vocab) + "," +
         std::string(dtype_name(p.dtype)) + "," + (p.targets == IndexType::I64 ? "i64" : "i32") + "," +
         (p.bias ? "bias" : "nobias") + "," + std::string(reduction_name(p.reduction)) + "," +
         std::string(mode_name(p.mode)) + "," + std::to_string(p.ignore_index) + "," + std::to_string(p.chunk_size) +
         "," + std::to_string(p.workspace_budget) + ",softcap=" + float_text(p.softcap) +
         ",temperature=" + float_text(p.temperature) + ",z_loss_scale=" + float_text(p.z_loss_scale) +
         ",label_smoothing=" + float_text(p.label_smoothing) + ",class_weight=" + (p.class_weight ? "1" : "0") +
         ",accumulate=" + (p.accumulate_grad_weight ? "w" : "") + (p.accumulate_grad_bias ? "b" : "") +
         ",token_scaling=" + (p.token_scaling ? "1" : "0") + ",outputs=" + (p.entropy ? "e" : "") +
         (p.logprob ? "l" : "") + (p.predicted ? "p" : "") + ",lse_grad=" + (p.lse_grad ? "1" : "0") +
         ",sequence_length=" + std::to_string(p.sequence_length);
}

int lse_rows(const Problem& p) { return 1 + p.token_scaling + p.entropy + p.logprob; }

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

void check_problem(const Problem& p) {
  auto bounded = [](int64_t value, const char* field, int64_t limit, const char* limit_text) {
    if (value < 1)
      throw SpecError(std::string("lfce_problem.") + field + " must be >= 1, got " + std::to_string(value));
    if (value > limit)
      throw SpecError(std::string("lfce_problem.") + field + " = " + std::to_string(value) + " exceeds " +
                      std::to_string(limit) + " (" + limit_text + "), the largest lfce accepts");
  };
  bounded(p.tokens, "tokens", kMaxTokens, "2^31 - 1");
  bounded(p.hidden, "hidden", kMaxHidden, "2^20");
  bounded(p.vocab, "vocab", kMaxVocab, "2^31 - 1");
  if (p.chunk_size < 0)
    throw SpecError("lfce_problem.chunk_size must be >= 1 (or 0 for automatic), got " + std::to_string(p.chunk_size));
  if (p.chunk_size > kMaxChunk)
    throw SpecError("lfce_problem.chunk_size = " + std::to_string(p.chunk_size) + " exceeds " +
                    std::to_string(kMaxChunk) + " (2^20), the largest lfce accepts");
  if (p.workspace_budget < 0)
    throw SpecError("lfce_problem.workspace_budget must be >= 0, got " + std::to_string(p.workspace_budget));
  if (p.sequence_length < 0 || p.sequence_length > p.tokens || (p.sequence_length > 0 && p.tokens % p.sequence_length))
    throw SpecError("lfce_problem.sequence_length = " + std::to_string(p.sequence_length) +
                    " must be 0 (no shift) or a length T >= 1 of which tokens = " + std::to_string(p.tokens) +
                    " is a multiple (sequences of T tokens)");
  // fp16 dz is scaled to |g·scale| < 2^15 (template_util.h, dz_scale); the temperature multiplies
  // dz by up to 1 / T, so T <= 0.5 could reach fp16's largest finite value, 65504.
  if (p.dtype == DType::FP16 && p.temperature <= 0.5f)
    throw SpecError("lfce_problem.temperature = " + float_text(p.temperature) +
                    " with fp16: dz (up to 1 / T times its bound) could overflow fp16; use T > 0.5, bf16 or fp32");
  // Eager mode computes the gradients in the forward, scaled later by the upstream gradient:
  // nothing can be added to a buffer before that scale is known.
  for (auto [on, field] : {std::pair{p.accumulate_grad_weight, "accumulate_grad_weight"},
                           std::pair{p.accumulate_grad_bias, "accumulate_grad_bias"}})
    if (on && p.mode == Mode::Eager)
      throw SpecError(std::string("lfce_problem.") + field +
                      " = 1 needs mode LFCE_MODE_RECOMPUTE (eager mode computes the gradients before the upstream "
                      "gradient is known)");
  if (p.accumulate_grad_bias && !p.bias)
    throw SpecError("lfce_problem.accumulate_grad_bias = 1 needs has_bias = 1 (there is no bias gradient)");
  // fp16 dz is scaled to |g·scale| < 2^15 assuming |p − onehot| <= 1; the z-loss multiplies p by
  // 1 + 2·s·LSE, which the data bound, not the problem (LSE ≈ 40 at s = 0.05 overflows to inf).
  if (p.dtype == DType::FP16 && p.z_loss_scale != 0.f)
    throw SpecError("lfce_problem.z_loss_scale = " + float_text(p.z_loss_scale) +
                    " with fp16 is not supported: dz's fp16 scaling assumes |p - onehot| <= 1, and the z-loss "
                    "multiplies p by 1 + 2 * z_loss_scale * LSE, unbounded (dz could overflow fp16 to inf); use bf16 "
                    "or fp32, or z_loss_scale = 0");
  // The entropy and logprob outputs are there to be differentiated (lfce_backward_args.grad_lse),
  // which has no fp16 path: refused here, before any of the problem's kernels is compiled.
  if (p.dtype == DType::FP16 && (p.entropy || p.logprob))
    throw SpecError(std::string("lfce_problem.outputs asks for the ") + (p.entropy ? "entropy" : "logprob") +
                    " with fp16, whose gradient (lfce_backward_args.grad_lse) has no fp16 path; use bf16 or fp32, or "
                    "drop LFCE_OUTPUT_ENTROPY and LFCE_OUTPUT_LOGPROB from outputs");
  // fp16 dz is scaled by the unweighted g; a class weight w_y multiplies it, unbounded.
  if (p.dtype == DType::FP16 && p.class_weight)
    throw SpecError("lfce_problem.has_class_weight = 1 with fp16 is not supported: dz's fp16 scaling assumes "
                    "unweighted tokens (a class weight could overflow fp16); use bf16 or fp32");
}

KernelSpec problem_spec(KernelKind kind, const Problem& p, Arch arch) {
  KernelSpec s;
  s.kind = kind;
  s.vocab = p.vocab;
  s.hidden = p.hidden;
  s.mode = p.mode;
  s.dtype = p.dtype;
  s.targets = p.targets;
  s.reduction = p.reduction;
  s.bias = p.bias;
  s.arch = arch;
  // Each kernel gets only the options its code reads (KernelSpec::fields_read, which depends on
  // the options themselves: lse_forward reads the class weights only with label smoothing).
  s.label_smoothing = p.label_smoothing;
  s.class_weight = p.class_weight;
  s.z_loss_scale = p.z_loss_scale;  // (loss_reduce's reads depend on it; cleared below where unread)
  const uint32_t reads = s.fields_read();
  if (reads & kFieldSoftcap) s.softcap = p.softcap;
  if (reads & kFieldTemperature) s.temperature = p.temperature;
  if (!(reads & kFieldZLoss)) s.z_loss_scale = 0.f;
  s.token_scaling = p.token_scaling && (reads & kFieldTokenScaling);
  s.lse_grad = p.lse_grad && (reads & kFieldLseGrad);
  s.shift = p.sequence_length > 0 && (reads & kFieldShift);
  // (dlogits_backward reads the entropy and logprob flags only with lse_grad: after it.)
  const uint32_t output_reads = s.fields_read();
  s.entropy = p.entropy && (output_reads & kFieldEntropy);
  s.logprob = p.logprob && (output_reads & kFieldLogprob);
  s.argmax = p.predicted && (output_reads & kFieldArgmax);
  if (!(reads & kFieldLabelSmoothing)) s.label_smoothing = 0.f;
  if (!(reads & kFieldClassWeight)) s.class_weight = false;
  // One flag in the spec, each gradient kernel its own from the problem.
  s.accumulate = (kind == KernelKind::GradWeight && p.accumulate_grad_weight) ||
                 (kind == KernelKind::GradBias && p.accumulate_grad_bias);
  return s;
}

}  // namespace lfce::runtime
