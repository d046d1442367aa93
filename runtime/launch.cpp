#include "runtime/launch.h"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "runtime/argument_checks.h"
#include "runtime/driver.h"
#include "runtime/gemm_launch.h"
#include "runtime/kernel_args.h"
#include "runtime/kernel_cache.h"
#include "templates/gemm/tile_scheduler.h"

namespace lfce::runtime {
namespace {

char* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }

// The values every kernel may take whatever the schedule: the problem's options and shared inputs.
void offer_problem(OfferedArgs& values, const Problem& problem, const void* weight, const void* bias,
                   const float* class_weight) {
  values.set("w", weight);
  values.set("bias", bias ? bias : weight);  // never read without bias
  values.set("class_weight", class_weight);
  values.set("ignore_index", problem.ignore_index);
  values.set("sequence_length", problem.sequence_length);
}

// lse_forward, lse_combine, loss_reduce.
void run_forward(const Problem& problem, const ForwardArgs& a, const PlanFor& plan_for) {
  check_forward_args(problem, a);
  make_context_current(a.device);
  const Plan plan = plan_for(problem, a.device);
  const auto layout = plan.forward_layout();
  require_workspace(a.workspace, a.workspace_bytes, layout.bytes, "lfce_forward");
  auto stream = static_cast<CUstream>(a.stream);
  const int64_t n = problem.tokens, h = problem.hidden, v = problem.vocab;

  OfferedArgs values;
  offer_problem(values, problem, a.weight, a.bias, a.class_weight);
  values.set("x", a.hidden);
  values.set("targets", a.targets);
  values.set("n", n);
  values.set("splits", static_cast<int32_t>(plan.splits()));
  values.set("partial_max", at(a.workspace, layout.partial_max));
  values.set("partial_sum", at(a.workspace, layout.partial_sum));
  values.set("target_logit", at(a.workspace, layout.target_logit));
  // Label smoothing's partial logit sums, the extra outputs' partials (the entropy's t, the argmax).
  values.set("partial_logit_sum", at(a.workspace, layout.partial_logit_sum));
  values.set("partial_entropy", at(a.workspace, layout.partial_entropy));
  values.set("partial_argmax", at(a.workspace, layout.partial_argmax));
  values.set("lse", a.lse);
  values.set("token_loss", a.token_loss);
  values.set("loss", a.loss ? a.loss : a.valid_count);
  values.set("valid_count", a.valid_count);
  values.set("predicted", a.predicted);

  const KernelSpec fwd = plan.spec(KernelKind::LseForward);
  launch_gemm(kernel_for(a.device, fwd), fwd, {static_cast<unsigned>(plan.row_groups()), static_cast<unsigned>(plan.splits()), 1},
              stream, values, Operand{a.hidden, h, n, h}, Operand{a.weight, h, v, h});
  kernel_for(a.device, plan.spec(KernelKind::LseCombine)).launch({grid_dim(n, 256, 'x'), 1, 1}, stream, values);
  kernel_for(a.device, plan.spec(KernelKind::LossReduce)).launch({1, 1, 1}, stream, values);
}

// Per vocabulary chunk: dlogits_backward, then grad_weight, grad_bias and grad_input of the chunk.
void run_backward(const Problem& problem, const BackwardArgs& a, const PlanFor& plan_for) {
  check_backward_args(problem, a);
  // Each gradient is optional (a frozen LM head, LoRA): a NULL one's kernel is neither compiled nor launched.
  const bool want_hidden = a.grad_hidden != nullptr;
  const bool want_weight = a.grad_weight != nullptr;
  const bool want_bias = problem.bias && a.grad_bias != nullptr;
  if (!want_hidden && !want_weight && !want_bias) {
    spdlog::debug("backward: no gradient asked for, nothing launched");
    return;
  }
  make_context_current(a.device);
  const Plan plan = plan_for(problem, a.device);
  const auto layout = plan.backward_layout();
  require_workspace(a.workspace, a.workspace_bytes, layout.bytes, "lfce_backward");
  auto stream = static_cast<CUstream>(a.stream);
  const int64_t n = problem.tokens, h = problem.hidden, ld = plan.ld();
  void* dz = at(a.workspace, layout.dz);

  OfferedArgs values;
  offer_problem(values, problem, a.weight, a.bias, a.class_weight);
  values.set("x", a.hidden);
  values.set("targets", a.targets);
  values.set("n", n);
  values.set("ld", ld);
  values.set("lse", a.lse);
  values.set("valid_count", a.valid_count);
  values.set("grad_loss", a.grad_loss ? a.grad_loss : a.valid_count);  // unread in eager mode
  values.set("grad_lse", a.grad_lse);
  values.set("dz", dz);
  values.set("residual", at(a.workspace, layout.residual));  // unused (never read or written) for fp32
  values.set("grad_weight", a.grad_weight);
  values.set("grad_bias", a.grad_bias);
  values.set("acc", plan.needs_grad_input_accumulator() ? at(a.workspace, layout.grad_input_acc) : a.grad_hidden);
  values.set("grad_input", a.grad_hidden);

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
    const int64_t v_begin = c * plan.chunk();
    const int64_t v_len = std::min(plan.chunk(), problem.vocab - v_begin);
    OfferedArgs chunk(&values);
    chunk.set("v_begin", v_begin);
    chunk.set("v_len", v_len);
    chunk.set("first", static_cast<int32_t>(c == 0));
    chunk.set("last", static_cast<int32_t>(c == chunks - 1));

    // The chunk's rows of W, as the templates address them.
    const void* w_chunk = static_cast<const char*>(a.weight) + v_begin * h * dtype_bytes(problem.dtype);
    launch_gemm(dlogits_kernel, dlogits, gemm_grid(plan, dlogits, n, v_len, "dlogits_backward"), stream, chunk,
                Operand{a.hidden, h, n, h}, Operand{w_chunk, h, v_len, h});
    if (gw_kernel)  // A = dzᵀ [v_len, ld] K-major; B = x [N, H] MN-major
      launch_gemm(*gw_kernel, gw, gemm_grid(plan, gw, v_len, h, "grad_weight"), stream, chunk,
                  Operand{dz, ld, v_len, ld}, Operand{a.hidden, h, h, n});
    if (gb_kernel) gb_kernel->launch({grid_dim(v_len, 8, 'x'), 1, 1}, stream, chunk);
    if (gx_kernel)  // A = dzᵀ [v_len, ld] MN-major; B = W[chunk] [v_len, H] MN-major
      launch_gemm(*gx_kernel, gx, gemm_grid(plan, gx, n, h, "grad_input"), stream, chunk, Operand{dz, ld, n, v_len},
                  Operand{w_chunk, h, h, v_len});
  }
}

