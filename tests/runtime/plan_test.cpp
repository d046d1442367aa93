#include "runtime/plan.h"

#include <algorithm>
#include <gtest/gtest.h>

#include <limits>
#include <set>
#include <string>

#include "compiler/errors.h"
#include "compiler/kernel_kind.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"
#include "templates/templates.h"
#include "tests/log_capture.h"
#include "tests/spec_error.h"

namespace lfce::runtime {
namespace {

using testing_errors::spec_error;

lfce_problem llama3(int64_t tokens) {
  lfce_problem p{};
  p.tokens = tokens;
  p.hidden = 4096;
  p.vocab = 128256;
  p.dtype = LFCE_DTYPE_BF16;
  p.ignore_index = -100;
  return p;
}

Problem problem(const lfce_problem& p) { return problem_from_c(&p); }

std::string error_of(const lfce_problem& p) {
  return spec_error([&] { problem_from_c(&p); });
}

// The SpecError of `p` names `text` (EXPECT, with the message on failure).
void expect_error_naming(const lfce_problem& p, const std::string& text) {
  const std::string message = error_of(p);
  EXPECT_NE(message.find(text), std::string::npos) << message;
}

TEST(Plan, ChunkWorkspaceStaysWithinDefaultBudget) {
  for (int64_t n : {1, 7, 4097, 8192, 65536, 1 << 20}) {
    Plan plan(problem(llama3(n)), Arch::SM90A);
    auto layout = plan.backward_layout();
    EXPECT_LE(static_cast<int64_t>(layout.grad_input_acc), kDefaultWorkspaceBudget + 256) << "N=" << n;
    EXPECT_EQ(plan.ld() % 8, 0);
    EXPECT_GE(plan.ld(), n);
  }
}

TEST(Plan, EagerGradientGemmsTakeCtaPairsAlongMOfTheBusierWidth) {
  // Eager's grad_input (one GEMM over K = V) and grad_weight ([V, H] over K = N) take two
  // consumers sharing 128-row tiles on CTA pairs: 128 x 256 at llama3-8b and llama3-70b (H = 4096
  // and 8192: 128 x 192 pads them to 22 and 44 column blocks) paired along M (sharing B's tile),
  // 128 x 192 at gemma2-2b (H = 2304: 12 column blocks, 6 pairs; 128 x 256's 9 leave a pair half
  // past H) paired along N (sharing dz's tile: half of B's 192 columns is not whole 64-column
  // boxes). Recompute mode keeps its tiles (ping-pong grad_input, unpaired grad_weight).
  const TileConfig pingpong = default_tile(KernelKind::GradInput, DType::BF16, Arch::SM90A);
  ASSERT_TRUE(pingpong.pingpong && pingpong.bm == 64 && pingpong.bn == 256);
  const TileConfig unpaired = default_tile(KernelKind::GradWeight, DType::BF16, Arch::SM90A);
  ASSERT_EQ(unpaired.cluster, 1);
  TileConfig narrow{128, 192, 64, 1, 1, 4, 2, 2};
  narrow.cluster_n = true;
  const TileConfig wide{128, 256, 64, 1, 1, 4, 2, 2};
  lfce_problem gemma = llama3(8192);
  gemma.hidden = 2304;
  gemma.vocab = 256000;
  EXPECT_EQ(Plan(problem(gemma), Arch::SM90A).spec(KernelKind::GradInput).tile, pingpong);
  EXPECT_EQ(Plan(problem(gemma), Arch::SM90A).spec(KernelKind::GradWeight).tile.cluster, 1);
  gemma.mode = LFCE_MODE_EAGER;
  for (KernelKind kind : {KernelKind::GradInput, KernelKind::GradWeight}) {
    SCOPED_TRACE(kind_name(kind));
    EXPECT_EQ(Plan(problem(gemma), Arch::SM90A).spec(kind).tile, narrow);
    lfce_problem llama = llama3(8192);
    llama.mode = LFCE_MODE_EAGER;
    EXPECT_EQ(Plan(problem(llama), Arch::SM90A).spec(kind).tile, wide);
    llama.hidden = 8192;
    EXPECT_EQ(Plan(problem(llama), Arch::SM90A).spec(kind).tile, wide);
    // No pair where H fits one column block of the busier width (192 there, paired along N:
    // the second CTA would compute a tile past H).
    for (int64_t h : {128, 192}) {
      llama.hidden = h;
      EXPECT_EQ(Plan(problem(llama), Arch::SM90A).spec(kind).tile.cluster, 1) << "H = " << h;
    }
    llama.hidden = 264;  // two column blocks of 192 (the busier width here), paired along N
    EXPECT_EQ(Plan(problem(llama), Arch::SM90A).spec(kind).tile, narrow) << "H = 264";
  }
  // Nor a pair along M where M fits one row block (its second CTA would compute a tile past M):
  // grad_input's M is the token chunk, grad_weight's the vocabulary. On two SMs the wide width
  // fills the waves at H = 4096 (16 column blocks, 8 waves; 128 x 192's 22 leave one slot idle),
  // so these pick 128 x 256 and, with one row block, keep it unpaired.
  const DeviceLimits two_sms{232448, 2};
  const TileConfig unpaired_wide{128, 256, 64, 1, 1, 4, 2};
  lfce_problem few = llama3(128);
  few.mode = LFCE_MODE_EAGER;
  EXPECT_EQ(Plan(problem(few), Arch::SM90A, Tuning{}, two_sms).spec(KernelKind::GradInput).tile, unpaired_wide);
  few.tokens = 129;  // two row blocks: the pair
  EXPECT_EQ(Plan(problem(few), Arch::SM90A, Tuning{}, two_sms).spec(KernelKind::GradInput).tile, wide);
  lfce_problem small_vocab = llama3(8192);
  small_vocab.mode = LFCE_MODE_EAGER;
  small_vocab.vocab = 128;
  EXPECT_EQ(Plan(problem(small_vocab), Arch::SM90A, Tuning{}, two_sms).spec(KernelKind::GradWeight).tile.cluster, 1);
  small_vocab.vocab = 129;
  EXPECT_EQ(Plan(problem(small_vocab), Arch::SM90A, Tuning{}, two_sms).spec(KernelKind::GradWeight).tile, wide);
  lfce_problem llama = llama3(8192);
  EXPECT_EQ(Plan(problem(llama), Arch::SM90A).spec(KernelKind::GradInput).tile, pingpong);
  // With the operand transform (unclustered tiles only), eager's grad_input keeps the shared
  // tiles of the busier width and grad_weight the unpaired default.
  Tuning transform;
  transform.eager_operand = true;
  EXPECT_EQ(Plan(problem(gemma), Arch::SM90A, transform).spec(KernelKind::GradInput).tile,
            (TileConfig{128, 192, 64, 1, 1, 4, 2}));
  EXPECT_EQ(Plan(problem(gemma), Arch::SM90A, transform).spec(KernelKind::GradWeight).tile.cluster, 1);
  // A tuned tile stays; sm_80 has no ping-pong.
  Tuning tuned;
  tuned.tiles[KernelKind::GradInput] = pingpong;
  EXPECT_EQ(Plan(problem(gemma), Arch::SM90A, tuned).spec(KernelKind::GradInput).tile, pingpong);
  EXPECT_FALSE(Plan(problem(gemma), Arch::SM80).spec(KernelKind::GradInput).tile.wgmma());
}

TEST(Plan, BudgetShrinksTheChunk) {
  lfce_problem p = llama3(8192);
  p.workspace_budget = 64ll << 20;
  Plan plan(problem_from_c(&p), Arch::SM90A);
  EXPECT_EQ(plan.chunk(), 4096);
  EXPECT_LE(plan.chunk() * plan.ld() * 2, p.workspace_budget);
  EXPECT_EQ(plan.chunks(), 32);
}

TEST(Plan, ExplicitChunkIsUsedAndClampedToVocab) {
  lfce_problem p = llama3(100);
  p.chunk_size = 1000;
  EXPECT_EQ(Plan(problem_from_c(&p), Arch::SM80).chunk(), 1000);
  p.chunk_size = kMaxChunk;
  EXPECT_EQ(Plan(problem_from_c(&p), Arch::SM80).chunk(), 128256);
}

// The api layer caches plans under problem_text: a field missing from it would hand a problem
// the plan (and kernels) of another that differs only there, e.g. a softcap's.
TEST(Plan, EveryProblemFieldChangesTheProblemText) {
  const Problem base = problem(llama3(8192));
  std::vector<Problem> variants(24, base);
  variants[0].tokens += 1;
  variants[1].hidden += 8;
  variants[2].vocab += 1;
  variants[3].dtype = DType::FP16;
  variants[4].targets = IndexType::I32;
  variants[5].bias = !base.bias;
  variants[6].reduction = Reduction::Sum;
  variants[7].mode = Mode::Eager;
  variants[8].ignore_index = 0;
  variants[9].chunk_size = 4096;
  variants[10].workspace_budget += 1;
  variants[11].softcap = 30.f;
  variants[12].softcap = 30.000002f;  // the next float: the text is exact
  variants[13].temperature = 0.7f;
  variants[14].temperature = 0.70000005f;
  variants[15].z_loss_scale = 1e-4f;
  variants[16].z_loss_scale = 1.00000005e-4f;
  variants[17].label_smoothing = 0.1f;
  variants[18].label_smoothing = 0.100000009f;
  variants[19].class_weight = true;
  variants[20].accumulate_grad_weight = true;
  variants[21].accumulate_grad_bias = true;
  variants[22].token_scaling = true;
  variants[23].sequence_length = base.tokens;
  std::set<std::string> texts{problem_text(base)};
  for (const Problem& v : variants) texts.insert(problem_text(v));
  EXPECT_EQ(texts.size(), variants.size() + 1);
}

// Each loss option of the C struct is checked where it enters, naming the field and the value;
// a zero-initialised struct means no option (temperature 0 is none, as 1).
TEST(Plan, LossOptionsOfTheCStructAreCheckedAndNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Bad {
    float lfce_problem::*field;
    const char* name;
    float value;
    const char* shown;
  };
  for (const Bad& b : {Bad{&lfce_problem::softcap, "softcap", -1.f, "-1"},
                       Bad{&lfce_problem::softcap, "softcap", nan, "nan"},
                       Bad{&lfce_problem::temperature, "temperature", -0.5f, "-0.5"},
                       Bad{&lfce_problem::temperature, "temperature", 1e-7f, "1e-07"},
                       Bad{&lfce_problem::temperature, "temperature", inf, "inf"},
                       Bad{&lfce_problem::temperature, "temperature", nan, "nan"},
                       Bad{&lfce_problem::z_loss_scale, "z_loss_scale", -1e-4f, "-1e-04"},
                       Bad{&lfce_problem::z_loss_scale, "z_loss_scale", inf, "inf"},
                       Bad{&lfce_problem::z_loss_scale, "z_loss_scale", nan, "nan"},
                       Bad{&lfce_problem::label_smoothing, "label_smoothing", -0.1f, "-0.1"},
                       Bad{&lfce_problem::label_smoothing, "label_smoothing", 1.5f, "1.5"},
                       Bad{&lfce_problem::label_smoothing, "label_smoothing", inf, "inf"},
                       Bad{&lfce_problem::label_smoothing, "label_smoothing", nan, "nan"}}) {
    lfce_problem c = llama3(8192);
    c.*b.field = b.value;
    const std::string message = error_of(c);
    EXPECT_NE(message.find(std::string("lfce_problem.") + b.name), std::string::npos) << message;
    EXPECT_NE(message.find(std::string("got ") + b.shown), std::string::npos) << message;
  }
  lfce_problem c = llama3(8192);
  EXPECT_EQ(problem_from_c(&c).temperature, 1.f);  // zero-initialised: none
  c.temperature = 0.7f;
  c.z_loss_scale = 1e-4f;
  const Problem p = problem_from_c(&c);
  EXPECT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.z_loss_scale, 1e-4f);
  // Only the kernels that read an option get it: the others stay the plain problem's.
  EXPECT_EQ(problem_spec(KernelKind::LseForward, p, Arch::SM90A).temperature, 0.7f);
  EXPECT_EQ(problem_spec(KernelKind::LseForward, p, Arch::SM90A).z_loss_scale, 0.f);
  EXPECT_EQ(problem_spec(KernelKind::LseCombine, p, Arch::SM90A).z_loss_scale, 1e-4f);
  EXPECT_EQ(problem_spec(KernelKind::DlogitsBackward, p, Arch::SM90A).z_loss_scale, 1e-4f);
  EXPECT_EQ(problem_spec(KernelKind::GradWeight, p, Arch::SM90A).temperature, 1.f);
}

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

// fp16's dz headroom is 2x (template_util.h, dz_scale): a temperature of 0.5 or less is refused there.
TEST(Plan, Fp16RefusesATemperatureThatCouldOverflowDz) {
  lfce_problem c = llama3(8192);
  c.dtype = LFCE_DTYPE_FP16;
  c.temperature = 0.5f;
  const std::string message = error_of(c);
  EXPECT_NE(message.find("lfce_problem.temperature = 0.5 with fp16"), std::string::npos) << message;
  c.temperature = 0.51f;
  EXPECT_NO_THROW(problem_from_c(&c));
  c.dtype = LFCE_DTYPE_BF16;
  c.temperature = 0.1f;
  EXPECT_NO_THROW(problem_from_c(&c));
}

TEST(Plan, SingleChunkNeedsNoGradInputAccumulator) {
  lfce_problem p = llama3(16);
  p.vocab = 1000;
  Plan plan(problem_from_c(&p), Arch::SM90A);
  EXPECT_EQ(plan.chunks(), 1);
  EXPECT_FALSE(plan.needs_grad_input_accumulator());
  const Plan::BackwardLayout layout = plan.backward_layout();
  EXPECT_EQ(layout.residual, layout.grad_input_acc);  // nothing between them
  EXPECT_EQ(layout.bytes, layout.residual + 256);     // fp32 [16] residuals, 256-aligned
}

TEST(Plan, ResidualsFollowTheAccumulatorForSixteenBitDtypesOnly) {
  lfce_problem p = llama3(8192);
  Plan bf16(problem_from_c(&p), Arch::SM90A);
  ASSERT_TRUE(bf16.needs_grad_input_accumulator());
  const Plan::BackwardLayout l = bf16.backward_layout();
  EXPECT_EQ(l.residual, l.grad_input_acc + size_t{4} * 8192 * 4096);
  EXPECT_EQ(l.bytes, l.residual + size_t{4} * 8192);
  p.dtype = LFCE_DTYPE_FP32;
  const Plan fp32(problem_from_c(&p), Arch::SM90A);
  EXPECT_EQ(fp32.backward_layout().bytes, fp32.backward_layout().residual);
}

TEST(Plan, ForwardSplitsFillTheGpuWhenTokensAreFew) {
  Plan small(problem(llama3(128)), Arch::SM90A);
  const TileConfig tile = small.spec(KernelKind::LseForward).tile;
  const int64_t row_blocks = (128 + tile.bm - 1) / tile.bm;
  EXPECT_EQ(small.splits() * row_blocks, kDefaultForwardCtas * tile.ctas_per_sm());
  EXPECT_EQ(small.row_groups(), row_blocks);
}

TEST(Plan, ForwardReadsFewRowBlocksOfXAtOnceWhenTokensAreMany) {
  // N = 65536: 512 row blocks of 128. Eight vocabulary shares over 16 row groups (128 CTAs on
  // 132 SMs): each CTA takes 32 row blocks in turn, and only 16 of them are read at once.
  Plan large(problem(llama3(1 << 16)), Arch::SM90A);
  ASSERT_EQ(large.spec(KernelKind::LseForward).tile.bm, 128);
  EXPECT_EQ(large.splits(), 8);
  EXPECT_EQ(large.row_groups(), 16);
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

// Per-GPU limits: a 99 KiB GPU (RTX 30/40/50, A10, L4, L40S) gets default
// tiles that fit, and the forward aims for one CTA per SM of the device.
TEST(Plan, DefaultTilesFitA99KibGpu) {
  constexpr int64_t kSmall = 99 * 1024;
  for (int dtype : {LFCE_DTYPE_BF16, LFCE_DTYPE_FP16, LFCE_DTYPE_FP32}) {
    for (Arch arch : {Arch::SM80, Arch::SM90A}) {
      lfce_problem c = llama3(8192);
      c.dtype = dtype;
      const Plan own(problem(c), arch), small(problem(c), arch, Tuning{}, DeviceLimits{kSmall, 0});
      bool changed = false;
      for (const KernelKindInfo& info : kKernelKinds) {
        if (!info.gemm) continue;
        EXPECT_LE(kernel_smem_bytes(small.spec(info.kind)), kSmall) << info.name << " dtype " << dtype;
        changed = changed || !(small.tile(info.kind) == own.tile(info.kind));
        // Where the H200's default fits, it is kept.
        if (kernel_smem_bytes(own.spec(info.kind)) <= kSmall) {
          EXPECT_EQ(small.tile(info.kind), own.tile(info.kind));
        }
      }
      if (dtype != LFCE_DTYPE_FP32) {
        EXPECT_TRUE(changed) << "the 16-bit defaults need > 99 KiB: some must change";
      }
    }
  }
}

TEST(Plan, ForwardAimsForOneCtaPerSmOfTheDevice) {
  const Problem p = problem(llama3(128));
  const Plan a100(p, Arch::SM80, Tuning{}, DeviceLimits{0, 108});
  const int64_t row_blocks = (128 + a100.tile(KernelKind::LseForward).bm - 1) / a100.tile(KernelKind::LseForward).bm;
  EXPECT_EQ(a100.splits() * row_blocks, 108);
}

TEST(Plan, DropsATunedTileOverTheDevicesSharedMemory) {
  Tuning tuned;
  tuned.tiles[KernelKind::GradWeight] = TileConfig{128, 256, 64, 2, 4, 2};  // 136 KB on the H200
  const Plan small(problem(llama3(8192)), Arch::SM90A, tuned, DeviceLimits{99 * 1024, 0});
  EXPECT_LE(kernel_smem_bytes(small.spec(KernelKind::GradWeight)), 99 * 1024);
  const Plan h200(problem(llama3(8192)), Arch::SM90A, tuned, DeviceLimits{227 * 1024, 132});
  EXPECT_EQ(h200.tile(KernelKind::GradWeight), (TileConfig{128, 256, 64, 2, 4, 2}));
}

// The options that add shared memory per row (the entropy, the argmax, label smoothing's logit
// sum, the lse rows' gradients) count in the default tile's fit: on a 99 KiB GPU (sm_86 / sm_89:
// 101376 bytes per block) every kernel of these problems fits, the backward that takes the
// entropy's gradient and the forward with smoothing, entropy and argmax among them.
TEST(Plan, DefaultTilesFitA99KibGpuWithThePerRowOptions) {
  constexpr int64_t kLimit = 101376;
  struct Case {
    const char* name;
    void (*set)(lfce_problem&);
    bool lse_grad;
  };
  const Case cases[] = {
      {"backward with return_entropy", +[](lfce_problem& c) { c.outputs = LFCE_OUTPUT_ENTROPY; }, true},
      {"entropy and logprob gradients",
       +[](lfce_problem& c) { c.outputs = LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_LOGPROB; }, true},
      {"smoothing, entropy and predicted",
       +[](lfce_problem& c) {
         c.label_smoothing = 0.1f;
         c.outputs = LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_PREDICTED;
       },
       false},
      {"class-weighted smoothing with a bias, entropy and predicted",
       +[](lfce_problem& c) {
         c.label_smoothing = 0.1f;
         c.has_class_weight = 1;
         c.has_bias = 1;
         c.outputs = LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_PREDICTED;
       },
       true},
  };
  for (const Case& k : cases)
    for (int dtype : {LFCE_DTYPE_BF16, LFCE_DTYPE_FP32})
      for (Arch arch : {Arch::SM80, Arch::SM90A}) {
        SCOPED_TRACE(std::string(k.name) + ", dtype " + std::to_string(dtype) + ", " + std::string(arch_name(arch)));
        lfce_problem c = llama3(8192);
        c.dtype = dtype;
        k.set(c);
        Problem p = problem(c);
        p.lse_grad = k.lse_grad;
        const Plan plan(p, arch, Tuning{}, DeviceLimits{kLimit, 0});
        for (const KernelSpec& spec : plan.launched_specs())
          EXPECT_LE(kernel_smem_bytes(spec), kLimit) << spec.text();
      }
}

// A limit below what any tile of some kernel needs is a usage error naming the limit, where it
// comes from and the smallest that works; that one works.
TEST(Plan, NamesASharedMemoryLimitBelowEveryTileAndTheSmallestThatWorks) {
  const Problem p = problem(llama3(8192));
  const std::string message = spec_error([&] { Plan(p, Arch::SM80, Tuning{}, DeviceLimits{1, 0}); });
  EXPECT_NE(message.find("shared memory per block = 1 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("--smem-per-block"), std::string::npos) << message;
  const std::size_t at = message.find("at least ");
  ASSERT_NE(at, std::string::npos) << message;
  const int64_t smallest = std::stoll(message.substr(at + 9));
  EXPECT_GT(smallest, 1);
  const Plan plan(p, Arch::SM80, Tuning{}, DeviceLimits{smallest, 0});
  for (const KernelSpec& spec : plan.launched_specs()) EXPECT_LE(kernel_smem_bytes(spec), smallest) << spec.text();
  EXPECT_NE(spec_error([&] { Plan(p, Arch::SM80, Tuning{}, DeviceLimits{smallest - 1, 0}); }), "no error");
}

// A subnormal option (0 < value < FLT_MIN) passes the range checks but breaks the kernels' math.
TEST(ProblemFromC, RejectsASubnormalSoftcap) {
  lfce_problem c = llama3(8);
  c.softcap = 1e-39f;
  expect_error_naming(c, "lfce_problem.softcap must be 0 (none) or a positive cap in [1.1754944e-38, 1e6], got 1e-39");
}

TEST(ProblemFromC, RejectsASubnormalZLossScale) {
  lfce_problem c = llama3(8);
  c.z_loss_scale = 1e-40f;
  expect_error_naming(c, "lfce_problem.z_loss_scale must be 0 (none) or a positive scale in [1.1754944e-38, 1e6]");
}

TEST(ProblemFromC, RejectsASubnormalLabelSmoothing) {
  lfce_problem c = llama3(8);
  c.label_smoothing = 1e-41f;
  expect_error_naming(c, "lfce_problem.label_smoothing must be 0 (none) or in [1.1754944e-38, 1]");
}

// fp16's dz scale assumes |p - onehot| <= 1, which the z-loss factor 1 + 2·s·LSE breaks.
TEST(ProblemFromC, RejectsAZLossScaleWithFp16) {
  lfce_problem c = llama3(8);
  c.dtype = LFCE_DTYPE_FP16;
  c.z_loss_scale = 0.05f;
  expect_error_naming(c, "lfce_problem.z_loss_scale = 0.05 with fp16 is not supported");
  expect_error_naming(c, "use bf16 or fp32, or z_loss_scale = 0");
}

// Refused by the check, before precompilation caches any of the problem's kernels.
TEST(ProblemFromC, RejectsTheEntropyOutputWithFp16) {
  lfce_problem c = llama3(8);
  c.dtype = LFCE_DTYPE_FP16;
  c.outputs = LFCE_OUTPUT_ENTROPY;
  expect_error_naming(c, "lfce_problem.outputs asks for the entropy with fp16");
  expect_error_naming(c, "use bf16 or fp32, or drop LFCE_OUTPUT_ENTROPY and LFCE_OUTPUT_LOGPROB");
}

TEST(ProblemFromC, RejectsTheLogprobOutputWithFp16) {
  lfce_problem c = llama3(8);
  c.dtype = LFCE_DTYPE_FP16;
  c.outputs = LFCE_OUTPUT_LOGPROB;
  expect_error_naming(c, "lfce_problem.outputs asks for the logprob with fp16");
}

// Eager mode takes whole sequences per token chunk with a causal shift: where one sequence's
// exponentials exceed the budget, it says so, with the bytes needed, the budget and the fix.
TEST(EagerPlan, WarnsWhenOneSequenceNeedsMoreThanTheWorkspaceBudget) {
  lfce_problem c = llama3(65536);
  c.mode = LFCE_MODE_EAGER;
  c.sequence_length = 32768;
  c.workspace_budget = int64_t{1} << 30;
  const int64_t needed = int64_t{128256} * 32768 * 2;
  {
    testing_log::WarningCapture log;
    const Plan plan(problem(c), Arch::SM90A);
    ASSERT_TRUE(plan.three_gemm());
    EXPECT_EQ(plan.token_chunk(), 32768);
    EXPECT_NE(log.text().find("needs " + std::to_string(needed) + " bytes of workspace"), std::string::npos)
        << log.text();
    EXPECT_NE(log.text().find("workspace_budget = 1073741824"), std::string::npos) << log.text();
    EXPECT_NE(log.text().find("lfce_forward_backward_workspace_size"), std::string::npos) << log.text();
  }
  c.workspace_budget = needed;  // enough: quiet
  testing_log::WarningCapture log;
  const Plan plan(problem(c), Arch::SM90A);
  EXPECT_EQ(log.text(), "");
}

TEST(ProblemFromC, NamesZeroTokens) {
  lfce_problem p = llama3(0);
  EXPECT_NE(error_of(p).find("tokens must be >= 1, got 0"), std::string::npos) << error_of(p);
}

TEST(ProblemFromC, NamesBadDtype) {
  lfce_problem p = llama3(1);
  p.dtype = 7;
  EXPECT_NE(error_of(p).find("dtype = 7"), std::string::npos) << error_of(p);
}

TEST(ProblemFromC, AcceptsHiddenNotAMultipleOf16Bytes) {
  for (int64_t h : {1, 7, 4093, 4095}) {
    lfce_problem p = llama3(1);
    p.hidden = h;
    EXPECT_EQ(error_of(p), "no error") << "H = " << h;
  }
}

// TMA needs 16-byte row strides: rows of H elements that are not take the mma.sync tiles on
// sm_90a, by default and over a tuned wgmma winner.
TEST(Plan, HiddenRowsNotMultipleOf16BytesTakeMmaSyncTilesOnSm90a) {
  lfce_problem c = llama3(300);
  c.hidden = 4093;
  Tuning tuned;
  tuned.tiles[KernelKind::GradWeight] = TileConfig{128, 256, 64, 1, 1, 3, 2};
  for (const Tuning& tuning : {Tuning{}, tuned}) {
    Plan plan(problem(c), Arch::SM90A, tuning);
    for (const KernelKindInfo& info : kKernelKinds)
      if (info.gemm) {
        EXPECT_FALSE(plan.spec(info.kind).tile.wgmma()) << plan.spec(info.kind).text();
        EXPECT_NO_THROW(plan.spec(info.kind).validate()) << plan.spec(info.kind).text();
      }
  }
  c.hidden = 4096;
  EXPECT_TRUE(Plan(problem(c), Arch::SM90A).spec(KernelKind::GradWeight).tile.wgmma());
}

TEST(ProblemFromC, NamesNegativeChunk) {
  lfce_problem p = llama3(1);
  p.chunk_size = -5;
  EXPECT_NE(error_of(p).find("chunk_size"), std::string::npos) << error_of(p);
}

// ---- bounds: every size is checked before it is used (huge token counts among them) ----

TEST(ProblemFromC, NamesTokensAboveTheLimit) {
  lfce_problem p = llama3(4611686018427387905);  // once looped forever in next_pow2
  EXPECT_NE(error_of(p).find("tokens = 4611686018427387905 exceeds 2147483647"), std::string::npos) << error_of(p);
  p.tokens = kMaxTokens + 1;
  EXPECT_NE(error_of(p).find("tokens = 2147483648"), std::string::npos) << error_of(p);
}

TEST(ProblemFromC, NamesFp32TokensWhoseWorkspaceRowWouldWrap) {
  lfce_problem p = llama3(2305843009213693953);  // 2^61 + 1: once 2^62 * 4 bytes = 0, then SIGFPE
  p.dtype = LFCE_DTYPE_FP32;
  EXPECT_NE(error_of(p).find("tokens = 2305843009213693953"), std::string::npos) << error_of(p);
}

TEST(ProblemFromC, NamesHiddenAboveTheLimit) {
  lfce_problem p = llama3(1);
  p.hidden = kMaxHidden + 8;
  EXPECT_NE(error_of(p).find("hidden = 1048584 exceeds 1048576"), std::string::npos) << error_of(p);
}

TEST(ProblemFromC, NamesChunkSizeAboveTheLimit) {
  lfce_problem p = llama3(1);
  p.chunk_size = int64_t{1} << 40;
  EXPECT_NE(error_of(p).find("chunk_size = 1099511627776 exceeds 1048576"), std::string::npos) << error_of(p);
}

TEST(Plan, WorkspaceSizesAtTheLimitsDoNotWrap) {
  lfce_problem p = llama3(kMaxTokens);
  p.hidden = kMaxHidden;
  p.vocab = kMaxVocab;
  p.workspace_budget = int64_t{1} << 62;
  const Plan plan(problem(p), Arch::SM90A);
  EXPECT_EQ(plan.chunk(), kMaxChunk);  // the budget would allow more: grid y bounds it
  const auto forward = plan.forward_layout();
  EXPECT_GE(forward.bytes, 3 * sizeof(float) * static_cast<size_t>(kMaxTokens));
  const auto backward = plan.backward_layout();
  EXPECT_GE(backward.grad_input_acc, 2 * static_cast<size_t>(kMaxChunk) * kMaxTokens);  // bf16 dz chunk
  ASSERT_TRUE(plan.needs_grad_input_accumulator());
  EXPECT_GE(backward.bytes - backward.grad_input_acc, sizeof(float) * static_cast<size_t>(kMaxTokens) * kMaxHidden);
}

TEST(Plan, RejectsAProblemThatSkippedTheCApiCheck) {
  Problem p = problem(llama3(1));
  p.tokens = 4611686018427387905;
  EXPECT_NE(spec_error([&] { Plan(p, Arch::SM90A); }).find("4611686018427387905"), std::string::npos);
}

TEST(Plan, RejectsANegativeTunedTileNamingIt) {
  Tuning tuning;
  tuning.tiles[KernelKind::LseForward] = TileConfig{-64, 256, 64, 1, 4, 2};
  // ceil(64 / -64) = 0 row blocks: once divided the CTA target by zero (SIGFPE).
  const std::string message = spec_error([&] { Plan(problem(llama3(64)), Arch::SM90A, tuning); });
  EXPECT_NE(message.find("tile BM = -64 is outside 1..1024"), std::string::npos) << message;
}

TEST(GridDim, IsTheCtaCountWithinCudasLimits) {
  EXPECT_EQ(grid_dim(1000, 64, 'x'), 16u);
  EXPECT_EQ(grid_dim(kMaxGridX * 64, 64, 'x'), static_cast<unsigned>(kMaxGridX));
  EXPECT_EQ(grid_dim(65535 * 128, 128, 'y'), 65535u);
}

TEST(GridDim, NamesAnExtentOverTheLimitAlongX) {
  const std::string message = spec_error([] { grid_dim(int64_t{1} << 40, 64, 'x'); });  // once cast to grid 0
  EXPECT_NE(message.find("1099511627776 / 64 = 17179869184 CTAs along grid x"), std::string::npos) << message;
}

TEST(GridDim, NamesAnExtentOverTheLimitAlongY) {
  const std::string message = spec_error([] { grid_dim(65535 * 128 + 1, 128, 'y'); });
  EXPECT_NE(message.find("65536 CTAs along grid y, over CUDA's limit of 65535"), std::string::npos) << message;
}

}  // namespace
}  // namespace lfce::runtime

namespace lfce::runtime {
namespace {

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

// Untuned on sm_90a, eager_logits runs two cooperative consumers on a 128 x 256 tile from H =
// kEagerLogitsCooperativeHidden on, dlogits_backward's ping-pong below it; a tuned dlogits_backward
// tile is still eager_logits' tile, but a tuned split one (which eager_logits cannot run) leaves it
// the rule's; with a bias lse_forward's 128 x 256 at every H; sm_80 keeps mma.sync's.
TEST(EagerPlan, LogitsTakeTwoCooperativeConsumersFromTheirHiddenSizeOn) {
  const TileConfig cooperative{128, 256, 64, 1, 1, 4, 2};
  lfce_problem c = llama3(8192);
  c.mode = LFCE_MODE_EAGER;
  c.hidden = kEagerLogitsCooperativeHidden;
  const Plan wide(problem(c), Arch::SM90A);
  ASSERT_TRUE(wide.three_gemm());
  EXPECT_EQ(wide.spec(KernelKind::EagerLogits).tile, cooperative);
  EXPECT_TRUE(wide.spec(KernelKind::DlogitsBackward).tile.pingpong);  // recompute's own stays
  c.hidden = kEagerLogitsCooperativeHidden - 8;
  const Plan narrow(problem(c), Arch::SM90A);
  EXPECT_TRUE(narrow.spec(KernelKind::EagerLogits).tile.pingpong);
  EXPECT_EQ(narrow.spec(KernelKind::EagerLogits).tile, narrow.spec(KernelKind::DlogitsBackward).tile);
  c.has_bias = 1;  // (not this rule: a bias's staged epilogue takes neither ping-pong nor pairs)
  EXPECT_EQ(Plan(problem(c), Arch::SM90A).spec(KernelKind::EagerLogits).tile,
            default_tile(KernelKind::LseForward, DType::BF16, Arch::SM90A));
  EXPECT_EQ(default_tile(KernelKind::LseForward, DType::BF16, Arch::SM90A), cooperative);
  c.has_bias = 0;
  c.hidden = 8192;
  Tuning tuned;
  tuned.tiles[KernelKind::DlogitsBackward] = TileConfig{64, 256, 64, 1, 1, 5, 2};
  tuned.tiles[KernelKind::DlogitsBackward].pingpong = true;
  EXPECT_EQ(Plan(problem(c), Arch::SM90A, tuned).spec(KernelKind::EagerLogits).tile,
            tuned.tiles[KernelKind::DlogitsBackward]);
  tuned.tiles[KernelKind::DlogitsBackward] = TileConfig{128, 256, 64, 1, 1, 4, 2};
  tuned.tiles[KernelKind::DlogitsBackward].split_n = true;
  const Plan split(problem(c), Arch::SM90A, tuned);
  EXPECT_TRUE(split.spec(KernelKind::DlogitsBackward).tile.split_n);
  EXPECT_EQ(split.spec(KernelKind::EagerLogits).tile, cooperative);
  EXPECT_FALSE(Plan(problem(c), Arch::SM80).spec(KernelKind::EagerLogits).tile.wgmma());
  // Where ping-pong's five stages do not fit, the default is not ping-pong: not this rule.
  const Plan small(problem(c), Arch::SM90A, Tuning{}, DeviceLimits{160 * 1024, 0});
  EXPECT_FALSE(small.spec(KernelKind::EagerLogits).tile.pingpong);
  EXPECT_EQ(small.spec(KernelKind::EagerLogits).tile, small.spec(KernelKind::DlogitsBackward).tile);
}

TEST(EagerPlan, ChunkSizeAndBudgetBoundTheTokensPerChunk) {
  lfce_problem c = llama3(8192);
  c.mode = LFCE_MODE_EAGER;
  c.workspace_budget = 1ll << 30;  // 4186 tokens of 128256 bf16 exponentials: 4160 in rows of 64
  Plan plan(problem(c), Arch::SM90A);
  ASSERT_TRUE(plan.three_gemm());
  EXPECT_EQ(plan.token_chunk(), 4160);
  EXPECT_EQ(plan.token_chunks(), 2);
  EXPECT_LE(plan.eager_layout().partial_max, static_cast<size_t>(c.workspace_budget));
  // Several chunks: grad_weight (and grad_bias) add into fp32 sums, then grad_convert.
  const auto l = plan.eager_layout();
  EXPECT_EQ(l.grad_bias_acc - l.grad_weight_acc, size_t{128256} * 4096 * 4);
  std::vector<std::string> kinds;
  for (const KernelSpec& s : plan.launched_specs()) {
    kinds.emplace_back(kind_name(s.kind));
    EXPECT_EQ(s.accumulate, s.kind == KernelKind::GradWeight) << s.text();
  }
  EXPECT_EQ(kinds[kinds.size() - 2], "grad_convert");
  EXPECT_EQ(kinds.back(), "grad_scale");
  EXPECT_TRUE(plan.spec(KernelKind::GradWeight).accumulate && plan.spec(KernelKind::GradBias).accumulate);
  EXPECT_FALSE(plan.spec(KernelKind::GradInput).accumulate);
  lfce_problem odd = llama3(1000);  // all tokens in one chunk, whatever their count (rows of 64 bound only a smaller one)
  odd.mode = LFCE_MODE_EAGER;
  EXPECT_EQ(Plan(problem(odd), Arch::SM90A).token_chunk(), 1000);
  EXPECT_EQ(Plan(problem(odd), Arch::SM90A).token_chunks(), 1);
  c.chunk_size = 1000;  // tokens per chunk (rows of 64), not the vocabulary chunk in this schedule
  EXPECT_EQ(Plan(problem(c), Arch::SM90A).token_chunk(), 960);
  c.chunk_size = 100000;
  EXPECT_EQ(Plan(problem(c), Arch::SM90A).token_chunk(), 8192);
  // A causal shift reads target t + 1 in place: whole sequences per chunk, however small the budget.
  c.chunk_size = 0;
  c.sequence_length = 2048;
  EXPECT_EQ(Plan(problem(c), Arch::SM90A).token_chunk(), 4096);
  c.workspace_budget = 1;
  EXPECT_EQ(Plan(problem(c), Arch::SM90A).token_chunk(), 2048);
  // fp32 sums its chunks in grad_weight itself: no accumulator, no conversion.
  c.dtype = LFCE_DTYPE_FP32;
  const Plan fp32(problem(c), Arch::SM90A);
  EXPECT_EQ(fp32.eager_layout().grad_weight_acc, fp32.eager_layout().target_col);
  for (const KernelSpec& spec : fp32.launched_specs()) EXPECT_NE(spec.kind, KernelKind::GradConvert);
}

// Asked for (LFCE_EAGER_OPERAND=1), on sm_90a in 16-bit without a bias, grad_weight and grad_input
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
// LFCE_EAGER_FIXUP=0 (Tuning::eager_fixup), the operand transform, fp32, sm_80, recompute mode and
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
