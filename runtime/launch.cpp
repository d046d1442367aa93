#include "runtime/launch.h"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>

#include "compiler/errors.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"

namespace lfce::runtime {
namespace {

void require(const void* ptr, const char* name) {
  if (!ptr) throw SpecError(std::string(name) + " is NULL");
}

void require_aligned(const void* ptr, const char* name) {
  require(ptr, name);
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
    throw SpecError(std::string(name) + " is not 16-byte aligned; pass a contiguous tensor that starts on 16 bytes");
}

void require_workspace(void* workspace, size_t given, size_t needed, const char* call) {
  if (given < needed)
    throw SpecError(std::string(call) + ": workspace_bytes = " + std::to_string(given) + " is below the " +
                    std::to_string(needed) + " bytes this problem needs");
  if (needed > 0) require_aligned(workspace, "workspace");
}

char* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }

void run_forward(const Problem& problem, const lfce_forward_args& a, const PlanFor& plan_for) {
  require_aligned(a.hidden, "hidden");
  require_aligned(a.weight, "weight");
  if (problem.bias) require(a.bias, "bias");
  require(a.targets, "targets");
  require(a.lse, "lse");
  require(a.token_loss, "token_loss");
  require(a.valid_count, "valid_count");
  if (problem.reduction != Reduction::None) require(a.loss, "loss");
  make_context_current(a.device);
  const Plan plan = plan_for(problem, a.device);
  const auto layout = plan.forward_layout();
  require_workspace(a.workspace, a.workspace_bytes, layout.bytes, "lfce_forward");
  auto stream = static_cast<CUstream>(a.stream);

  int64_t n = problem.tokens, ignore = problem.ignore_index;
  int32_t splits = static_cast<int32_t>(plan.splits());
  void* x = const_cast<void*>(a.hidden);
  void* w = const_cast<void*>(a.weight);
  void* b = const_cast<void*>(a.bias ? a.bias : a.weight);  // never read without bias
  void* y = const_cast<void*>(a.targets);
  void* pmax = at(a.workspace, layout.partial_max);
  void* psum = at(a.workspace, layout.partial_sum);
  void* tlogit = at(a.workspace, layout.target_logit);
  void* lse = a.lse;
  void* token_loss = a.token_loss;
  void* loss = a.loss ? static_cast<void*>(a.loss) : static_cast<void*>(a.valid_count);
  void* count = a.valid_count;

  const KernelSpec fwd = plan.spec(KernelKind::LseForward);
  void* lse_args[] = {&x, &w, &b, &y, &n, &pmax, &psum, &tlogit};
  kernel_for(a.device, fwd).launch({grid_dim(n, fwd.tile.bm, 'x'), static_cast<unsigned>(splits), 1}, stream, lse_args);

  void* combine_args[] = {&pmax, &psum, &tlogit, &y, &n, &ignore, &splits, &lse, &token_loss};
  kernel_for(a.device, plan.spec(KernelKind::LseCombine)).launch({grid_dim(n, 256, 'x'), 1, 1}, stream, combine_args);

  void* reduce_args[] = {&token_loss, &y, &n, &ignore, &loss, &count};
  kernel_for(a.device, plan.spec(KernelKind::LossReduce)).launch({1, 1, 1}, stream, reduce_args);
}

void run_backward(const Problem& problem, const lfce_backward_args& a, const PlanFor& plan_for) {
  require_aligned(a.hidden, "hidden");
  require_aligned(a.weight, "weight");
  if (problem.bias) require(a.bias, "bias");
  require(a.targets, "targets");
  require(a.lse, "lse");
  require(a.valid_count, "valid_count");
  if (problem.mode == Mode::Recompute) require(a.grad_loss, "grad_loss (recompute mode needs the upstream gradient)");
  // Each gradient is optional (a frozen LM head, LoRA): a NULL one's kernel is neither compiled nor launched.
  const bool want_hidden = a.grad_hidden != nullptr;
  const bool want_weight = a.grad_weight != nullptr;
  const bool want_bias = problem.bias && a.grad_bias != nullptr;
  if (want_hidden) require_aligned(a.grad_hidden, "grad_hidden");
  if (!want_hidden && !want_weight && !want_bias) {
    spdlog::debug("backward: no gradient asked for, nothing launched");
    return;
  }
  make_context_current(a.device);
  const Plan plan = plan_for(problem, a.device);
  const auto layout = plan.backward_layout();
  require_workspace(a.workspace, a.workspace_bytes, layout.bytes, "lfce_backward");
  auto stream = static_cast<CUstream>(a.stream);

  int64_t n = problem.tokens, ignore = problem.ignore_index, ld = plan.ld();
  void* x = const_cast<void*>(a.hidden);
  void* w = const_cast<void*>(a.weight);
  void* b = const_cast<void*>(a.bias ? a.bias : a.weight);
  void* y = const_cast<void*>(a.targets);
  void* lse = const_cast<float*>(a.lse);
  void* count = const_cast<float*>(a.valid_count);
  void* grad_loss = const_cast<float*>(a.grad_loss ? a.grad_loss : a.valid_count);  // unread in eager mode
  void* dz = at(a.workspace, layout.dz);
  void* grad_hidden = a.grad_hidden;
  void* acc = plan.needs_grad_input_accumulator() ? at(a.workspace, layout.grad_input_acc) : a.grad_hidden;
  void* grad_weight = a.grad_weight;
  void* grad_bias = a.grad_bias;

  const KernelSpec dlogits = plan.spec(KernelKind::DlogitsBackward);
  const KernelSpec gw = plan.spec(KernelKind::GradWeight);
  const KernelSpec gx = plan.spec(KernelKind::GradInput);
  const Kernel& dlogits_kernel = kernel_for(a.device, dlogits);
  const Kernel* gw_kernel = want_weight ? &kernel_for(a.device, gw) : nullptr;
  const Kernel* gx_kernel = want_hidden ? &kernel_for(a.device, gx) : nullptr;
  const Kernel* gb_kernel = want_bias ? &kernel_for(a.device, plan.spec(KernelKind::GradBias)) : nullptr;

  const int64_t chunks = plan.chunks();
  spdlog::debug("backward: N={} V={} H={} in {} chunk(s) of {}; grad_hidden {}, grad_weight {}, grad_bias {}", n,
                problem.vocab, problem.hidden, chunks, plan.chunk(), want_hidden, want_weight, want_bias);
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t v_begin = c * plan.chunk();
    int64_t v_len = std::min(plan.chunk(), problem.vocab - v_begin);
    int32_t first = c == 0, last = c == chunks - 1;

    void* dlogits_args[] = {&x, &w, &b, &y, &lse, &grad_loss, &count, &n, &ignore, &v_begin, &v_len, &ld, &dz};
    dlogits_kernel.launch({grid_dim(n, dlogits.tile.bm, 'x'), grid_dim(v_len, dlogits.tile.bn, 'y'), 1}, stream,
                          dlogits_args);

    if (gw_kernel) {
      void* gw_args[] = {&dz, &x, &n, &ld, &v_begin, &v_len, &grad_weight, &grad_loss, &count};
      gw_kernel->launch({grid_dim(v_len, gw.tile.bm, 'x'), grid_dim(problem.hidden, gw.tile.bn, 'y'), 1}, stream,
                        gw_args);
    }

    if (gb_kernel) {
      void* gb_args[] = {&dz, &n, &ld, &v_begin, &v_len, &grad_bias, &grad_loss, &count};
      gb_kernel->launch({grid_dim(v_len, 8, 'x'), 1, 1}, stream, gb_args);
    }

    if (gx_kernel) {
      void* gx_args[] = {&dz, &w, &n, &ld, &v_begin, &v_len, &acc, &grad_hidden, &first, &last, &grad_loss, &count};
      gx_kernel->launch({grid_dim(n, gx.tile.bm, 'x'), grid_dim(problem.hidden, gx.tile.bn, 'y'), 1}, stream, gx_args);
    }
  }
}

}  // namespace

unsigned grid_dim(int64_t extent, int64_t tile, char axis) {
  const int64_t blocks = ceil_div(extent, tile);
  const int64_t limit = axis == 'x' ? kMaxGridX : kMaxGridYZ;
  if (blocks > limit)
    throw SpecError("problem too large: " + std::to_string(extent) + " / " + std::to_string(tile) + " = " +
                    std::to_string(blocks) + " CTAs along grid " + axis + ", over CUDA's limit of " +
                    std::to_string(limit));
  return static_cast<unsigned>(blocks);
}

void forward(const Problem& problem, const lfce_forward_args& args, const PlanFor& plan_for) {
  run_forward(problem, args, plan_for);
}
void backward(const Problem& problem, const lfce_backward_args& args, const PlanFor& plan_for) {
  run_backward(problem, args, plan_for);
}

}  // namespace lfce::runtime