// The three gradients lfce_forward_backward writes (each may be NULL: not computed).
struct Gradients {
  void *hidden, *weight, *bias;
};

void zero_f32(void* buffer, int64_t floats, CUstream stream) {
  check(Driver::get().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(buffer), 0, static_cast<size_t>(floats), stream),
        "cuMemsetD32Async");
}

// Eager mode's three-GEMM schedule (Plan::three_gemm): token_count; per token chunk
// eager_logits, lse_combine, eager_dz, then grad_weight, grad_bias and grad_input over the whole
// vocabulary; loss_reduce; with several chunks grad_convert of the fp32 gradient sums. With
// Plan::eager_operand eager_dz stores only its constants, and the two GEMMs form dz from the
// exponentials as they load them. With Plan::eager_fixup (and a grad_weight to compute) eager_dz
// stores only its constants too, and grad_weight's producer warpgroup rewrites the workspace into
// dz ahead of its tiles (templates/epilogue/eager_fixup.h), its work counters over eager_dz's partial
// maxima (read by then; [ceil(V/64), ld] floats hold the 1 + ceil(V/BM) counters for any BM >= 64).
void run_three_gemm(const Problem& problem, const Plan& plan, const ForwardArgs& a, const Gradients& g) {
  const auto layout = plan.eager_layout();
  auto stream = static_cast<CUstream>(a.stream);
  const int64_t n_total = problem.tokens;
  const int64_t h = problem.hidden, v = problem.vocab, elem = dtype_bytes(problem.dtype);
  void* dz = at(a.workspace, layout.dz);
  void* pmax = at(a.workspace, layout.partial_max);
  void* psum = at(a.workspace, layout.partial_sum);
  const int64_t chunks = plan.token_chunks();
  const bool sums = chunks > 1;
  // Several chunks: grad_weight and grad_bias are fp32 sums, the output itself for fp32.
  const bool f32 = problem.dtype == DType::FP32;
  void* gw_out = sums && !f32 ? at(a.workspace, layout.grad_weight_acc) : g.weight;
  void* gb_out = sums && !f32 ? at(a.workspace, layout.grad_bias_acc) : g.bias;

  const KernelSpec count_spec = plan.spec(KernelKind::TokenCount);
  const KernelSpec logits = plan.spec(KernelKind::EagerLogits);
  const KernelSpec combine = plan.spec(KernelKind::LseCombine);
  const KernelSpec gw = plan.spec(KernelKind::GradWeight), gb = plan.spec(KernelKind::GradBias);  // (sums: accumulate)
  // Without a grad_weight to do it, eager_dz's own pass rewrites the workspace.
  const KernelSpec dz_spec = gw.eager_fixup && !g.weight ? plan.eager_dz_pass_spec() : plan.spec(KernelKind::EagerDz);
  const KernelSpec gx = plan.spec(KernelKind::GradInput);
  const Kernel& logits_kernel = kernel_for(a.device, logits);
  const Kernel& combine_kernel = kernel_for(a.device, combine);
  const Kernel& dz_kernel = kernel_for(a.device, dz_spec);
  const Kernel* gw_kernel = g.weight ? &kernel_for(a.device, gw) : nullptr;
  const Kernel* gb_kernel = g.bias ? &kernel_for(a.device, gb) : nullptr;
  const Kernel* gx_kernel = g.hidden ? &kernel_for(a.device, gx) : nullptr;
  spdlog::debug("eager: N={} V={} H={} in {} token chunk(s) of {}; grad_hidden {}, grad_weight {}, grad_bias {}",
                n_total, v, h, chunks, plan.token_chunk(), g.hidden != nullptr, g.weight != nullptr, g.bias != nullptr);

  const int64_t tile_n = logits.tile.bn;
  // The operand transform reads the constants of tile v / tile_n for whole slices of the
  // vocabulary (templates/gemm/eager_operand.h): BK = 64 in grad_input, BM in grad_weight, all from v = 0.
  for (const KernelSpec* s : {&gw, &gx})
    if ((s->eager_operand && (tile_n % s->tile.bk != 0 || (s == &gw && tile_n % s->tile.bm != 0))) ||
        (s->eager_fixup && tile_n % s->tile.bm != 0))
      throw InternalError("eager constants: eager_logits' tile width " + std::to_string(tile_n) + " splits a slice of " +
                          s->text());

  // The whole problem's values (token_count and loss_reduce read every token); each chunk's over them.
  OfferedArgs values;
  offer_problem(values, problem, a.weight, a.bias, a.class_weight);
  values.set("targets", a.targets);
  values.set("n", n_total);
  values.set("lse", a.lse);
  values.set("token_loss", a.token_loss);
  values.set("loss", a.loss ? a.loss : a.valid_count);
  values.set("valid_count", a.valid_count);
  values.set("grad_loss", a.valid_count);  // eager mode's kernels do not read it
  values.set("dz", dz);
  values.set("partial_max", pmax);
  values.set("partial_sum", psum);
  values.set("target_logit", at(a.workspace, layout.target_logit));
  values.set("residual", at(a.workspace, layout.residual));  // unused for fp32
  values.set("splits", static_cast<int32_t>(plan.eager_tiles()));
  // eager_dz's constants, as the operand transform and the fix-up take them (add_eager_constant_params);
  // coef in the partial sums (written by eager_dz after lse_combine has read them).
  values.set("coef", psum);
  values.set("target_col", at(a.workspace, layout.target_col));
  values.set("target_dz", at(a.workspace, layout.target_dz));
  values.set("tile_n", tile_n);
  values.set("ready", pmax);  // eager_fixup's counters (eager_dz has read the partial maxima)
  // The GEMMs of the gradients run over the whole vocabulary, in one chunk of K = V.
  values.set("vocab", v);
  values.set("v_begin", int64_t{0});
  values.set("v_len", v);
  values.set("first", int32_t{1});
  values.set("last", int32_t{1});
  values.set("grad_weight", gw_out);
  values.set("grad_bias", gb_out);

  // The valid count (and Σ w_y) first: eager_dz divides by them.
  kernel_for(a.device, count_spec).launch({1, 1, 1}, stream, values);
  if (sums && gw_kernel) zero_f32(gw_out, checked_mul(v, h, "grad_weight elements"), stream);
  if (sums && gb_kernel) zero_f32(gb_out, v, stream);
  const int64_t tiles = plan.eager_tiles();
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * plan.token_chunk();
    const int64_t rows = std::min(plan.token_chunk(), n_total - r0), ld = round_up(rows, 8, "eager token stride");
    // The chunk's rows of every per-token array (whole sequences with a causal shift, so targets
    // t + 1 are read in place).
    const void* x = static_cast<const char*>(a.hidden) + r0 * h * elem;
    void* grad_hidden = g.hidden ? static_cast<char*>(g.hidden) + r0 * h * elem : nullptr;
    OfferedArgs chunk(&values);
    chunk.set("x", x);
    chunk.set("targets", static_cast<const char*>(a.targets) + r0 * target_bytes(problem));
    chunk.set("n", rows);
    chunk.set("ld", ld);
    chunk.set("lse", a.lse + r0);
    chunk.set("token_loss", a.token_loss + r0);
    chunk.set("acc", grad_hidden);  // straight to the output
    chunk.set("grad_input", grad_hidden);

    launch_gemm(logits_kernel, logits, gemm_grid(plan, logits, rows, v, "eager_logits"), stream, chunk,
                Operand{x, h, rows, h}, Operand{a.weight, h, v, h});
    combine_kernel.launch({grid_dim(rows, 256, 'x'), 1, 1}, stream, chunk);
    // eager_operand: each CTA's row groups store the constants of as many tiles.
    const auto [dz_x, dz_y] = EagerDzGrid(dz_spec.eager_operand).grid(ld, tiles);
    dz_kernel.launch({grid_dim(dz_x, 1, 'x'), grid_dim(dz_y, 1, 'y'), 1}, stream, chunk);
    if (gw_kernel) {  // A = dzᵀ [V, ld] K-major; B = the chunk's x [rows, H] MN-major
      if (gw_kernel->declares("ready")) zero_f32(pmax, 1 + ceil_div(v, int64_t{gw.tile.bm}), stream);
      launch_gemm(*gw_kernel, gw, gemm_grid(plan, gw, v, h, "grad_weight"), stream, chunk, Operand{dz, ld, v, ld},
                  Operand{x, h, h, rows});
    }
    if (gb_kernel) gb_kernel->launch({grid_dim(v, 8, 'x'), 1, 1}, stream, chunk);
    if (gx_kernel)  // A = dzᵀ [V, ld] MN-major; B = W [V, H] MN-major
      launch_gemm(*gx_kernel, gx, gemm_grid(plan, gx, rows, h, "grad_input"), stream, chunk,
                  Operand{dz, ld, rows, v}, Operand{a.weight, h, h, v});
  }

  kernel_for(a.device, plan.spec(KernelKind::LossReduce)).launch({1, 1, 1}, stream, values);

  if (sums && !f32) {
    const Kernel& convert = kernel_for(a.device, plan.spec(KernelKind::GradConvert));
    auto run_convert = [&](void* src, void* dst, int64_t elements) {
      KernelArgs args;
      args.set("src", src);
      args.set("dst", dst);
      args.set("count", elements);
      convert.launch({static_cast<unsigned>(std::min<int64_t>(ceil_div(elements, 256), 4 * plan.device_ctas(TileConfig{}))), 1, 1},
                     stream, args);
    };
    if (gw_kernel) run_convert(gw_out, g.weight, checked_mul(v, h, "grad_weight elements"));
    if (gb_kernel) run_convert(gb_out, g.bias, v);
  }
}

