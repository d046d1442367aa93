#include "compiler/kernel_spec.h"

#include <gtest/gtest.h>

#include <set>

#include "compiler/errors.h"

namespace lfce {
namespace {

KernelSpec sample() {
  KernelSpec s;
  s.kind = KernelKind::DlogitsBackward;
  s.vocab = 128256;
  s.hidden = 4096;
  s.chunk = 16384;
  s.mode = Mode::Eager;
  s.dtype = DType::FP16;
  s.targets = IndexType::I32;
  s.reduction = Reduction::None;
  s.bias = true;
  s.arch = Arch::SM80;
  s.tile = TileConfig{64, 128, 64, 2, 2, 4};
  return s;
}

TEST(KernelSpec, TextRoundTrips) {
  KernelSpec s = sample();
  EXPECT_EQ(KernelSpec::parse(s.text()), s);
  EXPECT_EQ(KernelSpec::parse(s.text()).text(), s.text());
  EXPECT_EQ(s.text(),
            "dlogits_backward;V=128256;H=4096;chunk=16384;mode=eager;dtype=fp16;targets=i32;reduction=none;"
            "bias=1;arch=sm_80;tile=64x128x64/2x2/s4");
}

TEST(KernelSpec, HashIsStableAcrossRuns) {
  // FNV-1a of the canonical text: a fixed value, so cache keys survive restarts.
  KernelSpec s;
  EXPECT_EQ(s.hash(), KernelSpec(s).hash());
  EXPECT_EQ(s.text(), "lse_forward;V=0;H=0;chunk=0;mode=recompute;dtype=bf16;targets=i64;reduction=mean;bias=0;"
                      "arch=sm_90a;tile=128x128x64/2x4/s3");
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s.text()) h = (h ^ c) * 1099511628211ull;
  EXPECT_EQ(s.hash(), h);
}

TEST(KernelSpec, EveryFieldChangesTheKey) {
  KernelSpec base = sample();
  std::vector<KernelSpec> variants(12, base);
  variants[0].kind = KernelKind::GradInput;
  variants[1].vocab += 1;
  variants[2].hidden += 8;
  variants[3].chunk += 1;
  variants[4].mode = Mode::Recompute;
  variants[5].dtype = DType::BF16;
  variants[6].targets = IndexType::I64;
  variants[7].reduction = Reduction::Sum;
  variants[8].bias = false;
  variants[9].arch = Arch::SM90A;
  variants[10].tile.stages = 2;
  variants[11].tile.bk = 32;
  std::set<std::string> texts{base.text()};
  std::set<uint64_t> hashes{base.hash()};
  for (const KernelSpec& v : variants) {
    EXPECT_NE(v, base);
    texts.insert(v.text());
    hashes.insert(v.hash());
  }
  EXPECT_EQ(texts.size(), variants.size() + 1);
  EXPECT_EQ(hashes.size(), variants.size() + 1);
}

TEST(KernelSpec, ParseNamesTheBadField) {
  std::string good = sample().text();
  auto message = [](const std::string& text) {
    try {
      KernelSpec::parse(text);
    } catch (const SpecError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("lse_backward;" + good.substr(good.find(';') + 1)).find("lse_backward"), std::string::npos);
  std::string bad_dtype = good;
  bad_dtype.replace(bad_dtype.find("fp16"), 4, "fp8");
  EXPECT_NE(message(bad_dtype).find("'dtype' has value 'fp8'"), std::string::npos);
  std::string bad_v = good;
  bad_v.replace(bad_v.find("V=128256"), 8, "V=12x");
  EXPECT_NE(message(bad_v).find("'V' is not an integer"), std::string::npos);
  EXPECT_NE(message(good + ";extra=1").find("unknown field 'extra'"), std::string::npos);
  std::string no_arch = good;
  no_arch.erase(no_arch.find(";arch=sm_80"), 11);
  EXPECT_NE(message(no_arch).find("lacks field 'arch'"), std::string::npos);
}

TEST(KernelSpec, ValidateRejectsUnalignedHidden) {
  KernelSpec s = sample();
  s.hidden = 4100;
  try {
    s.validate();
    FAIL() << "hidden=4100 accepted for fp16";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos) << e.what();
  }
}

TEST(KernelSpec, ValidateRejectsTileThatDoesNotSplitOverWarps) {
  KernelSpec s = sample();
  s.tile = TileConfig{128, 128, 64, 3, 4, 3};
  EXPECT_THROW(s.validate(), SpecError);
}

TEST(Arch, ParseRejectsUnknownArchNamingIt) {
  try {
    parse_arch("sm_70");
    FAIL();
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("sm_70"), std::string::npos);
  }
  EXPECT_EQ(parse_arch("sm_90a"), Arch::SM90A);
  EXPECT_EQ(arch_for_compute_capability(9, 0), Arch::SM90A);
  EXPECT_EQ(arch_for_compute_capability(8, 6), Arch::SM80);
  EXPECT_THROW(arch_for_compute_capability(7, 5), SpecError);
}

}  // namespace
}  // namespace lfce
