// Tile policy (runtime/tile_policy.cpp): default tiles and their fallbacks on smaller devices, the
// rules Plan::tile applies, and the wave-efficiency helper they share.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "compiler/errors.h"
#include "compiler/kernel_kind.h"
#include "runtime/plan.h"
#include "templates/templates.h"
#include "tests/log_capture.h"
#include "tests/runtime/plan_test_util.h"
#include "tests/spec_error.h"

namespace lfce::runtime {
namespace {

using testing_errors::resource_error;
using testing_errors::spec_error;

// Padding of partial tiles and the last wave's idle CTAs both count against the launch.
TEST(Plan, WaveEfficiencyCountsPaddingAndTheLastWavesIdleCtas) {
  EXPECT_DOUBLE_EQ(wave_efficiency(8, 8, 1.0, 4), 1.0);         // two whole waves
  EXPECT_DOUBLE_EQ(wave_efficiency(10, 10, 1.0, 4), 10.0 / 12);  // a third wave half empty
  EXPECT_DOUBLE_EQ(wave_efficiency(100, 2, 64.0, 2), 100.0 / 128);  // one wave, the second tile padded
  // gemma2-2b's grad_input rows (N = 8192, H = 2304) on 132 SMs: 128 x 192 is busier than 128 x 256.
  const double narrow = wave_efficiency(8192.0 * 2304, 64 * 12, 128.0 * 192, 132);
  const double wide = wave_efficiency(8192.0 * 2304, 64 * 9, 128.0 * 256, 132);
  EXPECT_GT(narrow * kTile192Discount, wide);
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
  const std::string message = resource_error([&] { Plan(p, Arch::SM80, Tuning{}, DeviceLimits{1, 0}); });
  EXPECT_EQ(message.rfind("shared memory per block: ", 0), 0u) << message;  // resource, required, limit
  EXPECT_NE(message.find(" over 1: "), std::string::npos) << message;
  EXPECT_NE(message.find("shared memory per block = 1 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("--smem-per-block"), std::string::npos) << message;
  const std::size_t at = message.find("at least ");
  ASSERT_NE(at, std::string::npos) << message;
  const int64_t smallest = std::stoll(message.substr(at + 9));
  EXPECT_GT(smallest, 1);
  const Plan plan(p, Arch::SM80, Tuning{}, DeviceLimits{smallest, 0});
  for (const KernelSpec& spec : plan.launched_specs()) EXPECT_LE(kernel_smem_bytes(spec), smallest) << spec.text();
  EXPECT_EQ(resource_error([&] { Plan(p, Arch::SM80, Tuning{}, DeviceLimits{smallest - 1, 0}); })
                .rfind("shared memory per block: " + std::to_string(smallest) + " over " +
                           std::to_string(smallest - 1) + ": ",
                       0),
            0u);
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

TEST(Plan, RejectsANegativeTunedTileNamingIt) {
  Tuning tuning;
  tuning.tiles[KernelKind::LseForward] = TileConfig{-64, 256, 64, 1, 4, 2};
  // ceil(64 / -64) = 0 row blocks: once divided the CTA target by zero (SIGFPE).
  const std::string message = spec_error([&] { Plan(problem(llama3(64)), Arch::SM90A, tuning); });
  EXPECT_NE(message.find("tile BM = -64 is outside 1..1024"), std::string::npos) << message;
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

}  // namespace
}  // namespace lfce::runtime