void run_forward_backward(const Problem& problem, const ForwardBackwardArgs& args, const PlanFor& plan_for) {
  const ForwardArgs& a = args.forward;
  check_forward_backward_args(problem, args);
  const Gradients grads{args.grad_hidden, args.grad_weight, problem.bias ? args.grad_bias : nullptr};
  make_context_current(a.device);
  const Plan plan = plan_for(problem, a.device);
  if (!grads.hidden && !grads.weight && !grads.bias) {
    spdlog::debug("eager: no gradient asked for, the forward alone");
    run_forward(problem, a, plan_for);
    return;
  }
  if (plan.three_gemm()) {
    run_three_gemm(problem, plan, a, grads);
    return;
  }
  // The fallback: the forward, then the recompute backward with an upstream gradient of 1 (eager
  // mode's kernels do not read grad_loss), in the same workspace one after the other.
  spdlog::debug("eager: the forward, then the backward with an upstream gradient of 1 (no three-GEMM schedule for {})",
                problem_text(problem));
  run_forward(problem, a, plan_for);
  BackwardArgs backward;
  backward.hidden = a.hidden;
  backward.weight = a.weight;
  backward.bias = a.bias;
  backward.targets = a.targets;
  backward.class_weight = a.class_weight;
  backward.lse = a.lse;
  backward.valid_count = a.valid_count;
  backward.grad_hidden = grads.hidden;
  backward.grad_weight = grads.weight;
  backward.grad_bias = grads.bias;
  backward.workspace = a.workspace;
  backward.workspace_bytes = a.workspace_bytes;
  backward.device = a.device;
  backward.stream = a.stream;
  run_backward(problem, backward, plan_for);
}

}  // namespace

