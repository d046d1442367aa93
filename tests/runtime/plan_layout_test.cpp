// Launch geometry and workspace layouts (runtime/plan_layout.cpp): splits, chunks, token chunks,
// workspace offsets and sizes, grid limits.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "compiler/errors.h"
#include "compiler/kernel_kind.h"
#include "runtime/launch.h"
#include "runtime/module.h"
#include "runtime/plan.h"
#include "templates/templates.h"
#include "tests/log_capture.h"
#include "tests/runtime/plan_test_util.h"
#include "tests/spec_error.h"

namespace lfce::runtime {
namespace {

using testing_errors::resource_error;
using testing_errors::spec_error;

TEST(Plan, ChunkWorkspaceStaysWithinDefaultBudget) {
  for (int64_t n : {1, 7, 4097, 8192, 65536, 1 << 20}) {
    Plan plan(problem(llama3(n)), Arch::SM90A);
    auto layout = plan.backward_layout();
    EXPECT_LE(static_cast<int64_t>(layout.grad_input_acc), kDefaultWorkspaceBudget + 256) << "N=" << n;
    EXPECT_EQ(plan.ld() % 8, 0);
    EXPECT_GE(plan.ld(), n);
  }
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

TEST(Plan, ForwardAimsForOneCtaPerSmOfTheDevice) {
  const Problem p = problem(llama3(128));
  const Plan a100(p, Arch::SM80, Tuning{}, DeviceLimits{0, 108});
  const int64_t row_blocks = (128 + a100.tile(KernelKind::LseForward).bm - 1) / a100.tile(KernelKind::LseForward).bm;
  EXPECT_EQ(a100.splits() * row_blocks, 108);
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

TEST(GridDim, IsTheCtaCountWithinCudasLimits) {
  EXPECT_EQ(grid_dim(1000, 64, 'x'), 16u);
  EXPECT_EQ(grid_dim(kMaxGridX * 64, 64, 'x'), static_cast<unsigned>(kMaxGridX));
  EXPECT_EQ(grid_dim(65535 * 128, 128, 'y'), 65535u);
}

TEST(GridDim, NamesAnExtentOverTheLimitAlongX) {
  const std::string message = resource_error([] { grid_dim(int64_t{1} << 40, 64, 'x'); });  // once cast to grid 0
  EXPECT_EQ(message.rfind("CTAs along grid x: 17179869184 over 2147483647: ", 0), 0u) << message;
  EXPECT_NE(message.find("1099511627776 / 64 = 17179869184 CTAs along grid x"), std::string::npos) << message;
}

TEST(GridDim, NamesAnExtentOverTheLimitAlongY) {
  const std::string message = resource_error([] { grid_dim(65535 * 128 + 1, 128, 'y'); });
  EXPECT_EQ(message.rfind("CTAs along grid y: 65536 over 65535: ", 0), 0u) << message;
  EXPECT_NE(message.find("65536 CTAs along grid y, over CUDA's limit of 65535"), std::string::npos) << message;
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

}  // namespace
}  // namespace lfce::runtime
