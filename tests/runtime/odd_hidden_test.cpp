// Any hidden size H with no padded copy of hidden or weight: rows of H
// elements that are not a multiple of 16 bytes are copied in narrower pieces and never take
// the sm_90a TMA + wgmma pipeline. The kernels a plan runs for such H generate, assemble with
// ptxas for sm_90a and sm_80 without spills, and use the pieces hidden_row_align allows; aligned
// H keeps its unrolled 16-byte copies (and its PTX: byte-identical before and after, checked
// when this was written). No GPU.
#include <gtest/gtest.h>

#include <string>

#include "compiler/kernel_kind.h"
#include "runtime/plan.h"
#include "runtime/tuning_files.h"
#include "templates/templates.h"
#include "tests/ptxas.h"

namespace lfce::runtime {
namespace {

struct OddHidden {
  DType dtype;
  int64_t hidden;
  Arch arch;
};

std::string case_name(const testing::TestParamInfo<OddHidden>& info) {
  return std::string(dtype_name(info.param.dtype)) + "_H" + std::to_string(info.param.hidden) + "_" +
         std::string(arch_name(info.param.arch));
}

Problem problem_with(DType dtype, int64_t hidden) {
  Problem p;
  p.tokens = 300;
  p.hidden = hidden;
  p.vocab = 5003;
  p.dtype = dtype;
  p.bias = true;
  return p;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class OddHiddenKernels : public testing::TestWithParam<OddHidden> {};

TEST_P(OddHiddenKernels, UseNarrowCopiesAndAssembleWithoutSpills) {
  const OddHidden& c = GetParam();
  const Plan plan(problem_with(c.dtype, c.hidden), c.arch);
  const int piece = hidden_row_align(c.hidden, c.dtype);
  ASSERT_LT(piece, 16) << "H = " << c.hidden << " has 16-byte rows: not a case of this test";
  for (const KernelKindInfo& info : kKernelKinds) {
    if (!info.gemm) continue;
    const KernelSpec spec = plan.spec(info.kind);
    SCOPED_TRACE(spec.text());
    EXPECT_FALSE(spec.tile.wgmma()) << "TMA cannot load rows of " << c.hidden * dtype_bytes(c.dtype) << " bytes";
    const GeneratedKernel k = generate_kernel(spec);
    if (piece >= 4) {
      EXPECT_GT(count(k.ptx, "cp.async.ca.shared.global"), 0);
      EXPECT_NE(k.ptx.find("], " + std::to_string(piece) + ", "), std::string::npos)
          << "no " << piece << "-byte cp.async";
    } else {
      // 16-bit elements: plain loads inside the copy loop (grad_weight and grad_input read no
      // other 16-bit global values).
      EXPECT_GT(count(k.ptx, "ld.global.nc.u16"), 0);
    }
    if (testing_ptxas::have_ptxas()) testing_ptxas::expect_assembles_without_spills(k.ptx, c.arch);
  }
}

std::vector<OddHidden> odd_cases() {
  std::vector<OddHidden> cases;
  for (Arch arch : {Arch::SM90A, Arch::SM80}) {
    // Odd (2-byte pieces), 4 mod 8 (8-byte), 2 mod 4 (4-byte), and H smaller than a K tile.
    for (int64_t h : {4095, 4093, 100, 1, 7, 4094}) cases.push_back({DType::BF16, h, arch});
    for (int64_t h : {4095, 100, 7}) cases.push_back({DType::FP16, h, arch});
    for (int64_t h : {4097, 3, 4098}) cases.push_back({DType::FP32, h, arch});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Plans, OddHiddenKernels, testing::ValuesIn(odd_cases()), case_name);

// The aligned case is unchanged: every copy an unrolled 16-byte cp.async.cg (per load site and
// operand, its tile's 16-byte chunks over the threads), none narrower, no element loads in the
// gradient GEMMs; and on sm_90a the 16-bit GEMMs still take the TMA + wgmma pipeline.
TEST(AlignedHidden, KeepsUnrolled16ByteCopies) {
  for (DType dtype : {DType::BF16, DType::FP32}) {
    const Plan plan(problem_with(dtype, 4096), Arch::SM80);
    for (const KernelKindInfo& info : kKernelKinds) {
      if (!info.gemm) continue;
      const KernelSpec spec = plan.spec(info.kind);
      SCOPED_TRACE(spec.text());
      const TileConfig& t = spec.tile;
      const int e = dtype_bytes(dtype);
      auto per_thread = [&](int rows) { return (rows * t.bk * e / 16 + t.threads() - 1) / t.threads(); };
      const int chunks = per_thread(t.bm) + per_thread(t.bn);
      const GeneratedKernel k = generate_kernel(spec);
      EXPECT_EQ(count(k.ptx, "cp.async.cg.shared.global"), t.stages * chunks);  // stages-1 prologue + 1
      EXPECT_EQ(count(k.ptx, "], 16, "), t.stages * chunks);
      EXPECT_EQ(count(k.ptx, "cp.async.ca"), 0);
      if (info.kind == KernelKind::GradWeight || info.kind == KernelKind::GradInput) {
        EXPECT_EQ(count(k.ptx, "ld.global.nc.u16"), 0);
      }
    }
  }
  const Plan hopper(problem_with(DType::BF16, 4096), Arch::SM90A);
  for (const KernelKindInfo& info : kKernelKinds) {
    if (info.gemm) {
      EXPECT_TRUE(hopper.spec(info.kind).tile.wgmma()) << kind_name(info.kind);
    }
  }
}

// A tuned wgmma winner (from a file, or a sweep's candidate) for such H is unrunnable, naming
// H: the tuner does not measure it as the default it would fall back to, nor is it used.
TEST(OddHidden, WgmmaCandidateIsUnrunnableNamingHidden) {
  const Candidate wgmma{KernelKind::GradWeight, TileConfig{128, 256, 64, 1, 1, 3, 2}, 0, 0};
  EXPECT_EQ(unrunnable(wgmma, problem_with(DType::BF16, 4096), Arch::SM90A), std::nullopt);
  const auto reason = unrunnable(wgmma, problem_with(DType::BF16, 4093), Arch::SM90A);
  ASSERT_TRUE(reason.has_value());
  EXPECT_NE(reason->find("hidden = 4093"), std::string::npos) << *reason;
}

}  // namespace
}  // namespace lfce::runtime
