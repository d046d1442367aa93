// Golden-text tests: every kernel the generator produces verifies as LLVM IR, carries the
// PTX that matters, and assembles with ptxas for sm_80 and sm_90a with no spills. No GPU.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <string>

#include "compiler/errors.h"
#include "templates/gemm/tile_scheduler.h"
#include "templates/templates.h"
#include "tests/ptxas.h"
#include "tests/spec_error.h"

namespace lfce {
namespace {

struct Case {
  KernelKind kind;
  DType dtype;
  Arch arch;
  bool bias;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(kind_name(c.kind)) + "_" + std::string(dtype_name(c.dtype)) + "_" +
         std::string(arch_name(c.arch)) + (c.bias ? "_bias" : "");
}

KernelSpec spec_for(const Case& c) {
  KernelSpec s;
  s.kind = c.kind;
  s.vocab = 50257;
  s.hidden = 2304;
  s.chunk = 16384;
  s.dtype = c.dtype;
  s.arch = c.arch;
  s.bias = c.bias;
  if (c.dtype == DType::FP32) s.tile = TileConfig{128, 128, 32, 2, 4, 2};
  return s;
}

class Codegen : public testing::TestWithParam<Case> {};

TEST_P(Codegen, AssemblesWithoutSpills) {
  if (!testing_ptxas::have_ptxas())
    GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
  const Case& c = GetParam();
  GeneratedKernel k = generate_kernel(spec_for(c));
  EXPECT_NE(k.ptx.find(".visible .entry " + k.shape.entry), std::string::npos);
  EXPECT_NE(k.ptx.find(".maxntid " + std::to_string(k.shape.threads)), std::string::npos);
  EXPECT_EQ(k.ptx.find(".local"), std::string::npos) << "local memory in generated PTX";
  if (kind_info(c.kind).gemm) {
    EXPECT_NE(k.ptx.find("cp.async.cg.shared.global"), std::string::npos);
    if (c.dtype != DType::FP32) {
      EXPECT_NE(k.ptx.find("mma.sync.aligned.m16n8k16.row.col.f32"), std::string::npos);
      EXPECT_NE(k.ptx.find("ldmatrix.sync.aligned.m8n8.x4"), std::string::npos);
    } else {
      EXPECT_NE(k.ptx.find("fma.rn.f32"), std::string::npos);
      EXPECT_EQ(k.ptx.find("mma.sync"), std::string::npos) << "fp32 must not round through tensor cores";
    }
  }
  testing_ptxas::expect_assembles_without_spills(k.ptx, c.arch);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const KernelKindInfo& info : kKernelKinds)
    for (DType dtype : {DType::BF16, DType::FP16, DType::FP32})
      for (Arch arch : {Arch::SM80, Arch::SM90A})
        cases.push_back({info.kind, dtype, arch, info.kind == KernelKind::LseForward});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllTemplates, Codegen, testing::ValuesIn(all_cases()), case_name);

// Generates each spec of `variants` once (by its text): no call, no local memory, and (every spec
// but `plain`) assembled by ptxas without spills; distinct texts give distinct PTX. Returns how many
// distinct specs there were.
// The sm_90a default tiles of runtime/plan.cpp's default_tile (bf16/fp16) for the GEMM kinds
// (the runtime's layer is above this test's).
TileConfig default_wgmma_tile(KernelKind kind) {
  if (kind == KernelKind::LseForward) return TileConfig{128, 256, 64, 1, 1, 4, 2};
  if (kind == KernelKind::GradWeight) return TileConfig{128, 256, 64, 1, 1, 4, 2};
  TileConfig t = kind == KernelKind::DlogitsBackward ? TileConfig{64, 256, 64, 1, 1, 5, 2} : TileConfig{64, 256, 64, 1, 1, 4, 2};
  t.pingpong = true;
  return t;
}

size_t expect_distinct_kernels_without_calls_or_spills(const KernelSpec& plain, const std::vector<KernelSpec>& variants) {
  std::map<std::string, std::string> ptx_of;  // spec text -> PTX
  for (const KernelSpec& s : variants) {
    const std::string what = s.text();
    if (ptx_of.count(what)) continue;
    const std::string ptx = generate_kernel(s).ptx;
    ptx_of[what] = ptx;
    EXPECT_FALSE(std::regex_search(ptx, std::regex(R"(\bcall(\.uni)?\b)"))) << what;
    EXPECT_EQ(ptx.find(".local"), std::string::npos) << what;
    if (s != plain) testing_ptxas::expect_assembles_without_spills(ptx, s.arch);
  }
  std::set<std::string> distinct;
  for (const auto& [what, ptx] : ptx_of) EXPECT_TRUE(distinct.insert(ptx).second) << what << ": PTX of another set";
  return ptx_of.size();
}

// The loss options are code only in the kernels that read them, only when set: every set of
// options a kernel reads gives it its own PTX, with no call and no spill (tanh from ex2 and
// div.full; the temperature and the z-loss are multiplications). A kind that does not read an
// option cannot be given it (KernelSpec::validate; kernel_kind_test checks the table), so the
// plain kernels are the code they were.
TEST(Codegen, EachSetOfLossOptionsGivesItsOwnKernelWithoutCallsOrSpills) {
  if (!testing_ptxas::have_ptxas()) GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
  struct Options {
    float softcap, temperature, z_loss_scale, label_smoothing;
    bool class_weight, token_scaling = false;
  };
  const Options sets[] = {{0.f, 1.f, 0.f, 0.f, false},    {30.f, 1.f, 0.f, 0.f, false},  {0.f, 0.7f, 0.f, 0.f, false},
                          {0.f, 1.f, 1e-4f, 0.f, false},  {30.f, 1.f, 1e-4f, 0.f, false}, {30.f, 0.7f, 0.f, 0.f, false},
                          {30.f, 0.7f, 1e-4f, 0.f, false}, {0.f, 1.f, 0.f, 0.1f, false},  {0.f, 1.f, 0.f, 0.f, true},
                          {0.f, 1.f, 0.f, 0.1f, true},    {0.f, 1.f, 1e-4f, 0.f, true},  {30.f, 1.f, 1e-4f, 0.1f, true},
                          {0.f, 1.f, 0.f, 0.f, false, true}, {0.f, 1.f, 1e-4f, 0.f, true, true}};
  // Distinct kernels per kind over these sets: lse_forward tells apart the logit maps and the
  // smoothing (the class weights only with it), lse_combine the z-loss and both target terms,
  // loss_reduce the class weights (and with them the z-loss, and with both the token scale),
  // dlogits_backward every set.
  const std::map<KernelKind, size_t> distinct_sets = {{KernelKind::LseForward, 7},
                                                      {KernelKind::LseCombine, 9},
                                                      {KernelKind::LossReduce, 4},
                                                      {KernelKind::DlogitsBackward, 14}};
  for (Arch arch : {Arch::SM80, Arch::SM90A})
    for (DType dtype : {DType::BF16, DType::FP32})
      for (bool bias : dtype == DType::BF16 ? std::vector<bool>{true, false} : std::vector<bool>{false})
      for (const auto& [kind, expected] : distinct_sets) {
        KernelSpec plain = spec_for({kind, dtype, arch, bias});  // fp32: its mma.sync-free tile
        if (arch == Arch::SM90A && dtype != DType::FP32)                         // the default wgmma tiles
          plain.tile = default_wgmma_tile(kind);
        const uint32_t reads = plain.fields_read();
        std::vector<KernelSpec> variants;
        for (const Options& o : sets) {
          KernelSpec s = plain;
          if (reads & kFieldSoftcap) s.softcap = o.softcap;
          if (reads & kFieldTemperature) s.temperature = o.temperature;
          s.label_smoothing = o.label_smoothing;  // (fields_read depends on these)
          s.class_weight = o.class_weight;
          s.z_loss_scale = o.z_loss_scale;
          s.token_scaling = o.token_scaling;
          s = s.normalised();
          // The tile Plan::tile gives this combination on sm_90a (a wgmma tile spilled).
          if (s.tile.wgmma() && s.kind == KernelKind::DlogitsBackward && s.bias && s.class_weight && s.label_smoothing != 0.f)
            s.tile = TileConfig{128, 128, 64, 1, 1, 4, 2};
          variants.push_back(s);
        }
        EXPECT_EQ(expect_distinct_kernels_without_calls_or_spills(plain, variants), expected) << plain.text();
      }
}

// The extra per-token outputs (lfce_problem.outputs) and the backward through the lse rows: each set
// a kernel reads gives it its own PTX, with no call and no spill, on both mainloops, with and
// without a bias (the staged and the register epilogues of lse_forward and dlogits_backward).
TEST(Codegen, ExtraOutputsAndTheirGradientsGiveTheirOwnKernelsWithoutCallsOrSpills) {
  if (!testing_ptxas::have_ptxas()) GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
  struct Outputs {
    bool entropy, argmax, logprob, lse_grad;
    float softcap = 0.f, label_smoothing = 0.f;
    bool class_weight = false;
  };
  const Outputs sets[] = {{false, false, false, false}, {true, false, false, false},  {false, true, false, false},
                          {false, false, true, false},  {true, true, true, false},    {false, false, false, true},
                          {true, false, false, true},   {false, false, true, true},   {true, true, true, true, 30.f},
                          {true, false, true, true, 0.f, 0.1f, true}};
  // lse_forward: entropy, argmax, both (and the smoothing set); lse_combine every output set (and
  // the smoothing one); dlogits_backward the lse_grad sets only (the outputs alone are not its code).
  const std::map<KernelKind, size_t> distinct_sets = {
      {KernelKind::LseForward, 6}, {KernelKind::LseCombine, 6}, {KernelKind::DlogitsBackward, 6}};
  for (Arch arch : {Arch::SM80, Arch::SM90A})
    for (bool bias : {false, true})
      for (const auto& [kind, expected] : distinct_sets) {
        KernelSpec plain = spec_for({kind, DType::BF16, arch, bias});
        if (arch == Arch::SM90A)  // the default wgmma tiles
          plain.tile = default_wgmma_tile(kind);
        std::vector<KernelSpec> variants;
        for (const Outputs& o : sets) {
          KernelSpec s = plain;
          s.entropy = o.entropy;
          s.argmax = o.argmax;
          s.logprob = o.logprob;
          s.lse_grad = o.lse_grad;
          if (s.fields_read() & kFieldSoftcap) s.softcap = o.softcap;
          s.label_smoothing = o.label_smoothing;
          s.class_weight = o.class_weight;
          s = s.normalised();
          // The tile Plan::tile gives dlogits_backward's heavier epilogues on sm_90a.
          if (s.tile.wgmma() && ((s.kind == KernelKind::DlogitsBackward && s.lse_grad) ||
                                 (s.kind == KernelKind::LseForward && (s.entropy || s.argmax))))
            s.tile = TileConfig{128, 128, 64, 1, 1, 4, 2};
          variants.push_back(s);
        }
        EXPECT_EQ(expect_distinct_kernels_without_calls_or_spills(plain, variants), expected) << plain.text();
      }
}

// The causal shift: every kernel that reads targets gets its own PTX with it (the sequence-end test
// is a 32-bit remainder: no call, which would serialise the wgmma mainloop, no spill), on both
// mainloops, in 16-bit and fp32 (grad_input reads targets only in 16-bit).
TEST(Codegen, CausalShiftGivesTheKernelsThatReadTargetsTheirOwnCodeWithoutCallsOrSpills) {
  if (!testing_ptxas::have_ptxas()) GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
  for (Arch arch : {Arch::SM80, Arch::SM90A})
    for (DType dtype : {DType::BF16, DType::FP32})
      for (KernelKind kind : {KernelKind::LseForward, KernelKind::LseCombine, KernelKind::LossReduce,
                              KernelKind::DlogitsBackward, KernelKind::GradInput}) {
        KernelSpec plain = spec_for({kind, dtype, arch, kind == KernelKind::LseForward});
        if (arch == Arch::SM90A && dtype != DType::FP32 && kind_info(kind).gemm)  // the default wgmma tiles
          plain.tile = default_wgmma_tile(kind);
        plain = plain.normalised();
        KernelSpec shifted = plain;
        shifted.shift = true;
        const bool reads_targets = plain.fields_read() & kFieldTargets;
        EXPECT_EQ(reads_targets, !(kind == KernelKind::GradInput && dtype == DType::FP32)) << plain.text();
        if (!reads_targets) {
          EXPECT_THROW(shifted.validate(), SpecError) << shifted.text();
          continue;
        }
        EXPECT_NO_THROW(shifted.validate()) << shifted.text();
        EXPECT_EQ(expect_distinct_kernels_without_calls_or_spills(plain, {plain, shifted}), 2u) << plain.text();
      }
}

// grad_weight and grad_bias adding into fp32 buffers: each path (wgmma, ping-pong-free CTA pairs
// aside; mma.sync; fp32 SIMT) loads the old fp32 values and stores fp32, with no spill or call.
TEST(Codegen, AccumulatingGradientKernelsAddIntoFp32WithoutCallsOrSpills) {
  if (!testing_ptxas::have_ptxas()) GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
  for (Arch arch : {Arch::SM80, Arch::SM90A})
    for (DType dtype : {DType::BF16, DType::FP32})
      for (KernelKind kind : {KernelKind::GradWeight, KernelKind::GradBias}) {
        KernelSpec plain = spec_for({kind, dtype, arch, false});
        if (arch == Arch::SM90A && dtype != DType::FP32 && kind == KernelKind::GradWeight)
          plain.tile = TileConfig{128, 256, 64, 1, 1, 4, 2};
        plain = plain.normalised();
        KernelSpec added = plain;
        added.accumulate = true;
        const std::string what = added.text();
        const std::string ptx = generate_kernel(added).ptx;
        EXPECT_NE(ptx, generate_kernel(plain).ptx) << what;
        // The old value is read (a 64-bit pair on the wgmma path) and fp32 is written: no conversion.
        EXPECT_TRUE(std::regex_search(ptx, std::regex(R"(ld\.global(\.v2)?\.f32)"))) << what;
        EXPECT_EQ(ptx.find("cvt.rn.bf16"), std::string::npos) << what;
        EXPECT_FALSE(std::regex_search(ptx, std::regex(R"(\bcall(\.uni)?\b)"))) << what;
        EXPECT_EQ(ptx.find(".local"), std::string::npos) << what;
        testing_ptxas::expect_assembles_without_spills(ptx, arch);
      }
}

// Eager's operand transform (KernelSpec::eager_operand): grad_weight and grad_input (bf16 and fp16,
// on the tiles eager mode takes, ping-pong too) load A with ldmatrix (transposed in grad_input,
// whose A is MN-major), convert pairs together and issue every wgmma with A from registers, with
// no spill, call or serialised wgmma; eager_dz stores only its constants.
TEST(Codegen, EagerOperandFormsDzInRegistersWithoutCallsOrSpills) {
  if (!testing_ptxas::have_ptxas()) GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
  for (DType dtype : {DType::BF16, DType::FP16})
    for (KernelKind kind : {KernelKind::GradWeight, KernelKind::GradInput, KernelKind::EagerDz})
      for (const std::string tile : {"128x256x64/wg2/s4", "128x192x64/wg2/s4", "64x256x64/wg2/s4/pp"}) {
        if (kind == KernelKind::GradWeight && tile == "64x256x64/wg2/s4/pp") continue;
        if (kind == KernelKind::EagerDz && tile != "128x256x64/wg2/s4") continue;
        KernelSpec plain = spec_for({kind, dtype, Arch::SM90A, false});
        plain.hidden = 2304;
        if (kind != KernelKind::EagerDz) plain.tile = TileConfig::parse(tile);
        plain.eager_operand = false;
        plain = plain.normalised();
        KernelSpec transformed = plain;
        transformed.eager_operand = true;
        ASSERT_NO_THROW(transformed.validate()) << transformed.text();
        const std::string what = transformed.text();
        const std::string ptx = generate_kernel(transformed).ptx;
        EXPECT_NE(ptx, generate_kernel(plain).ptx) << what;
        if (kind == KernelKind::EagerDz) {
          // The constants, 8 tokens' a vector store, and no row of the workspace read or written.
          EXPECT_NE(ptx.find("st.global.v4.f32"), std::string::npos) << what;
          EXPECT_FALSE(std::regex_search(ptx, std::regex(R"(ld\.global(\.nc)?\.v4\.(b|u)32)"))) << what;
        } else {
          const bool trans = kind == KernelKind::GradInput;
          EXPECT_NE(ptx.find(trans ? "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
                                   : "ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
                    std::string::npos)
              << what;
          EXPECT_EQ(ptx.find(trans ? "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
                                   : "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"),
                    std::string::npos)
              << what;
          EXPECT_NE(ptx.find(dtype == DType::BF16 ? "cvt.rn.bf16x2.f32" : "cvt.rn.f16x2.f32"), std::string::npos) << what;
          // Every wgmma takes A from four registers: "{...}, {%r, %r, %r, %r}, %rd".
          const std::regex rs(R"(wgmma\.mma_async[^;]*\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+)");
          const std::regex any(R"(wgmma\.mma_async)");
          const auto count = [&](const std::regex& re) {
            return std::distance(std::sregex_iterator(ptx.begin(), ptx.end(), re), std::sregex_iterator());
          };
          EXPECT_GT(count(rs), 0) << what;
          EXPECT_EQ(count(rs), count(any)) << what;
          // The mainloop is unrolled twice: the k16 steps' A operands of one slice are other PTX
          // registers than the next slice's, which are written while the former's wgmmas may still
          // read theirs (a loop of one slice gave wrong gradients:
          // docs/measurements.md#eager-operand).
          const std::regex a_operand(R"(wgmma\.mma_async[^;]*\}, (\{%r\d+, %r\d+, %r\d+, %r\d+\}), %rd\d+)");
          std::set<std::string> operands;
          for (auto it = std::sregex_iterator(ptx.begin(), ptx.end(), a_operand); it != std::sregex_iterator(); ++it)
            operands.insert((*it)[1]);
          const int per_slice = 4 * transformed.tile.m_blocks();
          EXPECT_GE(static_cast<int>(operands.size()), 2 * per_slice) << what;
        }
        EXPECT_FALSE(std::regex_search(ptx, std::regex(R"(\bcall(\.uni)?\b)"))) << what;
        EXPECT_EQ(ptx.find(".local"), std::string::npos) << what;
        // fp16's grad_weight at 128 x 256 spills one 8-byte pointer, stored and reloaded once a tile
        // before its mainloop (ptxas 13.0; the SASS has no local access inside the loop).
        const bool spills = kind == KernelKind::GradWeight && dtype == DType::FP16 && tile == "128x256x64/wg2/s4";
        testing_ptxas::expect_assembles_without_spills(ptx, Arch::SM90A, spills ? 8 : 0);
      }
}

// Eager's in-kernel fix-up (KernelSpec::eager_fixup): grad_weight (bf16 and fp16, on the tiles eager
// mode takes and an unpaired one) takes work items from a counter, rewrites rows of the workspace
// with 16-byte loads and stores in its producer warpgroup, releases each item's block and waits
// (acquire, then a proxy fence) before loading a tile's slices; the producer threads keep 88
// registers, and nothing spills or calls.
TEST(Codegen, EagerFixupRewritesTheWorkspaceInTheProducerWarpgroup) {
  if (!testing_ptxas::have_ptxas()) GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
  for (DType dtype : {DType::BF16, DType::FP16})
    for (const std::string tile : {"128x256x64/wg2/s4/c2", "128x192x64/wg2/s4/c2n", "128x256x64/wg2/s4"}) {
      KernelSpec plain = spec_for({KernelKind::GradWeight, dtype, Arch::SM90A, false});
      plain.hidden = 2304;
      plain.tile = TileConfig::parse(tile);
      plain = plain.normalised();
      KernelSpec fixed = plain;
      fixed.eager_fixup = true;
      ASSERT_NO_THROW(fixed.validate()) << fixed.text();
      const std::string what = fixed.text();
      const std::string ptx = generate_kernel(fixed).ptx;
      EXPECT_NE(ptx, generate_kernel(plain).ptx) << what;
      EXPECT_NE(ptx.find("atom.relaxed.gpu.global.add.u32"), std::string::npos) << what;
      EXPECT_NE(ptx.find("red.release.gpu.global.add.u32"), std::string::npos) << what;
      EXPECT_NE(ptx.find("ld.acquire.gpu.global.u32"), std::string::npos) << what;
      EXPECT_NE(ptx.find("fence.proxy.async;"), std::string::npos) << what;
      EXPECT_NE(ptx.find("setmaxnreg.dec.sync.aligned.u32 88"), std::string::npos) << what;
      // p̃ read and dz written 8 tokens (16 bytes) at a time, cache-streaming (evict-first in L2).
      EXPECT_NE(ptx.find("ld.global.cs.v4.b32"), std::string::npos) << what;
      EXPECT_NE(ptx.find("st.global.cs.v4.b32"), std::string::npos) << what;
      EXPECT_NE(ptx.find(dtype == DType::BF16 ? "cvt.rn.bf16" : "cvt.rn.f16"), std::string::npos) << what;
      EXPECT_FALSE(std::regex_search(ptx, std::regex(R"(\bcall(\.uni)?\b)"))) << what;
      EXPECT_EQ(ptx.find(".local"), std::string::npos) << what;
      testing_ptxas::expect_assembles_without_spills(ptx, Arch::SM90A);
    }
  // Rejected where it cannot run: fp32, an mma.sync tile, with the operand transform, other kinds.
  KernelSpec s = spec_for({KernelKind::GradWeight, DType::BF16, Arch::SM90A, false});
  s.hidden = 2304;
  s.tile = TileConfig::parse("128x256x64/wg2/s4/c2n");
  s.eager_fixup = true;
  KernelSpec with_operand = s;
  with_operand.tile = TileConfig::parse("128x256x64/wg2/s4");
  with_operand.eager_operand = true;
  KernelSpec mma = s;
  mma.tile = TileConfig::parse("128x128x32/2x4/s3");
  KernelSpec input = s;
  input.kind = KernelKind::GradInput;
  for (const auto& [bad, message] : {std::pair{with_operand, "without eager_operand"}, std::pair{mma, "wgmma tile"},
                                     std::pair{input, "eager_fixup is set on a kernel that"}}) {
    try {
      bad.validate();
      ADD_FAILURE() << bad.text() << " validated";
    } catch (const SpecError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(Codegen, RejectsTileOverSharedMemoryLimit) {
  KernelSpec s = spec_for({KernelKind::LseForward, DType::BF16, Arch::SM80, false});
  s.tile = TileConfig{256, 256, 64, 2, 4, 4};
  try {
    generate_kernel(s);
    FAIL() << "a 256x256x64 4-stage tile fits in 163 KiB?";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << e.what();
  }
}

// sm_90a wgmma kernels: every GEMM kind with each tile the runtime picks by default (and the
// narrower one Plan::tile can switch to; the gradient GEMMs also with the tuner's one-consumer tile;
// grad_input's ping-pong default; CTA pairs and ping-pong for each backward GEMM), both 16-bit dtypes, with and without bias and for each
// reduction, assemble without spills, use TMA + wgmma, and contain no subroutine call: a call
// (e.g. the IEEE fp32 division) makes the driver's JIT serialise every wgmma (H200, driver 580:
// dlogits_backward ran at 0.61 of cuBLAS with one).
struct WgmmaCase {
  KernelKind kind;
  DType dtype;
  bool bias;
  Reduction reduction;
  TileConfig tile;
};

std::string wgmma_case_name(const testing::TestParamInfo<WgmmaCase>& info) {
  const WgmmaCase& c = info.param;
  std::string tile = c.tile.text();
  for (char& ch : tile)
    if (ch == '/' || ch == 'x') ch = '_';
  return std::string(kind_name(c.kind)) + "_" + std::string(dtype_name(c.dtype)) + (c.bias ? "_bias_" : "_") +
         std::string(reduction_name(c.reduction)) + "_" + tile;
}

class WgmmaCodegen : public testing::TestWithParam<WgmmaCase> {};

TEST_P(WgmmaCodegen, AssemblesWithoutSpillsOrCalls) {
  if (!testing_ptxas::have_ptxas()) GTEST_SKIP() << "ptxas not found at configure time (install the CUDA toolkit)";
  const WgmmaCase& c = GetParam();
  KernelSpec s = spec_for({c.kind, c.dtype, Arch::SM90A, c.bias});
  s.reduction = c.reduction;
  s.tile = c.tile;
  GeneratedKernel k = generate_kernel(s);
  EXPECT_NE(k.ptx.find("wgmma.mma_async.sync.aligned.m64n" + std::to_string(c.tile.consumer_cols()) + "k16"),
            std::string::npos);
  EXPECT_NE(k.ptx.find("cp.async.bulk.tensor.2d"), std::string::npos);
  EXPECT_NE(k.ptx.find("setmaxnreg.inc"), std::string::npos);
  // Without .minnctapersm ptxas may ignore every setmaxnreg (C7508: "unable to determine
  // register count at entry").
  EXPECT_NE(k.ptx.find(".minnctapersm " + std::to_string(c.tile.ctas_per_sm())), std::string::npos)
      << "setmaxnreg without .minnctapersm";
  EXPECT_EQ(k.ptx.find(".local"), std::string::npos) << "local memory in generated PTX";
  EXPECT_FALSE(std::regex_search(k.ptx, std::regex(R"(\bcall(\.uni)?\b)"))) << "a call in a wgmma kernel";
  EXPECT_EQ(k.ptx.find("div.rn.f32"), std::string::npos) << "IEEE division: a subroutine call in SASS";
  // 16- and 64-bit integer division and remainder are subroutine calls in SASS too (LLVM narrows
  // an i32 division to 16 bits when it can bound both operands).
  EXPECT_FALSE(std::regex_search(k.ptx, std::regex(R"(\b(div|rem)\.[us](16|64)\b)"))) << "a 16/64-bit integer division";
  // CTA pairs: B multicast to both CTAs, releases on both CTAs' barriers, and a cluster barrier
  // after the barriers' initialisation and before any CTA exits.
  const bool cluster = c.tile.cluster > 1;
  EXPECT_EQ(k.ptx.find("multicast::cluster") != std::string::npos, cluster);
  EXPECT_EQ(k.ptx.find("mapa.shared::cluster") != std::string::npos, cluster);
  EXPECT_EQ(k.ptx.find("barrier.cluster.arrive") != std::string::npos, cluster);
  testing_ptxas::expect_assembles_without_spills(k.ptx, Arch::SM90A);
}

std::vector<WgmmaCase> wgmma_cases() {
  const TileConfig narrow{128, 128, 64, 1, 1, 4, 2}, wide4{128, 256, 64, 1, 1, 4, 2}, wide3{128, 256, 64, 1, 1, 3, 2};
  const TileConfig one_consumer{64, 128, 64, 1, 1, 4, 1};  // the tuner's small space: 2 CTAs per SM
  std::vector<WgmmaCase> cases;
  for (DType dtype : {DType::BF16, DType::FP16})
    for (Reduction reduction : {Reduction::Mean, Reduction::None}) {
      for (bool bias : {false, true}) {
        cases.push_back({KernelKind::LseForward, dtype, bias, reduction, narrow});
        cases.push_back({KernelKind::DlogitsBackward, dtype, bias, reduction, default_wgmma_tile(KernelKind::DlogitsBackward)});
        cases.push_back({KernelKind::DlogitsBackward, dtype, bias, reduction, wide4});
      }
      for (KernelKind kind : {KernelKind::GradWeight, KernelKind::GradInput})
        for (const TileConfig& tile : {wide4, wide3, narrow, one_consumer}) cases.push_back({kind, dtype, false, reduction, tile});
      TileConfig pingpong{64, 256, 64, 1, 1, 4, 2};  // the default grad_input tile
      pingpong.pingpong = true;
      cases.push_back({KernelKind::GradInput, dtype, false, reduction, pingpong});
    }
  // CTA pairs (TileConfig::cluster) and ping-pong consumers: each backward GEMM, both B layouts
  // (K-major in dlogits).
  // 128 x 128 ping-pong: two m64 blocks per consumer, in both dtypes and reductions.
  TileConfig pingpong{64, 256, 64, 1, 1, 5, 2}, pingpong_pair{64, 128, 64, 1, 1, 4, 2, 2},
      pingpong_tall{128, 128, 64, 1, 1, 5, 2};
  pingpong.pingpong = pingpong_pair.pingpong = pingpong_tall.pingpong = true;
  for (TileConfig tile : {wide4, narrow, pingpong, pingpong_pair}) {
    if (!tile.pingpong) tile.cluster = 2;
    for (KernelKind kind : {KernelKind::DlogitsBackward, KernelKind::GradWeight, KernelKind::GradInput})
      if (!(kind == KernelKind::DlogitsBackward && tile == pingpong))  // dlogits' default: above
        cases.push_back({kind, DType::BF16, kind == KernelKind::DlogitsBackward, Reduction::Mean, tile});
  }
  // CTA pairs along N (sharing A) for the two gradient GEMMs, both operand layouts of A (dzᵀ read
  // K-major in grad_weight, MN-major in grad_input).
  TileConfig pair_n{128, 192, 64, 1, 1, 4, 2, 2}, pair_n_wide{128, 256, 64, 1, 1, 4, 2, 2};
  pair_n.cluster_n = pair_n_wide.cluster_n = true;
  for (const TileConfig& tile : {pair_n, pair_n_wide})
    for (DType dtype : {DType::BF16, DType::FP16})
      for (Reduction reduction : {Reduction::Mean, Reduction::None})
        for (KernelKind kind : {KernelKind::GradWeight, KernelKind::GradInput})
          cases.push_back({kind, dtype, false, reduction, tile});
  for (DType dtype : {DType::BF16, DType::FP16})
    for (Reduction reduction : {Reduction::Mean, Reduction::None})
      for (KernelKind kind : {KernelKind::DlogitsBackward, KernelKind::GradWeight, KernelKind::GradInput})
        cases.push_back({kind, dtype, kind == KernelKind::DlogitsBackward, reduction, pingpong_tall});
  // eager_logits (dlogits_backward's tile in eager mode): its default ping-pong, 128 x 256 with two
  // cooperative consumers, alone and on a CTA pair along M (sharing W's tile); with a bias the
  // cooperative one (a bias takes neither ping-pong nor clusters: Plan::tile).
  TileConfig logits_pair = wide4;
  logits_pair.cluster = 2;
  for (DType dtype : {DType::BF16, DType::FP16}) {
    for (const TileConfig& tile : {pingpong, wide4, logits_pair})
      cases.push_back({KernelKind::EagerLogits, dtype, false, Reduction::Mean, tile});
    cases.push_back({KernelKind::EagerLogits, dtype, true, Reduction::Mean, wide4});
  }
  // Split along N, 128 x 256 (each consumer 128 x 128): every backward GEMM, dlogits with and
  // without a bias (two epilogues).
  TileConfig split_wide{128, 256, 64, 1, 1, 4, 2};
  split_wide.split_n = true;
  for (KernelKind kind : {KernelKind::DlogitsBackward, KernelKind::GradWeight, KernelKind::GradInput})
    cases.push_back({kind, DType::BF16, false, Reduction::Mean, split_wide});
  cases.push_back({KernelKind::DlogitsBackward, DType::BF16, true, Reduction::Mean, split_wide});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(DefaultTiles, WgmmaCodegen, testing::ValuesIn(wgmma_cases()), wgmma_case_name);

// A persistent launch whose tiles would overflow the int32 tile index the device walk counts in is
// an OutOfResources naming the resource and both numbers, before anything is launched.
TEST(TileScheduler, NamesALaunchOfMoreTilesThanTheWalkCountsAsOutOfResources) {
  TileConfig tile;
  tile.consumers = 2;  // a wgmma tile: one persistent grid
  tile.cluster = 2;
  const TileScheduler scheduler(tile);
  EXPECT_EQ(scheduler.grid(int64_t{1} << 20, int64_t{1} << 10, 132, "grad_weight"),
            (std::pair<int64_t, int64_t>{132, 1}));
  const std::string message =
      testing_errors::resource_error([&] { scheduler.grid(int64_t{1} << 21, int64_t{1} << 10, 132, "grad_weight"); });
  EXPECT_EQ(message.rfind("tiles in one launch: 2147483648 over 2147483515: ", 0), 0u) << message;
  EXPECT_NE(message.find("grad_weight tiles in one launch"), std::string::npos) << message;
}

}  // namespace
}  // namespace lfce
