// The config space and its pruner, with no GPU: configs over the shared-memory, register or
// thread limits are rejected with the limit named; every kept config of the small space
// generates PTX that ptxas accepts without spills, asking for exactly the shared memory the
// pruner computed.
#include "autotune/config_space.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <unistd.h>

#include "compiler/errors.h"
#include "templates/templates.h"
#include "tests/spec_error.h"

namespace lfce::autotune {
namespace {

runtime::Problem llama3_8b(DType dtype = DType::BF16) {
  runtime::Problem p;
  p.tokens = 8192;
  p.hidden = 4096;
  p.vocab = 128256;
  p.dtype = dtype;
  p.workspace_budget = runtime::kDefaultWorkspaceBudget;
  return p;
}

runtime::Candidate candidate(KernelKind kind, TileConfig tile) {
  return runtime::Candidate{kind, tile, kind == KernelKind::LseForward ? runtime::kDefaultForwardCtas : 0,
                   kind == KernelKind::DlogitsBackward ? 16384 : 0};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Autotune, SkipsConfigOverSharedMemoryLimit) {
  // The staged fp32 tile alone (256 x 257 floats) is over sm_80's 163 KiB; so are 4 stages of 64 KiB.
  auto reason = rejection(candidate(KernelKind::LseForward, {256, 256, 64, 2, 4, 4}), llama3_8b(), Arch::SM80);
  ASSERT_TRUE(reason.has_value());
  EXPECT_TRUE(contains(*reason, "shared memory 267264 bytes > limit 166912 bytes on sm_80")) << *reason;
}

TEST(Autotune, SkipsConfigOverRegisterLimit) {
  // 256x128 outputs over 128 threads: 256 fp32 accumulators per thread alone.
  auto reason = rejection(candidate(KernelKind::GradWeight, {256, 128, 64, 1, 4, 2}), llama3_8b(), Arch::SM90A);
  ASSERT_TRUE(reason.has_value());
  EXPECT_TRUE(contains(*reason, "registers per thread")) << *reason;
  EXPECT_TRUE(contains(*reason, "> limit 255")) << *reason;
}

TEST(Autotune, SkipsConfigOverThreadLimit) {
  auto reason = rejection(candidate(KernelKind::GradInput, {256, 256, 64, 8, 8, 2}), llama3_8b(), Arch::SM90A);
  ASSERT_TRUE(reason.has_value());
  EXPECT_TRUE(contains(*reason, "threads per block 2048 > limit 1024")) << *reason;
}

TEST(Autotune, SkipsRowKernelWithFewerThreadsThanRows) {
  // lse_forward keeps one row's statistics per thread: 256 rows need 256 threads.
  auto reason = rejection(candidate(KernelKind::LseForward, {256, 64, 64, 2, 2, 2}), llama3_8b(), Arch::SM90A);
  ASSERT_TRUE(reason.has_value());
  EXPECT_TRUE(contains(*reason, "BM = 256 exceeds the 128 threads")) << *reason;
}

TEST(Autotune, KeepsTheDefaultConfig) {
  for (KernelKind kind : tuned_kinds())
    for (Arch arch : {Arch::SM80, Arch::SM90A})
      for (DType dtype : {DType::BF16, DType::FP16, DType::FP32}) {
        auto problem = llama3_8b(dtype);
        auto reason = rejection(default_candidate(kind, problem, arch), problem, arch);
        EXPECT_FALSE(reason.has_value()) << kind_name(kind) << " " << *reason;
      }
}

TEST(ConfigSpace, DefaultSpaceStartsWithTheDefaultAndGivesEveryRejectionAReason) {
  for (KernelKind kind : tuned_kinds()) {
    const auto problem = llama3_8b();
    ConfigSpace space = config_space(kind, problem, Arch::SM80);
    ASSERT_FALSE(space.kept.empty());
    EXPECT_EQ(space.kept.front(), default_candidate(kind, problem, Arch::SM80));
    EXPECT_GT(space.kept.size(), 20u) << kind_name(kind);
    EXPECT_FALSE(space.rejected.empty()) << kind_name(kind);
    std::set<runtime::Candidate> seen;
    for (const runtime::Candidate& c : space.kept) {
      EXPECT_TRUE(seen.insert(c).second) << "duplicate " << c.text();
      EXPECT_EQ(c.kind, kind);
    }
    for (const Rejected& r : space.rejected) {
      EXPECT_FALSE(r.reason.empty()) << r.candidate.text();
      EXPECT_TRUE(seen.insert(r.candidate).second) << "duplicate " << r.candidate.text();
    }
  }
}

TEST(ConfigSpace, ForwardSweepsTheCtaTarget) {
  ConfigSpace space = config_space(KernelKind::LseForward, llama3_8b(), Arch::SM90A);
  std::set<int64_t> ctas;
  for (const runtime::Candidate& c : space.kept) ctas.insert(c.forward_ctas);
  EXPECT_EQ(ctas, (std::set<int64_t>{132, 264, 528}));
}

// On a 99 KiB GPU (RTX 30/40/50, A10, L4, L40S) the sweep's baseline was once the H200's
// default tile, which does not fit there (three backward defaults need 131-136 KB). It is the
// default the runtime runs on that device: default_tile() for that limit, one CTA per SM.
TEST(ConfigSpace, DefaultCandidateOnA99KiBDeviceIsTheDefaultTileForThatLimit) {
  const runtime::DeviceLimits small_gpu{99 * 1024, 108};
  int differs_from_the_h200s = 0;
  for (KernelKind kind : tuned_kinds())
    for (DType dtype : {DType::BF16, DType::FP16, DType::FP32}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + " " + std::string(dtype_name(dtype)));
      const auto problem = llama3_8b(dtype);
      const ConfigSpace space = config_space(kind, problem, Arch::SM90A, "default", small_gpu);
      ASSERT_FALSE(space.kept.empty());
      const runtime::Candidate& first = space.kept.front();
      EXPECT_EQ(first.tile, runtime::default_tile(kind, dtype, Arch::SM90A, small_gpu.smem_per_block));
      EXPECT_FALSE(rejection(first, problem, Arch::SM90A, small_gpu).has_value())
          << *rejection(first, problem, Arch::SM90A, small_gpu);
      if (kind == KernelKind::LseForward) {
        EXPECT_EQ(first.forward_ctas, 108);
      }
      if (!(first.tile == runtime::default_tile(kind, dtype))) ++differs_from_the_h200s;
    }
  EXPECT_GE(differs_from_the_h200s, 3);  // the H200's backward defaults do not fit 99 KiB
}

TEST(ConfigSpace, ForwardSweepsTheCtaTargetPerSmOfTheDevice) {
  ConfigSpace space = config_space(KernelKind::LseForward, llama3_8b(), Arch::SM90A, "default", {0, 108});
  std::set<int64_t> ctas;
  for (const runtime::Candidate& c : space.kept) ctas.insert(c.forward_ctas);
  EXPECT_EQ(ctas, (std::set<int64_t>{108, 216, 432}));
}

TEST(ConfigSpace, WgmmaSpaceHoldsTheHopperTilesAndPrunesOneConsumerTilesThatCannotPair) {
  const ConfigSpace space = config_space(KernelKind::GradWeight, llama3_8b(), Arch::SM90A, "wgmma");
  ASSERT_GT(space.kept.size(), 4u);
  for (const runtime::Candidate& c : space.kept) EXPECT_TRUE(c.tile.wgmma()) << c.text();
  bool paired_rejection = false;
  for (const auto& [c, reason] : space.rejected)
    if (c.tile.consumers == 1 && reason.find("2 CTAs per SM") != std::string::npos) paired_rejection = true;
  EXPECT_TRUE(paired_rejection) << "64x256x64/wg1/s4 (161 KB) cannot run two CTAs per SM";
  EXPECT_NE(testing_errors::spec_error([] { config_space(KernelKind::GradWeight, llama3_8b(), Arch::SM80, "wgmma"); }).find("'wgmma' needs arch sm_90a"),
            std::string::npos);
}

TEST(ConfigSpace, ChunksStayWithinTheBudgetInMultiplesOf128) {
  const auto problem = llama3_8b();
  const int64_t budget = runtime::Plan(problem, Arch::SM90A).chunk();
  ConfigSpace space = config_space(KernelKind::DlogitsBackward, problem, Arch::SM90A);
  std::set<int64_t> chunks;
  for (const runtime::Candidate& c : space.kept) chunks.insert(c.chunk);
  EXPECT_EQ(chunks, (std::set<int64_t>{budget, budget / 2, budget / 4}));
  for (int64_t c : chunks) EXPECT_EQ(c % 128, 0);
}

TEST(ConfigSpace, SingleChunkVocabularyIsNotResplit) {
  auto problem = llama3_8b();
  problem.vocab = 4096;  // fits one chunk of the default budget
  ConfigSpace space = config_space(KernelKind::DlogitsBackward, problem, Arch::SM90A);
  for (const runtime::Candidate& c : space.kept) EXPECT_EQ(c.chunk, 4096) << c.text();
}

TEST(ConfigSpace, SmallSpaceHasAFewConfigsPerKind) {
  for (KernelKind kind : tuned_kinds())
    for (DType dtype : {DType::BF16, DType::FP32}) {
      ConfigSpace space = config_space(kind, llama3_8b(dtype), Arch::SM80, "small");
      EXPECT_GE(space.kept.size(), 3u) << kind_name(kind);
      EXPECT_LE(space.kept.size(), 5u) << kind_name(kind);  // the default + up to 4
      EXPECT_TRUE(space.rejected.empty()) << space.rejected.front().reason;
    }
}

TEST(ConfigSpace, NamesAnUnknownSpace) {
  try {
    config_space(KernelKind::GradInput, llama3_8b(), Arch::SM80, "huge");
    FAIL() << "no exception";
  } catch (const SpecError& e) {
    EXPECT_TRUE(contains(e.what(), "'huge'")) << e.what();
  }
}

TEST(Candidate, TextRoundTrips) {
  for (KernelKind kind : tuned_kinds())
    for (const runtime::Candidate& c : config_space(kind, llama3_8b(), Arch::SM90A, "small").kept)
      EXPECT_EQ(runtime::Candidate::parse(kind, c.text()), c) << c.text();
  EXPECT_EQ(default_candidate(KernelKind::LseForward, llama3_8b(), Arch::SM90A).text(), "128x256x64/wg2/s4;ctas=132");
  EXPECT_EQ(default_candidate(KernelKind::GradWeight, llama3_8b(), Arch::SM90A).text(), "128x256x64/wg2/s4");
  EXPECT_EQ(default_candidate(KernelKind::GradInput, llama3_8b(), Arch::SM90A).text(), "64x256x64/wg2/s4/pp");
  EXPECT_EQ(default_candidate(KernelKind::GradWeight, llama3_8b(), Arch::SM80).text(), "128x256x64/2x4/s2");
}

TEST(Candidate, ParseNamesTheBadText) {
  for (const char* bad : {"128x128x64/2x4", "128x128x64/2x4/s3;ctas=264", "128x128x64/2x4/s3 ", "+128x128x64/2x4/s3"}) {
    try {
      runtime::Candidate::parse(KernelKind::GradWeight, bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const SpecError& e) {
      EXPECT_TRUE(contains(e.what(), std::string("'") + bad + "'")) << e.what();
    }
  }
}

TEST(Candidate, ApplySetsOnlyItsKind) {
  runtime::Tuning base;
  base.tiles[KernelKind::GradInput] = TileConfig{64, 64, 64, 2, 2, 2};
  runtime::Candidate c{KernelKind::DlogitsBackward, TileConfig{64, 128, 64, 2, 2, 3}, 0, 8192};
  runtime::Tuning t = c.apply(base);
  EXPECT_EQ(t.chunk, 8192);
  EXPECT_EQ(t.forward_ctas, 0);
  EXPECT_EQ(t.tiles.at(KernelKind::DlogitsBackward), c.tile);
  EXPECT_EQ(t.tiles.at(KernelKind::GradInput), (TileConfig{64, 64, 64, 2, 2, 2}));
  EXPECT_EQ(candidate_of(KernelKind::DlogitsBackward, llama3_8b(), t, Arch::SM90A), c);
}

// ---- Every kept config of the small space generates PTX that ptxas accepts. ----

bool have_ptxas() {
  std::string p = LFCE_PTXAS;
  return !p.empty() && p.find("NOTFOUND") == std::string::npos;
}

std::string ptxas(const std::string& ptx, Arch arch) {
  char path[] = "/tmp/lfce_autotune_XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  std::ofstream(path) << ptx;
  std::string cmd = std::string(LFCE_PTXAS) + " -arch=" + std::string(arch_name(arch)) + " -v -o /dev/null " + path + " 2>&1";
  std::string log;
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[512];
  while (fgets(buf, sizeof buf, pipe)) log += buf;
  int status = pclose(pipe);
  std::remove(path);
  if (status != 0) return "ptxas failed: " + log;
  // A spilling config would score +inf on the GPU: the small space must have none.
  if (log.find(" 0 bytes spill stores") == std::string::npos) return "spills: " + log;
  return "";
}

struct SpaceCase {
  KernelKind kind;
  DType dtype;
  Arch arch;
};

class SmallSpace : public testing::TestWithParam<SpaceCase> {};

TEST_P(SmallSpace, KeptConfigsValidateAndAssembleWithoutSpills) {
  const SpaceCase& c = GetParam();
  auto problem = llama3_8b(c.dtype);
  problem.workspace_budget = 64 << 20;  // several chunks: the chunk variants differ
  std::set<KernelSpec> specs;  // candidates differing only in the CTA target share a kernel
  for (const runtime::Candidate& cand : config_space(c.kind, problem, c.arch, "small").kept)
    specs.insert(runtime::Plan(problem, c.arch, cand.apply({})).spec(c.kind));
  for (const KernelSpec& spec : specs) {
    SCOPED_TRACE(spec.text());
    EXPECT_NO_THROW(spec.validate());
    GeneratedKernel k = generate_kernel(spec);
    EXPECT_EQ(k.shape.smem_bytes, kernel_smem_bytes(spec)) << "the pruner's shared-memory formula drifted";
    EXPECT_EQ(k.ptx.find(".local"), std::string::npos) << "local memory in generated PTX";
    if (have_ptxas()) {
      EXPECT_EQ(ptxas(k.ptx, spec.arch), "");
    }
  }
  if (!have_ptxas()) GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
}

std::string space_case_name(const testing::TestParamInfo<SpaceCase>& info) {
  return std::string(kind_name(info.param.kind)) + "_" + std::string(dtype_name(info.param.dtype)) + "_" +
         std::string(arch_name(info.param.arch));
}

std::vector<SpaceCase> space_cases() {
  std::vector<SpaceCase> out;
  for (KernelKind kind : tuned_kinds()) {
    out.push_back({kind, DType::BF16, Arch::SM80});
    out.push_back({kind, DType::BF16, Arch::SM90A});
    out.push_back({kind, DType::FP32, Arch::SM90A});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Autotune, SmallSpace, testing::ValuesIn(space_cases()), space_case_name);

}  // namespace
}  // namespace lfce::autotune
