#include "runtime/plan.h"

#include <gtest/gtest.h>

#include "compiler/errors.h"

namespace lfce::runtime {
namespace {

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
  try {
    problem_from_c(&p);
  } catch (const SpecError& e) {
    return e.what();
  }
  return "no error";
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
  p.chunk_size = 1 << 30;
  EXPECT_EQ(Plan(problem_from_c(&p), Arch::SM80).chunk(), 128256);
}

TEST(Plan, SingleChunkNeedsNoGradInputAccumulator) {
  lfce_problem p = llama3(16);
  p.vocab = 1000;
  Plan plan(problem_from_c(&p), Arch::SM90A);
  EXPECT_EQ(plan.chunks(), 1);
  EXPECT_FALSE(plan.needs_grad_input_accumulator());
  EXPECT_EQ(plan.backward_layout().bytes, plan.backward_layout().grad_input_acc);
}

TEST(Plan, ForwardSplitsFillTheGpuWhenTokensAreFew) {
  Plan small(problem(llama3(128)), Arch::SM90A);
  const int64_t row_blocks = (128 + small.spec(KernelKind::LseForward).tile.bm - 1) / small.spec(KernelKind::LseForward).tile.bm;
  EXPECT_EQ(small.splits() * row_blocks, kDefaultForwardCtas);
  Plan large(problem(llama3(1 << 16)), Arch::SM90A);
  EXPECT_EQ(large.splits(), 1);
}

TEST(Plan, SpecsCarryTheProblem) {
  Plan plan(problem(llama3(64)), Arch::SM80);
  KernelSpec s = plan.spec(KernelKind::GradInput);
  EXPECT_EQ(s.vocab, 128256);
  EXPECT_EQ(s.hidden, 4096);
  EXPECT_EQ(s.chunk, plan.chunk());
  EXPECT_EQ(s.arch, Arch::SM80);
  EXPECT_EQ(plan.spec(KernelKind::LseForward).chunk, 0);
  EXPECT_NO_THROW(s.validate());
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

TEST(ProblemFromC, NamesUnalignedHidden) {
  lfce_problem p = llama3(1);
  p.hidden = 4095;
  EXPECT_NE(error_of(p).find("hidden = 4095 must be a multiple of 8"), std::string::npos) << error_of(p);
}

TEST(ProblemFromC, NamesNegativeChunk) {
  lfce_problem p = llama3(1);
  p.chunk_size = -5;
  EXPECT_NE(error_of(p).find("chunk_size"), std::string::npos) << error_of(p);
}

}  // namespace
}  // namespace lfce::runtime
