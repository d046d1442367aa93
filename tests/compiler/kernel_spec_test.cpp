#include "compiler/kernel_spec.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "tests/spec_error.h"

namespace lfce {
namespace {

using testing_errors::spec_error;

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

TEST(KernelSpec, WgmmaTileTextRoundTrips) {
  KernelSpec s = sample();
  s.arch = Arch::SM90A;
  s.dtype = DType::BF16;
  s.tile = TileConfig{128, 256, 64, 1, 1, 4, 2};
  EXPECT_EQ(s.tile.text(), "128x256x64/wg2/s4");
  EXPECT_EQ(s.tile.threads(), 384);
  EXPECT_EQ(KernelSpec::parse(s.text()), s);
  EXPECT_NO_THROW(s.validate());
  EXPECT_EQ(TileConfig::parse("64x128x64/wg1/s4").ctas_per_sm(), 2);
  for (const char* bad : {"128x256x64/wg/s4", "128x256x64/wgx/s4", "128x256x64/wg0/s4", "128x256x64/wg2/s4x"})
    EXPECT_NE(spec_error([&] { TileConfig::parse(bad); }).find(bad), std::string::npos) << bad;
}

// The loss options: each in the text only when not its default (none), so the keys and the
// cached kernels of specs without it are unchanged.
struct LossOption {
  const char* name;
  float KernelSpec::*field;
  float none;
  std::vector<float> good, bad;  // in range; out of range (NaN included)
  std::vector<KernelKind> readers, others;
};

std::vector<LossOption> loss_options() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  return {
      {"softcap", &KernelSpec::softcap, 0.f, {30.f, 0.5f, 3.1415927f}, {-1.f, 2e6f, nan, inf},
       {KernelKind::LseForward, KernelKind::DlogitsBackward},
       {KernelKind::GradWeight, KernelKind::GradInput, KernelKind::LseCombine}},
      {"temperature", &KernelSpec::temperature, 1.f, {0.7f, 2.f, 1e-6f, 1e6f}, {0.f, -1.f, 1e-7f, 2e6f, nan, inf},
       {KernelKind::LseForward, KernelKind::DlogitsBackward},
       {KernelKind::GradWeight, KernelKind::GradInput, KernelKind::LseCombine, KernelKind::LossReduce}},
      {"z_loss_scale", &KernelSpec::z_loss_scale, 0.f, {1e-4f, 0.5f, 1e6f}, {-1e-4f, 2e6f, nan, inf},
       {KernelKind::LseCombine, KernelKind::DlogitsBackward},
       {KernelKind::LseForward, KernelKind::GradWeight, KernelKind::GradInput, KernelKind::LossReduce}},
      {"label_smoothing", &KernelSpec::label_smoothing, 0.f, {0.1f, 0.5f, 1.f}, {-0.1f, 1.5f, nan, inf},
       {KernelKind::LseForward, KernelKind::LseCombine, KernelKind::DlogitsBackward},
       {KernelKind::GradWeight, KernelKind::GradInput, KernelKind::LossReduce}},
  };
}

// Class weights: a flag, ";class_weight=1" when set; on the kinds that read the weights only
// (lse_forward only with label smoothing).
TEST(KernelSpec, ClassWeightIsPartOfTheTextOnlyWhenSetAndOnlyWhereRead) {
  KernelSpec s = sample();
  EXPECT_EQ(s.text().find("class_weight"), std::string::npos);
  s.class_weight = true;
  EXPECT_EQ(s.text().substr(s.text().size() - 15), ";class_weight=1");
  EXPECT_EQ(KernelSpec::parse(s.text()), s);
  EXPECT_NO_THROW(s.validate());
  const std::string text = s.text();
  for (const char* bad : {"0", "2", "true", ""}) {
    const std::string t = text.substr(0, text.size() - 1) + bad;
    EXPECT_NE(spec_error([&] { KernelSpec::parse(t); }).find("class_weight"), std::string::npos) << t;
  }
  for (KernelKind kind : {KernelKind::LseCombine, KernelKind::LossReduce, KernelKind::DlogitsBackward}) {
    s.kind = kind;
    EXPECT_NO_THROW(s.validate()) << kind_name(kind);
    EXPECT_TRUE(s.normalised().class_weight) << kind_name(kind);
  }
  for (KernelKind kind : {KernelKind::GradWeight, KernelKind::GradInput, KernelKind::GradBias}) {
    s.kind = kind;
    EXPECT_FALSE(s.normalised().class_weight) << kind_name(kind);
    EXPECT_NE(spec_error([&] { s.validate(); }).find("class_weight is set on a kernel that reads no class weights"),
              std::string::npos)
        << kind_name(kind);
  }
  s.kind = KernelKind::LseForward;
  EXPECT_NE(spec_error([&] { s.validate(); }).find("class_weight is set on lse_forward without label smoothing"),
            std::string::npos);
  EXPECT_FALSE(s.normalised().class_weight);
  s.label_smoothing = 0.1f;
  EXPECT_NO_THROW(s.validate());
  EXPECT_TRUE(s.normalised().class_weight);
}

TEST(KernelSpec, LossOptionsArePartOfTheTextOnlyWhenSet) {
  for (const LossOption& o : loss_options()) {
    SCOPED_TRACE(o.name);
    KernelSpec s = sample();
    const std::string field = std::string(";") + o.name + "=";
    EXPECT_EQ(s.*o.field, o.none);
    EXPECT_EQ(s.text().find(o.name), std::string::npos);  // keys of kernels without it unchanged
    for (float value : o.good) {
      s.*o.field = value;
      EXPECT_NE(s.text().find(field), std::string::npos) << s.text();
      EXPECT_EQ(KernelSpec::parse(s.text()), s) << s.text();
      EXPECT_NO_THROW(s.validate()) << s.text();
    }
    const std::string text = s.text();
    const std::string prefix = text.substr(0, text.find(field) + 1);
    for (const std::string& bad : std::vector<std::string>{"30.0", "abc", "", "30x", "1e-4", float_text(o.none)}) {
      const std::string t = prefix + o.name + "=" + bad;
      const std::string message = spec_error([&] { KernelSpec::parse(t); });
      EXPECT_NE(message.find(std::string("'") + o.name + "'"), std::string::npos) << t << ": " << message;
      EXPECT_NE(message.find("'" + bad + "'"), std::string::npos) << t << ": " << message;
    }
    for (float value : o.bad) {
      s.*o.field = value;
      const std::string message = spec_error([&] { s.validate(); });
      EXPECT_NE(message.find(std::string(o.name) + " = " + float_text(value) + " is outside"), std::string::npos)
          << message;
    }
  }
}

TEST(KernelSpec, LossOptionsAreReadOnlyByTheKernelsTheyChange) {
  for (const LossOption& o : loss_options()) {
    KernelSpec s = sample();
    s.*o.field = o.good[0];
    for (KernelKind kind : o.readers) {
      s.kind = kind;
      EXPECT_EQ(s.normalised().*o.field, o.good[0]) << o.name << " " << kind_name(kind);
      EXPECT_NO_THROW(s.validate()) << s.text();
    }
    for (KernelKind kind : o.others) {
      s.kind = kind;
      EXPECT_EQ(s.normalised().*o.field, o.none) << o.name << " " << kind_name(kind);
      EXPECT_NE(spec_error([&] { s.validate(); }).find(std::string(o.name) + " is set on a kernel that"),
                std::string::npos)
          << o.name << " " << kind_name(kind);
    }
  }
}

// Adding into an fp32 gradient buffer: ";accumulate=1", on grad_weight and grad_bias only.
TEST(KernelSpec, AccumulateIsPartOfTheTextOnlyWhenSetAndOnlyOnTheGradientKernels) {
  KernelSpec s = sample();
  s.kind = KernelKind::GradWeight;
  s = s.normalised();
  EXPECT_EQ(s.text().find("accumulate"), std::string::npos);
  s.accumulate = true;
  EXPECT_EQ(s.text().substr(s.text().size() - 13), ";accumulate=1");
  EXPECT_EQ(KernelSpec::parse(s.text()), s);
  EXPECT_NO_THROW(s.validate());
  const std::string text = s.text();
  EXPECT_NE(spec_error([&] { KernelSpec::parse(text.substr(0, text.size() - 1) + "0"); }).find("'accumulate' must be 1"),
            std::string::npos);
  for (KernelKind kind : {KernelKind::LseForward, KernelKind::DlogitsBackward, KernelKind::GradInput}) {
    KernelSpec other = sample();
    other.kind = kind;
    other.accumulate = true;
    EXPECT_FALSE(other.normalised().accumulate) << kind_name(kind);
    EXPECT_NE(spec_error([&] { other.validate(); }).find("accumulate is set on a kernel that writes no weight or bias"),
              std::string::npos)
        << kind_name(kind);
  }
}

// The extra outputs' flags: ";entropy=1" ";argmax=1" ";logprob=1" ";lse_grad=1", each in the text only
// when set, read back, refused where its kind does not read it (naming the flag), and any value
// other than 1 named.
TEST(KernelSpec, ExtraOutputFlagsArePartOfTheTextOnlyWhenSetAndOnlyWhereRead) {
  struct Flag {
    const char* name;
    bool KernelSpec::*member;
    KernelKind reader, other;
  };
  const Flag flags[] = {{"entropy", &KernelSpec::entropy, KernelKind::LseForward, KernelKind::GradInput},
                        {"argmax", &KernelSpec::argmax, KernelKind::LseCombine, KernelKind::DlogitsBackward},
                        {"logprob", &KernelSpec::logprob, KernelKind::LseCombine, KernelKind::LseForward},
                        {"lse_grad", &KernelSpec::lse_grad, KernelKind::DlogitsBackward, KernelKind::LseCombine}};
  for (const Flag& f : flags) {
    SCOPED_TRACE(f.name);
    KernelSpec s = sample();
    s.kind = f.reader;
    s.dtype = DType::BF16;
    s = s.normalised();
    EXPECT_EQ(s.text().find(f.name), std::string::npos);
    s.*f.member = true;
    const std::string text = s.text();
    EXPECT_EQ(text.substr(text.rfind(';')), std::string(";") + f.name + "=1");
    EXPECT_EQ(KernelSpec::parse(text), s);
    EXPECT_NO_THROW(s.validate());
    EXPECT_NE(spec_error([&] { KernelSpec::parse(text.substr(0, text.size() - 1) + "2"); })
                  .find(std::string("'") + f.name + "' must be 1"),
              std::string::npos);
    KernelSpec other = sample();
    other.kind = f.other;
    other.*f.member = true;
    EXPECT_FALSE(other.normalised().*f.member);
    EXPECT_NE(spec_error([&] { other.validate(); }).find(std::string(f.name) + " is set on a kernel that"),
              std::string::npos);
  }
  // dlogits_backward takes the entropy and logprob rows with lse_grad only, and refuses lse_grad for fp16.
  KernelSpec d = sample();
  d.kind = KernelKind::DlogitsBackward;
  d.dtype = DType::BF16;
  d.entropy = true;
  EXPECT_NE(spec_error([&] { d.validate(); }).find("entropy is set on a kernel that"), std::string::npos);
  d.lse_grad = true;
  EXPECT_NO_THROW(d.validate());
  d.dtype = DType::FP16;
  EXPECT_NE(spec_error([&] { d.validate(); }).find("lse_grad needs bf16 or fp32, got fp16"), std::string::npos);
}

TEST(KernelSpec, AllLossOptionsTogetherRoundTrip) {
  KernelSpec s = sample();
  s.softcap = 30.f;
  s.temperature = 0.7f;
  s.z_loss_scale = 1e-4f;
  s.label_smoothing = 0.1f;
  s.class_weight = true;
  EXPECT_EQ(s.text().substr(s.text().find(";softcap")),
            ";softcap=30;temperature=0.7;z_loss_scale=1e-04;label_smoothing=0.1;class_weight=1");
  EXPECT_EQ(KernelSpec::parse(s.text()), s);
  EXPECT_NO_THROW(s.validate());
}

TEST(KernelSpec, ClusterAndPingPongTileTextsRoundTrip) {
  for (const char* text : {"128x256x64/wg2/s4/c2", "64x256x64/wg2/s5/pp", "64x128x64/wg2/s4/c2/pp", "192x192x64/wg2/s4/sn",
                           "128x192x64/wg2/s4/c2n", "128x256x64/wg2/s4/c2n/pp"}) {
    const TileConfig t = TileConfig::parse(text);
    EXPECT_EQ(t.text(), text);
    EXPECT_EQ(t.threads(), 384) << text;
  }
  EXPECT_EQ(TileConfig::parse("128x256x64/wg2/s4/c2").cluster, 2);
  EXPECT_TRUE(TileConfig::parse("64x256x64/wg2/s5/pp").pingpong);
  const TileConfig split = TileConfig::parse("192x192x64/wg2/s4/sn");
  EXPECT_TRUE(split.split_n);
  EXPECT_FALSE(split.pingpong);
  // Each consumer: all 192 rows (three m64 blocks) of 96 columns, 3 x 48 accumulators.
  EXPECT_EQ(split.consumer_rows(), 192);
  EXPECT_EQ(split.consumer_cols(), 96);
  EXPECT_EQ(split.accumulators(), 144);
  EXPECT_FALSE(TileConfig::parse("192x192x64/wg2/s4") == split);
  EXPECT_FALSE(TileConfig::parse("128x256x64/wg2/s4/c2") == TileConfig::parse("128x256x64/wg2/s4"));
  const TileConfig along_n = TileConfig::parse("128x192x64/wg2/s4/c2n");
  EXPECT_EQ(along_n.cluster, 2);
  EXPECT_TRUE(along_n.cluster_n);
  EXPECT_FALSE(TileConfig::parse("128x192x64/wg2/s4/c2").cluster_n);
  EXPECT_FALSE(along_n == TileConfig::parse("128x192x64/wg2/s4/c2"));
  // Suffixes only after a wgmma tile, cluster before ping-pong, one digit of cluster, n only after it.
  for (const char* bad : {"128x128x64/2x4/s3/c2", "128x128x64/2x4/s3/pp", "64x256x64/wg2/s5/pp/c2",
                          "128x256x64/wg2/s4/c", "128x256x64/wg2/s4/c12", "128x256x64/wg2/s4/x2", "64x256x64/wg2/s5/ppp",
                          "128x256x64/wg2/s4/c2m", "128x256x64/wg2/s4/cn", "128x256x64/wg2/s4/c2nn", "128x256x64/wg2/s4/n"})
    EXPECT_NE(spec_error([&] { TileConfig::parse(bad); }).find(bad), std::string::npos) << bad;
  // A cluster of one CTA has no direction.
  EXPECT_NE(spec_error([&] { TileConfig::parse("128x256x64/wg2/s4/c1n").check_range(); }).find("with cluster_n (\"/c1n\"): pairing along N needs a cluster"),
            std::string::npos);
}

TEST(KernelSpec, ValidateNamesWhatClustersAndPingPongNeed) {
  auto error_of = [&](KernelKind kind, TileConfig tile) {
    KernelSpec s = sample();
    s.kind = kind;
    s.arch = Arch::SM90A;
    s.dtype = DType::BF16;
    s.tile = tile;
    return spec_error([&] { s.validate(); });
  };
  auto pingpong = [](TileConfig t) {
    t.pingpong = true;
    return t;
  };
  EXPECT_EQ(error_of(KernelKind::GradWeight, {128, 256, 64, 1, 1, 4, 2, 2}), "no error");
  EXPECT_EQ(error_of(KernelKind::GradInput, pingpong({64, 256, 64, 1, 1, 5, 2})), "no error");
  EXPECT_NE(error_of(KernelKind::LseForward, {128, 256, 64, 1, 1, 4, 2, 2}).find("not lse_forward"), std::string::npos);
  EXPECT_NE(error_of(KernelKind::LseForward, pingpong({64, 256, 64, 1, 1, 5, 2})).find("not lse_forward"),
            std::string::npos);
  EXPECT_NE(error_of(KernelKind::GradWeight, {128, 192, 64, 1, 1, 4, 2, 2}).find("multiple of 128, got 192"),
            std::string::npos);
  EXPECT_EQ(error_of(KernelKind::DlogitsBackward, pingpong({128, 128, 64, 1, 1, 5, 2})), "no error");
  EXPECT_NE(error_of(KernelKind::GradWeight, pingpong({192, 128, 64, 1, 1, 4, 2})).find("BM = 64 or 128"),
            std::string::npos);
  // Two m64 blocks of 128 columns each are 128 accumulators per thread; of 256, twice that.
  EXPECT_NE(error_of(KernelKind::GradWeight, pingpong({128, 256, 64, 1, 1, 4, 2})).find("256 fp32 accumulators, over 128"),
            std::string::npos);
  EXPECT_NE(error_of(KernelKind::GradWeight, pingpong({64, 256, 64, 1, 1, 4, 1})).find("two consumers"),
            std::string::npos);
  auto split = [](TileConfig t) {
    t.split_n = true;
    return t;
  };
  EXPECT_EQ(error_of(KernelKind::DlogitsBackward, split({128, 256, 64, 1, 1, 4, 2})), "no error");
  // cuBLAS's 192 x 192: three m64 blocks of 96 columns, 144 accumulators a thread.
  EXPECT_NE(error_of(KernelKind::DlogitsBackward, split({192, 192, 64, 1, 1, 4, 2})).find("144 fp32 accumulators, over 128"),
            std::string::npos);
  EXPECT_EQ(error_of(KernelKind::GradInput, split({128, 256, 64, 1, 1, 4, 2})), "no error");
  // grad_weight reads B (x) MN-major: 96 columns a consumer are not whole 64-element boxes.
  EXPECT_NE(error_of(KernelKind::GradWeight, split({192, 192, 64, 1, 1, 4, 2})).find("BN / 2 = 96 columns"),
            std::string::npos);
  EXPECT_NE(error_of(KernelKind::LseForward, split({192, 192, 64, 1, 1, 4, 2})).find("not lse_forward"),
            std::string::npos);
  EXPECT_NE(error_of(KernelKind::DlogitsBackward, split({320, 128, 64, 1, 1, 4, 2})).find("up to 256"),
            std::string::npos);
  EXPECT_NE(error_of(KernelKind::DlogitsBackward, split({128, 256, 64, 1, 1, 4, 2, 2})).find("no CTA pairs"),
            std::string::npos);
  TileConfig both = split(pingpong({128, 128, 64, 1, 1, 4, 2}));
  EXPECT_NE(error_of(KernelKind::DlogitsBackward, both).find("choose one"), std::string::npos);
  // 256 x 256 split: 4 m64 blocks of 128 columns, 256 accumulators a thread.
  EXPECT_NE(error_of(KernelKind::DlogitsBackward, split({256, 256, 64, 1, 1, 3, 2})).find("256 fp32 accumulators, over 128"),
            std::string::npos);
  EXPECT_NE(error_of(KernelKind::GradWeight, {128, 256, 64, 1, 1, 4, 2, 3}).find("cluster"), std::string::npos);
  // Along N: each CTA multicasts half of A, so BM (not BN) is whole 64-row shares; only the
  // gradient GEMMs (their epilogues write no column past N).
  auto along_n = [](TileConfig t) {
    t.cluster_n = true;
    return t;
  };
  EXPECT_EQ(error_of(KernelKind::GradWeight, along_n({128, 192, 64, 1, 1, 4, 2, 2})), "no error");
  EXPECT_EQ(error_of(KernelKind::GradInput, along_n({128, 256, 64, 1, 1, 4, 2, 2})), "no error");
  EXPECT_EQ(error_of(KernelKind::GradInput, along_n(pingpong({128, 128, 64, 1, 1, 4, 2, 2}))), "no error");
  EXPECT_NE(error_of(KernelKind::GradInput, along_n(pingpong({64, 256, 64, 1, 1, 4, 2, 2})))
                .find("along N needs BM a multiple of 128, got 64"),
            std::string::npos);
  EXPECT_NE(error_of(KernelKind::DlogitsBackward, along_n({128, 256, 64, 1, 1, 4, 2, 2}))
                .find("clusters along N serve grad_weight and grad_input, not dlogits_backward"),
            std::string::npos);
  EXPECT_NE(error_of(KernelKind::GradWeight, {128, 128, 64, 2, 4, 3, 0, 2}).find("need a wgmma tile"),
            std::string::npos);
}

TEST(KernelSpec, ValidateNamesWhatAWgmmaTileNeeds) {
  KernelSpec s = sample();
  s.arch = Arch::SM90A;
  s.dtype = DType::BF16;
  auto error_of = [&](TileConfig tile, Arch arch = Arch::SM90A, DType dtype = DType::BF16) {
    KernelSpec t = s;
    t.tile = tile;
    t.arch = arch;
    t.dtype = dtype;
    return spec_error([&] { t.validate(); });
  };
  EXPECT_NE(error_of({128, 256, 64, 1, 1, 4, 2}, Arch::SM80).find("needs arch sm_90a"), std::string::npos);
  EXPECT_NE(error_of({128, 256, 64, 1, 1, 4, 2}, Arch::SM90A, DType::FP32).find("not fp32"), std::string::npos);
  EXPECT_NE(error_of({128, 256, 128, 1, 1, 4, 2}).find("BK = 64"), std::string::npos);
  EXPECT_NE(error_of({256, 256, 64, 1, 1, 4, 2}).find("BM = 64 x consumers = 128, got 256"), std::string::npos);
  EXPECT_NE(error_of({128, 320, 64, 1, 1, 4, 2}).find("up to 256, got 320"), std::string::npos);
  EXPECT_NE(error_of({128, 256, 64, 1, 1, 1, 2}).find("at least 2 stages"), std::string::npos);
  EXPECT_NE(error_of({128, 256, 64, 1, 1, 4, 3}).find("consumers = 3 is outside 0..2"), std::string::npos);
}

TEST(KernelSpec, EveryFieldChangesTheKey) {
  KernelSpec base = sample();
  std::vector<KernelSpec> variants(29, base);
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
  variants[12].tile.cluster = 2;
  variants[13].tile.pingpong = true;
  variants[14].softcap = 30.f;
  variants[15].temperature = 0.7f;
  variants[16].z_loss_scale = 1e-4f;
  variants[17].label_smoothing = 0.1f;
  variants[18].class_weight = true;
  variants[19].accumulate = true;
  variants[20].token_scaling = true;
  variants[21].entropy = true;
  variants[22].argmax = true;
  variants[23].logprob = true;
  variants[24].lse_grad = true;
  variants[25].shift = true;
  variants[26].eager_operand = true;
  variants[27].tile.cluster = 2;
  variants[27].tile.cluster_n = true;  // (against variants[12]: only the "n" differs)
  variants[28].eager_fixup = true;
  std::set<std::string> texts{base.text()};
  for (const KernelSpec& v : variants) {
    EXPECT_NE(v, base);
    texts.insert(v.text());
  }
  EXPECT_EQ(texts.size(), variants.size() + 1);
}

// Every line of compiler/spec_options.def: set to a value other than none, the option is in the
// canonical text under its name and parses back; a kind whose code reads it keeps it through
// normalised() and read_options_only(); a kind that reads it nowhere is refused by validate()
// naming it, and normalised() clears it. A line added to the table is covered without a test edit.
TEST(KernelSpec, EveryOptionOfTheTableIsInTheTextReadWhereItsBitSaysAndNamedWhereNot) {
  int rows = 0;
  auto check = [&](const char* name, uint32_t bit, auto set, auto is_set) {
    ++rows;
    bool read_somewhere = false, unread_somewhere = false;
    for (const KernelKindInfo& info : kKernelKinds) {
      KernelSpec s = sample();
      s.kind = info.kind;
      s.dtype = DType::BF16;
      s.reduction = Reduction::Mean;
      s.class_weight = true;  // (what makes lse_forward, loss_reduce and dlogits read their options)
      s.label_smoothing = 0.1f;
      s.z_loss_scale = 1e-4f;
      s.lse_grad = true;
      set(s);
      const std::string text = s.text();
      EXPECT_NE(text.find(std::string(";") + name + "="), std::string::npos) << text;
      EXPECT_EQ(KernelSpec::parse(text), s) << text;
      if (s.fields_read() & bit) {
        read_somewhere = true;
        EXPECT_TRUE(is_set(s.normalised())) << name << " on " << info.name;
        EXPECT_TRUE(is_set(s.read_options_only())) << name << " on " << info.name;
      } else {
        unread_somewhere = true;
        EXPECT_FALSE(is_set(s.normalised())) << name << " on " << info.name;
        EXPECT_FALSE(is_set(s.read_options_only())) << name << " on " << info.name;
        KernelSpec alone = s.read_options_only();  // (the other options only where read)
        set(alone);
        EXPECT_NE(spec_error([&] { alone.validate(); }).find(name), std::string::npos) << name << " on " << info.name;
      }
    }
    EXPECT_TRUE(read_somewhere) << name << ": no kind reads it";
    EXPECT_TRUE(unread_somewhere) << name << ": every kind reads it";
  };
#define LFCE_SPEC_FLOAT(member, bit, none, lowest, highest, unread)                                      \
  check(                                                                                                 \
      #member, bit, [](KernelSpec& s) { s.member = (none) == (highest) ? (lowest) : (highest); },        \
      [](const KernelSpec& s) { return s.member != (none); });
#define LFCE_SPEC_FLAG(member, bit, absent, unread) \
  check(#member, bit, [](KernelSpec& s) { s.member = true; }, [](const KernelSpec& s) { return s.member; });
  constexpr float kMaxSoftcap = KernelSpec::kMaxSoftcap, kMinTemperature = KernelSpec::kMinTemperature,
                  kMaxTemperature = KernelSpec::kMaxTemperature, kMaxZLossScale = KernelSpec::kMaxZLossScale;
#include "compiler/spec_options.def"
  EXPECT_EQ(rows, 14);  // four floats and ten flags
}

// eager_operand: only on the kinds that read it (eager_dz, grad_weight, grad_input), in 16-bit, and on
// the GEMMs only with an unclustered, unsplit sm_90a wgmma tile; each rejection names what was wrong.
TEST(KernelSpec, EagerOperandNeedsA16BitHopperPipelineTile) {
  KernelSpec gemm;
  gemm.kind = KernelKind::GradInput;
  gemm.hidden = 4096;
  gemm.arch = Arch::SM90A;
  gemm.tile = TileConfig::parse("128x256x64/wg2/s4");
  gemm.eager_operand = true;
  EXPECT_NO_THROW(gemm.validate()) << gemm.text();
  EXPECT_EQ(KernelSpec::parse(gemm.text()), gemm);
  auto rejected = [](KernelSpec s, const std::string& expected) {
    const std::string message = spec_error([&] { s.validate(); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  };
  KernelSpec fp32 = gemm;
  fp32.dtype = DType::FP32;
  fp32.tile = TileConfig{128, 128, 32, 2, 4, 2};
  rejected(fp32, "eager_operand needs a 16-bit dtype");
  KernelSpec sm80 = gemm;
  sm80.arch = Arch::SM80;
  sm80.tile = TileConfig{128, 128, 64, 2, 4, 3};
  rejected(sm80, "an unclustered, unsplit sm_90a wgmma tile");
  KernelSpec clustered = gemm;
  clustered.tile = TileConfig::parse("128x256x64/wg2/s4/c2");
  rejected(clustered, "tile 128x256x64/wg2/s4/c2");
  KernelSpec split = gemm;
  split.tile = TileConfig::parse("128x256x64/wg2/s4/sn");
  rejected(split, "tile 128x256x64/wg2/s4/sn");
  KernelSpec forward = gemm;
  forward.kind = KernelKind::LseForward;
  forward.vocab = 128256;
  rejected(forward, "eager_operand is set on a kernel that reads no dz operand");
  KernelSpec dz;
  dz.kind = KernelKind::EagerDz;
  dz.eager_operand = true;
  EXPECT_NO_THROW(dz.validate()) << dz.text();
  dz.dtype = DType::FP32;
  rejected(dz, "eager_operand needs a 16-bit dtype");
  std::string text = gemm.text();
  text.replace(text.find("eager_operand=1"), 15, "eager_operand=2");
  const std::string message = spec_error([&] { KernelSpec::parse(text); });
  EXPECT_NE(message.find("'eager_operand' must be 1"), std::string::npos) << message;
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

TEST(KernelSpec, ValidateAcceptsAnyHiddenForMmaSyncTiles) {
  KernelSpec s = sample();
  for (int64_t h : {1, 7, 4093, 4094, 4100}) {
    s.hidden = h;
    EXPECT_NO_THROW(s.validate()) << "H = " << h;
  }
}

TEST(KernelSpec, ValidateRejectsWgmmaTileForRowsNotMultipleOf16BytesNamingHidden) {
  KernelSpec s = sample();
  s.arch = Arch::SM90A;
  s.tile = TileConfig{128, 256, 64, 1, 1, 3, 2};
  s.hidden = 4096;
  EXPECT_NO_THROW(s.validate());
  s.hidden = 4093;
  try {
    s.validate();
    FAIL() << "a wgmma tile accepted for H = 4093 (TMA needs 16-byte row strides)";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden = 4093"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("8186 bytes"), std::string::npos) << e.what();
  }
}

TEST(KernelSpec, ValidateRejectsTileThatDoesNotSplitOverWarps) {
  KernelSpec s = sample();
  s.tile = TileConfig{128, 128, 64, 3, 4, 3};
  EXPECT_THROW(s.validate(), SpecError);
}

std::string validate_error(const KernelSpec& s) {
  return spec_error([&] { s.validate(); });
}

TEST(KernelSpec, ValidateNamesANegativeTileDimension) {
  KernelSpec s = sample();
  s.tile.bm = -128;  // once split "evenly" over 2 warps and reached codegen as a negative size
  EXPECT_NE(validate_error(s).find("tile BM = -128 is outside 1..1024"), std::string::npos) << validate_error(s);
}

TEST(KernelSpec, ValidateNamesWarpsWhoseThreadCountWouldOverflow) {
  KernelSpec s = sample();
  s.dtype = DType::FP32;
  s.tile = TileConfig{128, 128, 32, 2, 67108864, 2};  // 2 x 2^26 warps x 32 threads = 2^32: 0 as an int,
                                                      // once a division by zero in the fp32 warp layout
  EXPECT_NE(validate_error(s).find("tile warps_n = 67108864 is outside 1..32"), std::string::npos)
      << validate_error(s);
}

TEST(KernelSpec, ValidateNamesHiddenAboveTheLimit) {
  KernelSpec s = sample();
  s.hidden = kMaxHidden + 8;
  EXPECT_NE(validate_error(s).find("hidden = 1048584 is outside 1..1048576"), std::string::npos)
      << validate_error(s);
}

TEST(KernelSpec, ValidateNamesChunkAboveTheLimit) {
  KernelSpec s = sample();
  s.chunk = kMaxChunk + 1;
  EXPECT_NE(validate_error(s).find("chunk = 1048577 is outside 0..1048576"), std::string::npos) << validate_error(s);
}

TEST(TileConfig, CheckRangeNamesEachFieldOutOfRange) {
  auto message = [](TileConfig t) { return spec_error([&] { t.check_range(); }); };
  EXPECT_EQ(message(TileConfig{}), "no error");
  EXPECT_EQ(message(TileConfig{0, 128, 64, 2, 4, 3}), "tile BM = 0 is outside 1..1024");
  EXPECT_EQ(message(TileConfig{128, 2048, 64, 2, 4, 3}), "tile BN = 2048 is outside 1..1024");
  EXPECT_EQ(message(TileConfig{128, 128, -1, 2, 4, 3}), "tile BK = -1 is outside 1..1024");
  EXPECT_EQ(message(TileConfig{128, 128, 64, 33, 4, 3}), "tile warps_m = 33 is outside 1..32");
  EXPECT_EQ(message(TileConfig{128, 128, 64, 2, 0, 3}), "tile warps_n = 0 is outside 1..32");
  EXPECT_EQ(message(TileConfig{128, 128, 64, 2, 4, 9}), "tile stages = 9 is outside 1..8");
}

// ---- checked size arithmetic ----

TEST(CheckedInt, MultiplyNamesWhatOverflows) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "bytes"), int64_t{1} << 62);
  EXPECT_EQ(spec_error([] { checked_mul(int64_t{1} << 62, 4, "dz bytes"); }),
            "dz bytes = 4611686018427387904 * 4 does not fit in 64 bits");
}

TEST(CheckedInt, AddNamesWhatOverflows) {
  EXPECT_EQ(checked_add(INT64_MAX - 1, 1, "bytes"), INT64_MAX);
  EXPECT_EQ(spec_error([] { checked_add(INT64_MAX, 1, "workspace"); }),
            "workspace = 9223372036854775807 + 1 does not fit in 64 bits");
}

TEST(CheckedInt, CeilDivAndRoundUp) {
  EXPECT_EQ(ceil_div(0, 8), 0);
  EXPECT_EQ(ceil_div(1, 8), 1);
  EXPECT_EQ(ceil_div(INT64_MAX, 2), int64_t{1} << 62);  // no a + b - 1 overflow
  EXPECT_EQ(round_up(257, 256, "bytes"), 512);
  EXPECT_THROW(round_up(INT64_MAX, 256, "bytes"), SpecError);
  EXPECT_THROW(ceil_div(5, 0), InternalError);  // a bug, never SIGFPE
}

TEST(CheckedInt, NextPowerOfTwoStopsAtTwoToTheSixtyTwo) {
  EXPECT_EQ(next_pow2(0, "n"), 1);
  EXPECT_EQ(next_pow2(1, "n"), 1);
  EXPECT_EQ(next_pow2(4097, "n"), 8192);
  EXPECT_EQ(next_pow2(int64_t{1} << 62, "n"), int64_t{1} << 62);
  EXPECT_EQ(spec_error([] { next_pow2((int64_t{1} << 62) + 1, "tuning N bucket"); }),
            "tuning N bucket: the power of two above 4611686018427387905 does not fit in 64 bits");
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