void forward(const Problem& problem, const ForwardArgs& args, const PlanFor& plan_for) {
  run_forward(problem, args, plan_for);
}
void backward(const Problem& problem, const BackwardArgs& args, const PlanFor& plan_for) {
  run_backward(problem, args, plan_for);
}
void forward_backward(const Problem& problem, const ForwardBackwardArgs& args, const PlanFor& plan_for) {
  run_forward_backward(problem, args, plan_for);
}

void scale_gradient(DType dtype, const void* src, void* dst, int64_t count, const float* scale, int device,
                    void* stream) {
  check_scale_gradient_args(src, dst, count, scale);
  if (count == 0) return;
  make_context_current(device);
  KernelSpec spec;
  spec.kind = KernelKind::GradScale;
  spec.dtype = dtype;
  spec.arch = device_info(device).arch();
  spec = spec.normalised();
  const Kernel& kernel = kernel_for(device, spec);
  KernelArgs args;
  args.set("src", src);
  args.set("dst", dst);
  args.set("count", count);
  args.set("scale", scale);
  // 8 elements a thread; at most a few waves of CTAs, which then stride.
  const int64_t ctas = std::min<int64_t>(ceil_div(ceil_div(count, int64_t{8}), int64_t{256}), int64_t{4096});
  kernel.launch({static_cast<unsigned>(std::max<int64_t>(ctas, 1)), 1, 1}, static_cast<CUstream>(stream), args);
}

}  // namespace lfce::runtime
