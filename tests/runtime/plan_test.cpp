// Plan (runtime/plan.cpp): the specs each kernel of a problem's schedule runs with, eager mode's
// three-GEMM schedule and its choices.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "compiler/errors.h"
#include "compiler/kernel_kind.h"
#include "runtime/kernel_cache.h"
#include "runtime/plan.h"
#include "templates/templates.h"
#include "tests/log_capture.h"
#include "tests/runtime/plan_test_util.h"
#include "tests/spec_error.h"

namespace lfce::runtime {
namespace {

using testing_errors::spec_error;

// Label smoothing and class weights: the flag is 0 or 1, fp16 refuses class weights, and each
// kernel gets the options its code reads (lse_forward the class weights only with smoothing,
// loss_reduce the z-loss only for mean with class weights).
TEST(Plan, LabelSmoothingAndClassWeightsReachTheKernelsThatReadThem) {
  lfce_problem c = llama3(8192);
  c.has_class_weight = 2;
  expect_error_naming(c, "lfce_problem.has_class_weight must be 0 or 1, got 2");
  c.has_class_weight = 1;
  c.dtype = LFCE_DTYPE_FP16;
  expect_error_naming(c, "has_class_weight = 1 with fp16 is not supported");
  c.dtype = LFCE_DTYPE_BF16;
  c.z_loss_scale = 1e-4f;
  Problem p = problem_from_c(&c);
  EXPECT_TRUE(p.class_weight);
  auto spec = [&](KernelKind kind) { return problem_spec(kind, p, Arch::SM90A); };
  EXPECT_FALSE(spec(KernelKind::LseForward).class_weight);  // no smoothing: the plain forward
  EXPECT_TRUE(spec(KernelKind::LseCombine).class_weight);
  EXPECT_TRUE(spec(KernelKind::LossReduce).class_weight);
  EXPECT_EQ(spec(KernelKind::LossReduce).z_loss_scale, 1e-4f);  // mean with class weights
  EXPECT_TRUE(spec(KernelKind::DlogitsBackward).class_weight);
  EXPECT_FALSE(spec(KernelKind::GradWeight).class_weight);
  for (KernelKind kind : {KernelKind::LseForward, KernelKind::LseCombine, KernelKind::LossReduce,
                          KernelKind::DlogitsBackward, KernelKind::GradWeight, KernelKind::GradInput})
    EXPECT_NO_THROW(spec(kind).validate()) << kind_name(kind);
  const size_t plain_bytes = Plan(p, Arch::SM90A).forward_layout().bytes;
  c.label_smoothing = 0.1f;
  p = problem_from_c(&c);
  EXPECT_TRUE(spec(KernelKind::LseForward).class_weight);
  EXPECT_EQ(spec(KernelKind::LseForward).label_smoothing, 0.1f);
  EXPECT_EQ(spec(KernelKind::LossReduce).label_smoothing, 0.f);
  // The forward's workspace gains the partial logit sums ([splits, N]).
  const Plan plan(p, Arch::SM90A);
  const Plan::ForwardLayout layout = plan.forward_layout();
  EXPECT_EQ(layout.partial_logit_sum, plain_bytes);
  EXPECT_EQ(layout.bytes - layout.partial_logit_sum, layout.partial_sum - layout.partial_max);
  EXPECT_GE(layout.bytes - layout.partial_logit_sum, sizeof(float) * 8192 * static_cast<size_t>(plan.splits()));
  // With it, lse_forward keeps its wgmma tile (W is summed by lse_combine, not beside the mainloop).
  EXPECT_TRUE(plan.spec(KernelKind::LseForward).tile.wgmma()) << plan.spec(KernelKind::LseForward).text();
  c.reduction = LFCE_REDUCTION_SUM;
  EXPECT_EQ(problem_spec(KernelKind::LossReduce, problem_from_c(&c), Arch::SM90A).z_loss_scale, 0.f);
}

// Adding the weight / bias gradient into fp32 buffers: flags 0 or 1, recompute mode only, the
// bias one only with a bias; each gradient kernel gets its own flag, no other kernel one.
TEST(Plan, AccumulatedGradientsAreCheckedAndReachOnlyTheirKernels) {
  lfce_problem c = llama3(8192);
  c.accumulate_grad_weight = -1;
  expect_error_naming(c, "lfce_problem.accumulate_grad_weight must be 0 or 1, got -1");
  c.accumulate_grad_weight = 1;
  c.mode = LFCE_MODE_EAGER;
  expect_error_naming(c, "accumulate_grad_weight = 1 needs mode LFCE_MODE_RECOMPUTE");
  c.mode = LFCE_MODE_RECOMPUTE;
  c.accumulate_grad_bias = 1;
  expect_error_naming(c, "accumulate_grad_bias = 1 needs has_bias = 1");
  c.has_bias = 1;
  const Problem p = problem_from_c(&c);
  for (const KernelKindInfo& info : kKernelKinds) {
    const KernelSpec s = problem_spec(info.kind, p, Arch::SM90A);
    EXPECT_EQ(s.accumulate, info.kind == KernelKind::GradWeight || info.kind == KernelKind::GradBias) << info.name;
  }
  c.accumulate_grad_bias = 0;
  EXPECT_FALSE(problem_spec(KernelKind::GradBias, problem_from_c(&c), Arch::SM90A).accumulate);
  EXPECT_TRUE(problem_spec(KernelKind::GradWeight, problem_from_c(&c), Arch::SM90A).accumulate);
}

// Token scaling: a flag, read by lse_combine and dlogits_backward (and by loss_reduce only to split a
// scaled z-loss out for mean with class weights).
TEST(Plan, TokenScalingReachesTheKernelsThatReadIt) {
  lfce_problem c = llama3(8192);
  c.token_scaling = 2;
  expect_error_naming(c, "lfce_problem.token_scaling must be 0 or 1, got 2");
  c.token_scaling = 1;
  Problem p = problem_from_c(&c);
  auto spec = [&](KernelKind kind) { return problem_spec(kind, p, Arch::SM90A); };
  EXPECT_TRUE(spec(KernelKind::LseCombine).token_scaling);
  EXPECT_TRUE(spec(KernelKind::DlogitsBackward).token_scaling);
  for (KernelKind kind : {KernelKind::LseForward, KernelKind::LossReduce, KernelKind::GradWeight, KernelKind::GradInput})
    EXPECT_FALSE(spec(kind).token_scaling) << kind_name(kind);
  c.has_class_weight = 1;
  c.z_loss_scale = 1e-4f;
  p = problem_from_c(&c);
  EXPECT_TRUE(spec(KernelKind::LossReduce).token_scaling);
  EXPECT_EQ(spec(KernelKind::LossReduce).z_loss_scale, 1e-4f);
  for (const KernelKindInfo& info : kKernelKinds) EXPECT_NO_THROW(spec(info.kind).validate()) << info.name;
}

// The causal shift: a sequence length that divides the tokens (anything else named), set as `shift`
// on exactly the kernels that read targets (grad_input only where it adds the target term back).
TEST(Plan, CausalShiftReachesTheKernelsThatReadTargets) {
  lfce_problem c = llama3(8192);
  for (int64_t bad : {int64_t{-1}, int64_t{3}, int64_t{8193}}) {
    c.sequence_length = bad;
    expect_error_naming(c, "lfce_problem.sequence_length = " + std::to_string(bad) +
                               " must be 0 (no shift) or a length T >= 1 of which tokens = 8192 is a multiple");
  }
  for (int64_t good : {int64_t{1}, int64_t{4096}, int64_t{8192}}) {
    c.sequence_length = good;
    EXPECT_EQ(problem_from_c(&c).sequence_length, good);
  }
  for (lfce_dtype dtype : {LFCE_DTYPE_BF16, LFCE_DTYPE_FP32}) {
    c.dtype = dtype;
    const Problem p = problem_from_c(&c);
    for (const KernelKindInfo& info : kKernelKinds) {
      const KernelSpec s = problem_spec(info.kind, p, Arch::SM90A);
      EXPECT_EQ(s.shift, (s.fields_read() & kFieldTargets) != 0) << s.text();
      EXPECT_NO_THROW(s.validate()) << s.text();
    }
    EXPECT_EQ(problem_spec(KernelKind::GradInput, p, Arch::SM90A).shift, dtype == LFCE_DTYPE_BF16);
  }
}

// The extra outputs: a sum of lfce_output flags (anything else named), each reaching the kernels
// that compute it; the lse rows follow the LSEs in the documented order; the forward workspace
// gains the partials of the entropy and the argmax; lse_grad (set by lfce_backward, not the C
// struct) reaches dlogits_backward alone, and with it the entropy and logprob rows it reads.
TEST(Plan, ExtraOutputsReachTheKernelsThatComputeThem) {
  lfce_problem c = llama3(8192);
  for (int32_t bad : {8, -1, 15}) {
    c.outputs = bad;
    expect_error_naming(c, "lfce_problem.outputs = " + std::to_string(bad) +
                               " is not valid; expected a sum of LFCE_OUTPUT_ENTROPY (1), LFCE_OUTPUT_LOGPROB (2) and "
                               "LFCE_OUTPUT_PREDICTED (4)");
  }
  c.outputs = 0;
  Problem plain = problem_from_c(&c);
  const Plan::ForwardLayout plain_layout = Plan(plain, Arch::SM90A).forward_layout();
  c.outputs = LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_LOGPROB | LFCE_OUTPUT_PREDICTED;
  c.token_scaling = 1;
  Problem p = problem_from_c(&c);
  EXPECT_TRUE(p.entropy && p.logprob && p.predicted && !p.lse_grad);
  EXPECT_EQ(lse_rows(p), 4);
  EXPECT_EQ(lse_rows(plain), 1);
  auto spec = [&](KernelKind kind) { return problem_spec(kind, p, Arch::SM90A); };
  EXPECT_TRUE(spec(KernelKind::LseForward).entropy && spec(KernelKind::LseForward).argmax);
  EXPECT_FALSE(spec(KernelKind::LseForward).logprob);
  EXPECT_TRUE(spec(KernelKind::LseCombine).entropy && spec(KernelKind::LseCombine).argmax &&
              spec(KernelKind::LseCombine).logprob);
  KernelSpec dlogits = spec(KernelKind::DlogitsBackward);
  EXPECT_FALSE(dlogits.entropy || dlogits.logprob || dlogits.argmax || dlogits.lse_grad) << dlogits.text();
  p.lse_grad = true;
  dlogits = spec(KernelKind::DlogitsBackward);
  EXPECT_TRUE(dlogits.entropy && dlogits.logprob && dlogits.lse_grad && !dlogits.argmax) << dlogits.text();
  for (KernelKind kind : {KernelKind::LossReduce, KernelKind::GradWeight, KernelKind::GradInput, KernelKind::GradBias}) {
    const KernelSpec s = spec(kind);
    EXPECT_FALSE(s.entropy || s.argmax || s.logprob || s.lse_grad) << kind_name(kind);
  }
  for (const KernelKindInfo& info : kKernelKinds) EXPECT_NO_THROW(spec(info.kind).validate()) << info.name;
  EXPECT_NE(problem_text(p), problem_text(problem_from_c(&c)));  // lse_grad is part of the plan's key
  // Its heavier dlogits_backward epilogue takes 64 x 128 per consumer (the driver's JIT spilled at 64 x 256).
  EXPECT_EQ(Plan(p, Arch::SM90A).spec(KernelKind::DlogitsBackward).tile, (TileConfig{128, 128, 64, 1, 1, 4, 2}));
  EXPECT_EQ(Plan(problem_from_c(&c), Arch::SM90A).spec(KernelKind::DlogitsBackward).tile.bn, 256);
  // lse_forward with the entropy or argmax partials takes 64 x 128 per consumer (ptxas spilled at
  // 64 x 256), tuned or not; each alone too, and the plain forward keeps its 128 x 256.
  EXPECT_EQ(Plan(p, Arch::SM90A).spec(KernelKind::LseForward).tile, (TileConfig{128, 128, 64, 1, 1, 4, 2}));
  Tuning wide;
  wide.tiles[KernelKind::LseForward] = TileConfig{128, 256, 64, 1, 1, 4, 2};
  EXPECT_EQ(Plan(p, Arch::SM90A, wide).spec(KernelKind::LseForward).tile.bn, 128);
  for (int32_t output : {LFCE_OUTPUT_ENTROPY, LFCE_OUTPUT_PREDICTED, LFCE_OUTPUT_LOGPROB}) {
    lfce_problem one = c;
    one.outputs = output;
    EXPECT_EQ(Plan(problem_from_c(&one), Arch::SM90A).spec(KernelKind::LseForward).tile.bn,
              output == LFCE_OUTPUT_LOGPROB ? 256 : 128) << output;
  }
  c.outputs = 0;
  EXPECT_EQ(Plan(problem_from_c(&c), Arch::SM90A).spec(KernelKind::LseForward).tile, (TileConfig{128, 256, 64, 1, 1, 4, 2}));
  // Its staged form (a bias; class-weighted smoothing) too (the driver's JIT spilled at 64 x 256).
  c.has_bias = 1;
  EXPECT_EQ(Plan(problem_from_c(&c), Arch::SM90A).spec(KernelKind::LseForward).tile, (TileConfig{128, 128, 64, 1, 1, 4, 2}));
  c.has_bias = 0;
  // Two [splits, N] fp32 partials more than the plain problem's workspace.
  const Plan plan(p, Arch::SM90A);
  const Plan::ForwardLayout layout = plan.forward_layout();
  const size_t partial = layout.partial_sum - layout.partial_max;
  EXPECT_EQ(layout.partial_entropy, plain_layout.bytes);
  EXPECT_EQ(layout.partial_argmax, layout.partial_entropy + partial);
  EXPECT_EQ(layout.bytes, plain_layout.bytes + 2 * partial);
  // fp16 refuses the lse rows' gradients (their dz is not scaled into its range).
  c.dtype = LFCE_DTYPE_FP16;
  p = problem_from_c(&c);
  p.lse_grad = true;
  EXPECT_THROW(spec(KernelKind::DlogitsBackward).validate(), SpecError);
}

TEST(Plan, SpecsCarryTheProblem) {
  Plan plan(problem(llama3(64)), Arch::SM80);
  KernelSpec s = plan.spec(KernelKind::LseForward);
  EXPECT_EQ(s.vocab, 128256);
  EXPECT_EQ(s.hidden, 4096);
  EXPECT_EQ(s.arch, Arch::SM80);
  EXPECT_EQ(s.chunk, 0);
  EXPECT_NO_THROW(s.validate());
  for (const KernelKindInfo& info : kKernelKinds) EXPECT_NO_THROW(plan.spec(info.kind).validate()) << info.name;
}

// Problems that differ only in fields a kernel does not read share its spec (and so its
// compile, cache entry and tuning): the forward kernels whatever the mode, lse_combine and
// loss_reduce whatever H and the dtype, the bf16 gradient GEMMs whatever the reduction.
TEST(Plan, SpecsAreSharedAcrossFieldsTheKernelDoesNotRead) {
  auto spec_text = [](const Problem& p, KernelKind kind) { return Plan(p, Arch::SM90A).spec(kind).text(); };
  Problem recompute = problem(llama3(64)), eager = recompute;
  eager.mode = Mode::Eager;
  for (KernelKind kind : {KernelKind::LseForward, KernelKind::LseCombine, KernelKind::LossReduce})
    EXPECT_EQ(spec_text(recompute, kind), spec_text(eager, kind)) << kind_name(kind);
  EXPECT_NE(spec_text(recompute, KernelKind::DlogitsBackward),
            spec_text(eager, KernelKind::DlogitsBackward));

  Problem other = recompute;
  other.hidden = 2048;
  other.dtype = DType::FP16;
  for (KernelKind kind : {KernelKind::LseCombine, KernelKind::LossReduce})
    EXPECT_EQ(spec_text(recompute, kind), spec_text(other, kind)) << kind_name(kind);

  Problem summed = recompute;
  summed.reduction = Reduction::Sum;
  for (KernelKind kind : {KernelKind::GradWeight, KernelKind::GradInput})
    EXPECT_EQ(spec_text(recompute, kind), spec_text(summed, kind)) << kind_name(kind);
}

// Eager mode's three-GEMM schedule: every token in one chunk by default (the [N, V] exponentials
// in the dtype), the kernels it launches in order, and its workspace.
TEST(EagerPlan, TakesEveryTokenInOneChunkByDefault) {
  lfce_problem c = llama3(8192);
  c.mode = LFCE_MODE_EAGER;
  const Plan plan(problem(c), Arch::SM90A);
  ASSERT_TRUE(plan.three_gemm());
  EXPECT_EQ(plan.token_chunk(), 8192);
  EXPECT_EQ(plan.token_chunks(), 1);
  std::vector<std::string> kinds;
  for (const KernelSpec& s : plan.launched_specs()) kinds.emplace_back(kind_name(s.kind));
  // (eager_dz twice: its constants for grad_weight's fix-up, Plan::eager_fixup, and its own pass
  // for a run without grad_weight.)
  EXPECT_EQ(kinds, (std::vector<std::string>{"token_count", "eager_logits", "lse_combine", "eager_dz", "eager_dz",
                                             "grad_weight", "grad_input", "loss_reduce", "grad_scale"}));
  for (const KernelSpec& s : plan.launched_specs()) {
    EXPECT_NO_THROW(s.validate()) << s.text();
    EXPECT_FALSE(s.accumulate) << s.text();  // one chunk: grad_weight written once, in the dtype
  }
  // eager_logits is dlogits_backward's GEMM, with its tile where tuned (below); untuned at H = 4096
  // two cooperative consumers on 128 x 256 (the next test).
  EXPECT_EQ(plan.spec(KernelKind::EagerLogits).tile, (TileConfig{128, 256, 64, 1, 1, 4, 2}));
  EXPECT_EQ(plan.eager_tiles(), (128256 + 255) / 256);
  // The workspace: dz [V, N] bf16, two [V / 64, N] fp32 partials, the target logits and residuals;
  // no fp32 gradient sums with one chunk; each token's target column and target dz (eager_operand).
  const auto l = plan.eager_layout();
  EXPECT_EQ(l.dz, 0u);
  EXPECT_EQ(l.partial_max, size_t{128256} * 8192 * 2);
  EXPECT_EQ(l.partial_sum - l.partial_max, size_t{(128256 + 63) / 64} * 8192 * 4);
  EXPECT_EQ(l.target_logit - l.partial_sum, l.partial_sum - l.partial_max);
  EXPECT_EQ(l.residual - l.target_logit, 8192u * 4);
  EXPECT_EQ(l.grad_weight_acc - l.residual, 8192u * 4);
  EXPECT_EQ(l.target_col, l.grad_weight_acc);
  EXPECT_EQ(l.target_dz - l.target_col, 8192u * 4);
  EXPECT_EQ(l.bytes - l.target_dz, 8192u * 2);  // bf16
  // The workspace does not depend on the tuning or the device.
  Tuning narrow;
  narrow.tiles[KernelKind::DlogitsBackward] = TileConfig{128, 128, 64, 1, 1, 4, 2};
  const Plan tuned(problem(c), Arch::SM90A, narrow);
  EXPECT_EQ(tuned.spec(KernelKind::EagerLogits).tile, (TileConfig{128, 128, 64, 1, 1, 4, 2}));
  EXPECT_EQ(tuned.eager_layout().bytes, l.bytes);
  EXPECT_EQ(Plan(problem(c), Arch::SM80).eager_layout().bytes, l.bytes);
}

// Asked for (LFCE_EXPERIMENTAL=eager_operand), on sm_90a in 16-bit without a bias, grad_weight and grad_input
// form dz from the exponentials as they load them (eager_operand) and eager_dz stores only its
// constants; elsewhere eager_dz rewrites the workspace.
TEST(EagerPlan, GemmsFormDzFromTheExponentialsOnHopperIn16BitWhenAskedTo) {
  lfce_problem c = llama3(8192);
  c.mode = LFCE_MODE_EAGER;
  EXPECT_FALSE(Plan(problem(c), Arch::SM90A).eager_operand());  // off by default
  auto operand = [](const lfce_problem& p, Arch arch, Tuning tuning = {}) {
    tuning.eager_operand = true;
    tuning.eager_fixup = false;  // (which eager_dz's constants also serve: the test below)
    const Plan plan(problem(p), arch, tuning);
    bool any = false;
    for (KernelKind kind : {KernelKind::EagerDz, KernelKind::GradWeight, KernelKind::GradInput}) {
      EXPECT_EQ(plan.spec(kind).eager_operand, plan.eager_operand()) << kind_name(kind);
      EXPECT_NO_THROW(plan.spec(kind).validate()) << plan.spec(kind).text();
      any = any || plan.spec(kind).eager_operand;
    }
    return any;
  };
  EXPECT_TRUE(operand(c, Arch::SM90A));
  EXPECT_FALSE(operand(c, Arch::SM80));  // the mma.sync mainloop has no register-A wgmma
  lfce_problem fp16 = c;
  fp16.dtype = LFCE_DTYPE_FP16;
  EXPECT_TRUE(operand(fp16, Arch::SM90A));
  lfce_problem fp32 = c;
  fp32.dtype = LFCE_DTYPE_FP32;
  EXPECT_FALSE(operand(fp32, Arch::SM90A));
  lfce_problem bias = c;
  bias.has_bias = 1;  // grad_bias reads dz from the workspace
  EXPECT_FALSE(operand(bias, Arch::SM90A));
  lfce_problem recompute = c;
  recompute.mode = LFCE_MODE_RECOMPUTE;
  EXPECT_FALSE(operand(recompute, Arch::SM90A));
  lfce_problem fallback = c;  // the forward, then recompute's backward
  fallback.softcap = 30.f;
  EXPECT_FALSE(operand(fallback, Arch::SM90A));
  // Tunings it cannot transform under: a clustered grad_input, and an eager_logits tile width that is
  // not a multiple of grad_weight's BM (a slice's rows would span two tiles' constants).
  Tuning clustered;
  clustered.tiles[KernelKind::GradInput] = TileConfig::parse("128x256x64/wg2/s4/c2");
  EXPECT_FALSE(operand(c, Arch::SM90A, clustered));
  Tuning split;  // its fragments would spill
  split.tiles[KernelKind::GradWeight] = TileConfig::parse("128x256x64/wg2/s4/sn");
  EXPECT_FALSE(operand(c, Arch::SM90A, split));
  Tuning narrow_logits;
  narrow_logits.tiles[KernelKind::DlogitsBackward] = TileConfig::parse("128x64x64/wg2/s4");
  EXPECT_FALSE(operand(c, Arch::SM90A, narrow_logits));
  Tuning pingpong;
  pingpong.tiles[KernelKind::GradInput] = TileConfig::parse("64x256x64/wg2/s4/pp");
  EXPECT_TRUE(operand(c, Arch::SM90A, pingpong));
}

TEST(EagerPlan, OptionsItCannotFormDzForTakeTheForwardAndBackward) {
  lfce_problem base = llama3(4096);
  base.mode = LFCE_MODE_EAGER;
  auto three_gemm = [](lfce_problem c) { return Plan(problem(c), Arch::SM90A).three_gemm(); };
  ASSERT_TRUE(three_gemm(base));
  for (auto set : {+[](lfce_problem& c) { c.softcap = 30.f; }, +[](lfce_problem& c) { c.label_smoothing = 0.1f; },
                   +[](lfce_problem& c) { c.outputs = LFCE_OUTPUT_ENTROPY; },
                   +[](lfce_problem& c) { c.outputs = LFCE_OUTPUT_PREDICTED; },
                   +[](lfce_problem& c) { c.vocab = kMaxChunk + 1; }}) {
    lfce_problem c = base;
    set(c);
    const Plan plan(problem(c), Arch::SM90A);
    EXPECT_FALSE(plan.three_gemm()) << problem_text(plan.problem());
    // The fallback runs the forward, then the backward, in the same workspace.
    EXPECT_EQ(plan.eager_layout().bytes, std::max(plan.forward_layout().bytes, plan.backward_layout().bytes));
    for (const KernelSpec& s : plan.launched_specs())  // (and the backward's scaling)
      EXPECT_TRUE(!kind_info(s.kind).eager || s.kind == KernelKind::GradScale) << s.text();
  }
  // The options eager_dz forms as dlogits_backward does stay on the three GEMMs.
  for (auto set : {+[](lfce_problem& c) { c.temperature = 0.7f; }, +[](lfce_problem& c) { c.z_loss_scale = 1e-4f; },
                   +[](lfce_problem& c) { c.has_class_weight = 1; }, +[](lfce_problem& c) { c.has_bias = 1; },
                   +[](lfce_problem& c) { c.sequence_length = 512; }, +[](lfce_problem& c) { c.token_scaling = 1; },
                   +[](lfce_problem& c) { c.reduction = LFCE_REDUCTION_NONE; }}) {
    lfce_problem c = base;
    set(c);
    EXPECT_TRUE(three_gemm(c)) << problem_text(problem(c));
  }
  // Token scales (an lse row after the LSEs, [rows, N]) need every token in one chunk.
  lfce_problem scaled = base;
  scaled.token_scaling = 1;
  scaled.chunk_size = 1024;
  EXPECT_FALSE(three_gemm(scaled));
  scaled.token_scaling = 0;
  EXPECT_TRUE(three_gemm(scaled));
  // A bias on sm_90a: the staged epilogue's tile (no ping-pong).
  lfce_problem biased = base;
  biased.has_bias = 1;
  const TileConfig t = Plan(problem(biased), Arch::SM90A).spec(KernelKind::EagerLogits).tile;
  EXPECT_TRUE(t.wgmma() && !t.pingpong) << t.text();
  // A recompute problem's plan has no three-GEMM schedule.
  EXPECT_FALSE(Plan(problem(llama3(4096)), Arch::SM90A).three_gemm());
}

// The kernel cache compiles whole (cuModuleLoadDataEx) the kernels whose warpgroups move registers
// with setmaxnreg, which the driver ignores in the relocatable code its link path compiles (C7504):
// every kernel of these plans with setmaxnreg in its PTX, and only those, is compiled_whole.
TEST(KernelCache, EveryKernelThatMovesRegistersIsCompiledWhole) {
  lfce_problem options = llama3(300);
  options.has_bias = 1;
  options.label_smoothing = 0.1f;
  options.softcap = 30.f;
  options.z_loss_scale = 1e-4f;
  lfce_problem eager = llama3(300), fp32 = llama3(300), odd = llama3(300);
  eager.mode = LFCE_MODE_EAGER;
  fp32.dtype = LFCE_DTYPE_FP32;
  odd.hidden = 4093;
  int whole = 0;
  for (const lfce_problem& c : {llama3(8192), options, eager, fp32, odd})
    for (Arch arch : {Arch::SM80, Arch::SM90A}) {
      const Plan plan(problem(c), arch);
      for (const KernelKindInfo& info : kKernelKinds) {
        const KernelSpec spec = plan.spec(info.kind);
        const bool moves = generate_kernel(spec).ptx.find("setmaxnreg") != std::string::npos;
        EXPECT_EQ(compiled_whole(spec), moves) << spec.text();
        whole += moves;
      }
    }
  EXPECT_GE(whole, 12);  // the four GEMMs of the three 16-bit, 16-byte-row problems on sm_90a
}

// By default on sm_90a in 16-bit, eager's grad_weight rewrites p̃ into dz itself (eager_fixup) and
// eager_dz stores only its constants, its full pass still compiled for a run without grad_weight;
// LFCE_EXPERIMENTAL=eager_dz_kernel (Tuning::eager_fixup), the operand transform, fp32, sm_80, recompute mode and
// eager_logits tiles that a grad_weight row block would straddle keep eager_dz's pass.
TEST(EagerPlan, GradWeightRewritesTheWorkspaceItselfOnHopperIn16Bit) {
  lfce_problem c = llama3(8192);
  c.mode = LFCE_MODE_EAGER;
  auto fixup = [](const lfce_problem& p, Arch arch, Tuning tuning = {}) {
    const Plan plan(problem(p), arch, tuning);
    const bool on = plan.eager_fixup();
    EXPECT_EQ(plan.spec(KernelKind::GradWeight).eager_fixup, on);
    EXPECT_EQ(plan.spec(KernelKind::GradInput).eager_fixup, false);
    EXPECT_EQ(plan.spec(KernelKind::EagerDz).eager_operand, on || plan.eager_operand());
    EXPECT_FALSE(plan.eager_dz_pass_spec().eager_operand);
    for (KernelKind kind : {KernelKind::EagerDz, KernelKind::GradWeight, KernelKind::GradInput})
      EXPECT_NO_THROW(plan.spec(kind).validate()) << plan.spec(kind).text();
    if (plan.three_gemm() && !plan.eager_operand()) {
      const std::vector<KernelSpec> specs = plan.launched_specs();
      const bool has_pass = std::find(specs.begin(), specs.end(), plan.eager_dz_pass_spec()) != specs.end();
      EXPECT_TRUE(has_pass) << "eager_dz's pass is launched where no grad_weight is asked for";
    }
    return on;
  };
  EXPECT_TRUE(fixup(c, Arch::SM90A));
  lfce_problem fp16 = c;
  fp16.dtype = LFCE_DTYPE_FP16;
  EXPECT_TRUE(fixup(fp16, Arch::SM90A));
  lfce_problem bias = c;  // grad_bias runs after grad_weight, on the rewritten workspace
  bias.has_bias = 1;
  EXPECT_TRUE(fixup(bias, Arch::SM90A));
  lfce_problem chunked = c;
  chunked.chunk_size = 2048;
  EXPECT_TRUE(fixup(chunked, Arch::SM90A));
  lfce_problem long_chunk = llama3(16384);  // measured slower there (Plan::eager_fixup)
  long_chunk.mode = LFCE_MODE_EAGER;
  EXPECT_FALSE(fixup(long_chunk, Arch::SM90A));
  long_chunk.chunk_size = 8192;
  EXPECT_TRUE(fixup(long_chunk, Arch::SM90A));
  EXPECT_FALSE(fixup(c, Arch::SM80));
  lfce_problem fp32 = c;
  fp32.dtype = LFCE_DTYPE_FP32;
  EXPECT_FALSE(fixup(fp32, Arch::SM90A));
  lfce_problem recompute = c;
  recompute.mode = LFCE_MODE_RECOMPUTE;
  EXPECT_FALSE(fixup(recompute, Arch::SM90A));
  Tuning off;
  off.eager_fixup = false;
  EXPECT_FALSE(fixup(c, Arch::SM90A, off));
  Tuning operand;
  operand.eager_operand = true;
  EXPECT_FALSE(fixup(c, Arch::SM90A, operand));
  Tuning narrow_logits;  // 64-wide eager_logits tiles: a 128-row block would need two tiles' constants
  narrow_logits.tiles[KernelKind::DlogitsBackward] = TileConfig::parse("128x64x64/wg2/s4");
  EXPECT_FALSE(fixup(c, Arch::SM90A, narrow_logits));
}

}  // namespace
}  // namespace lfce::runtime
