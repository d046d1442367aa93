#include "runtime/problem.h"

#include <limits>
#include <string>
#include <utility>

#include "compiler/errors.h"

namespace lfce::runtime {

std::string problem_text(const Problem& p) {
  std::string text = std::to_string(p.tokens) + "," + std::to_string(p.hidden) + "," + std::to_string(p.vocab) + "," +
                     std::string(dtype_name(p.dtype)) + "," + (p.targets == IndexType::I64 ? "i64" : "i32") + "," +
                     (p.bias ? "bias" : "nobias") + "," + std::string(reduction_name(p.reduction)) + "," +
                     std::string(mode_name(p.mode)) + "," + std::to_string(p.ignore_index) + "," +
                     std::to_string(p.chunk_size) + "," + std::to_string(p.workspace_budget);
#define LFCE_PROBLEM_FLOAT(member, ...) text += "," #member "=" + float_text(p.member);
#define LFCE_PROBLEM_FLAG(member, ...) text += p.member ? "," #member "=1" : "," #member "=0";
#include "runtime/problem_options.def"
  return text + ",outputs=" + (p.entropy ? "e" : "") + (p.logprob ? "l" : "") + (p.predicted ? "p" : "") +
         ",lse_grad=" + (p.lse_grad ? "1" : "0") + ",sequence_length=" + std::to_string(p.sequence_length);
}

int lse_rows(const Problem& p) { return 1 + p.token_scaling + p.entropy + p.logprob; }

void check_problem(const Problem& p, const ProblemNames& names) {
  const std::string& prefix = names.field_prefix;
  auto bounded = [&](int64_t value, const char* field, int64_t limit, const char* limit_text) {
    if (value < 1) throw SpecError(prefix + field + " must be >= 1, got " + std::to_string(value));
    if (value > limit)
      throw SpecError(prefix + field + " = " + std::to_string(value) + " exceeds " + std::to_string(limit) + " (" +
                      limit_text + "), the largest lfce accepts");
  };
  bounded(p.tokens, "tokens", kMaxTokens, "2^31 - 1");
  bounded(p.hidden, "hidden", kMaxHidden, "2^20");
  bounded(p.vocab, "vocab", kMaxVocab, "2^31 - 1");
  if (p.chunk_size < 0)
    throw SpecError(prefix + "chunk_size must be >= 1 (or 0 for automatic), got " + std::to_string(p.chunk_size));
  if (p.chunk_size > kMaxChunk)
    throw SpecError(prefix + "chunk_size = " + std::to_string(p.chunk_size) + " exceeds " + std::to_string(kMaxChunk) +
                    " (2^20), the largest lfce accepts");
  if (p.workspace_budget < 0)
    throw SpecError(prefix + "workspace_budget must be >= 0, got " + std::to_string(p.workspace_budget));
  if (p.sequence_length < 0 || p.sequence_length > p.tokens || (p.sequence_length > 0 && p.tokens % p.sequence_length))
    throw SpecError(prefix + "sequence_length = " + std::to_string(p.sequence_length) +
                    " must be 0 (no shift) or a length T >= 1 of which tokens = " + std::to_string(p.tokens) +
                    " is a multiple (sequences of T tokens)");
  // fp16 dz is scaled to |g·scale| < 2^15 (template_util.h, dz_scale); the temperature multiplies
  // dz by up to 1 / T, so T <= 0.5 could reach fp16's largest finite value, 65504.
  if (p.dtype == DType::FP16 && p.temperature <= 0.5f)
    throw SpecError(prefix + "temperature = " + float_text(p.temperature) +
                    " with fp16: dz (up to 1 / T times its bound) could overflow fp16; use T > 0.5, bf16 or fp32");
  // Eager mode computes the gradients in the forward, scaled later by the upstream gradient:
  // nothing can be added to a buffer before that scale is known.
  for (auto [on, field] : {std::pair{p.accumulate_grad_weight, "accumulate_grad_weight"},
                           std::pair{p.accumulate_grad_bias, "accumulate_grad_bias"}})
    if (on && p.mode == Mode::Eager)
      throw SpecError(prefix + field + " = 1 needs mode " + names.recompute_mode +
                      " (eager mode computes the gradients before the upstream gradient is known)");
  if (p.accumulate_grad_bias && !p.bias)
    throw SpecError(prefix + "accumulate_grad_bias = 1 needs " + names.bias + " = 1 (there is no bias gradient)");
  // fp16 dz is scaled to |g·scale| < 2^15 assuming |p − onehot| <= 1; the z-loss multiplies p by
  // 1 + 2·s·LSE, which the data bound, not the problem (LSE ≈ 40 at s = 0.05 overflows to inf).
  if (p.dtype == DType::FP16 && p.z_loss_scale != 0.f)
    throw SpecError(prefix + "z_loss_scale = " + float_text(p.z_loss_scale) +
                    " with fp16 is not supported: dz's fp16 scaling assumes |p - onehot| <= 1, and the z-loss "
                    "multiplies p by 1 + 2 * z_loss_scale * LSE, unbounded (dz could overflow fp16 to inf); use bf16 "
                    "or fp32, or z_loss_scale = 0");
  // The entropy and logprob outputs are there to be differentiated (through the lse rows), which
  // has no fp16 path: refused here, before any of the problem's kernels is compiled.
  if (p.dtype == DType::FP16 && (p.entropy || p.logprob))
    throw SpecError(prefix + names.outputs + " asks for the " + (p.entropy ? "entropy" : "logprob") +
                    " with fp16, whose gradient (" + names.lse_gradient +
                    ") has no fp16 path; use bf16 or fp32, or "
                    "drop " +
                    names.drop_outputs);
  // fp16 dz is scaled by the unweighted g; a class weight w_y multiplies it, unbounded.
  if (p.dtype == DType::FP16 && p.class_weight)
    throw SpecError(prefix + names.class_weight +
                    " = 1 with fp16 is not supported: dz's fp16 scaling assumes unweighted tokens (a class weight "
                    "could overflow fp16); use bf16 or fp32");
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
  // Every option, then each kernel keeps only those its code reads (KernelSpec::fields_read, which
  // depends on the options themselves: lse_forward reads the class weights only with label smoothing).
#define LFCE_PROBLEM_FLOAT(member, ...) s.member = p.member;
#define LFCE_PROBLEM_FLAG(member, c_field, option, spec_member, help) \
  if (bool KernelSpec::*flag = spec_member) s.*flag = p.member;
#include "runtime/problem_options.def"
  s.lse_grad = p.lse_grad;
  s.shift = p.sequence_length > 0;
  s.entropy = p.entropy;
  s.logprob = p.logprob;
  s.argmax = p.predicted;
  // One flag in the spec, each gradient kernel its own from the problem.
  s.accumulate = (kind == KernelKind::GradWeight && p.accumulate_grad_weight) ||
                 (kind == KernelKind::GradBias && p.accumulate_grad_bias);
  return s.read_options_only();
}

}  // namespace lfce::runtime
