#include "runtime/argument_checks.h"

#include <cstdint>
#include <string>

#include "compiler/errors.h"

namespace lfce::runtime {
namespace {

void require(const void* ptr, const char* name) {
  if (!ptr) throw SpecError(std::string(name) + " is NULL");
}

void require_aligned(const void* ptr, const char* name, int bytes = 16) {
  require(ptr, name);
  if (reinterpret_cast<uintptr_t>(ptr) % bytes != 0)
    throw SpecError(std::string(name) + " is not " + std::to_string(bytes) +
                    "-byte aligned; pass a contiguous tensor that starts on " + std::to_string(bytes) + " bytes");
}

// hidden and weight: the GEMMs copy their rows in hidden_row_align(H) pieces (16 bytes unless
// H·elem bytes is not a multiple of 16), from the base on.
void require_rows_aligned(const Problem& problem, const void* ptr, const char* name) {
  require_aligned(ptr, name, hidden_row_align(problem.hidden, problem.dtype));
}

// A [*, H] gradient the GEMM epilogues write (grad_hidden, grad_weight): element by element on
// mma.sync tiles, in pairs of elements straight from the registers on wgmma tiles (store_pair in
// templates/template_util.h), which only rows of H a multiple of 16 bytes take (hidden_row_align).
int gradient_align(const Problem& problem, int element_bytes) {
  return hidden_row_align(problem.hidden, problem.dtype) == 16 ? 2 * element_bytes : element_bytes;
}

// fp32 arrays (lse, token_loss, loss, valid_count, grad_loss) are read and written one float at a time.
void require_f32(const void* ptr, const char* name) { require_aligned(ptr, name, 4); }

}  // namespace

// The per-token ids, read one at a time in their index type.
int target_bytes(const Problem& problem) { return problem.targets == IndexType::I64 ? 8 : 4; }

void require_workspace(void* workspace, size_t given, size_t needed, const char* call) {
  if (given < needed)
    throw SpecError(std::string(call) + ": workspace_bytes = " + std::to_string(given) + " is below the " +
                    std::to_string(needed) + " bytes this problem needs");
  if (needed > 0) require_aligned(workspace, "workspace");
}

namespace {

// The inputs forward and backward share (ForwardArgs and BackwardArgs name them alike).
template <typename Args>
void check_shared_inputs(const Problem& problem, const Args& a) {
  require_rows_aligned(problem, a.hidden, "hidden");
  require_rows_aligned(problem, a.weight, "weight");
  if (problem.bias) require_aligned(a.bias, "bias", dtype_bytes(problem.dtype));
  require_aligned(a.targets, "targets", target_bytes(problem));
  require_f32(a.lse, "lse");
  require_f32(a.valid_count, "valid_count");
  if (problem.class_weight) require_aligned(a.class_weight, "class_weight (the problem has class weights)", 4);
}

}  // namespace

// The forward's arguments (lfce_forward and lfce_forward_backward), each named where it is wrong.
void check_forward_args(const Problem& problem, const ForwardArgs& a) {
  check_shared_inputs(problem, a);
  require_f32(a.token_loss, "token_loss");
  if (problem.reduction != Reduction::None || a.loss) require_f32(a.loss, "loss");
  if (problem.predicted) require_aligned(a.predicted, "predicted (the problem asks for the predicted ids)", 8);
}

// The backward's arguments (lfce_backward), each named where it is wrong.
void check_backward_args(const Problem& problem, const BackwardArgs& a) {
  check_shared_inputs(problem, a);
  if (problem.mode == Mode::Recompute) require(a.grad_loss, "grad_loss (recompute mode needs the upstream gradient)");
  if (a.grad_loss) require_f32(a.grad_loss, "grad_loss");
  if (a.grad_lse && problem.dtype == DType::FP16)
    throw SpecError(
        "grad_lse (the gradients of the lse rows) needs bf16 or fp32 inputs, got fp16: its dz is not "
        "scaled into fp16's range");
  if (a.grad_lse) require_aligned(a.grad_lse, "grad_lse", 4);
  if (a.grad_lse && !problem.lse_grad) throw InternalError("grad_lse given for a problem planned without it");
  const bool want_hidden = a.grad_hidden != nullptr;
  const bool want_weight = a.grad_weight != nullptr;
  const bool want_bias = problem.bias && a.grad_bias != nullptr;
  // grad_input writes (and for fp32 accumulates in) grad_hidden, in pairs on wgmma tiles.
  if (want_hidden) require_aligned(a.grad_hidden, "grad_hidden", gradient_align(problem, dtype_bytes(problem.dtype)));
  // Written in dtype, or added into as fp32 (grad_weight in pairs) with accumulation; grad_bias
  // one element at a time.
  if (want_weight)
    require_aligned(a.grad_weight, problem.accumulate_grad_weight ? "grad_weight (accumulated, fp32)" : "grad_weight",
                    problem.accumulate_grad_weight ? 8 : gradient_align(problem, dtype_bytes(problem.dtype)));
  if (want_bias)
    require_aligned(a.grad_bias, problem.accumulate_grad_bias ? "grad_bias (accumulated, fp32)" : "grad_bias",
                    problem.accumulate_grad_bias ? 4 : dtype_bytes(problem.dtype));
}

void check_forward_backward_args(const Problem& problem, const ForwardBackwardArgs& args) {
  if (problem.mode != Mode::Eager)
    throw SpecError(
        "forward_backward needs mode eager (it computes the gradients for an upstream gradient of 1), got "
        "recompute");
  const ForwardArgs& a = args.forward;
  check_forward_args(problem, a);
  if (args.grad_hidden)
    require_aligned(args.grad_hidden, "grad_hidden", gradient_align(problem, dtype_bytes(problem.dtype)));
  if (args.grad_weight)
    require_aligned(args.grad_weight, "grad_weight", gradient_align(problem, dtype_bytes(problem.dtype)));
  if (problem.bias && args.grad_bias) require_aligned(args.grad_bias, "grad_bias", dtype_bytes(problem.dtype));
  // The workspace's size does not depend on the tuning or the device (eager_workspace_bytes):
  // checked before the driver is touched.
  require_workspace(a.workspace, a.workspace_bytes, eager_workspace_bytes(problem), "lfce_forward_backward");
}

void check_scale_gradient_args(const void* src, const void* dst, int64_t count, const float* scale) {
  if (count < 0) throw SpecError("count must be >= 0, got " + std::to_string(count));
  require_aligned(src, "src");
  require_aligned(dst, "dst");
  require_aligned(scale, "scale", 4);
}

}  // namespace lfce::runtime
