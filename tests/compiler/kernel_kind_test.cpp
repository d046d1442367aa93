// The kernel-kind table against the templates, with no GPU: every field a kind is said not to
// read leaves its PTX byte-identical (so normalising it away shares a kernel that is really the
// same), and every field it reads changes both the PTX and the normalised spec's key.
#include "compiler/kernel_kind.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <string>

#include "compiler/errors.h"
#include "compiler/kernel_spec.h"
#include "templates/templates.h"
#include "tests/spec_error.h"

namespace lfce {
namespace {

struct FieldChange {
  uint32_t field;
  const char* name;
  std::function<void(KernelSpec&)> change;
};

const std::vector<FieldChange>& field_changes() {
  static const std::vector<FieldChange> changes = {
      {kFieldVocab, "vocab", [](KernelSpec& s) { s.vocab += 3; }},
      {kFieldHidden, "hidden", [](KernelSpec& s) { s.hidden += 8; }},
      {kFieldChunk, "chunk", [](KernelSpec& s) { s.chunk += 128; }},
      {kFieldMode, "mode", [](KernelSpec& s) { s.mode = s.mode == Mode::Recompute ? Mode::Eager : Mode::Recompute; }},
      {kFieldDType, "dtype", [](KernelSpec& s) { s.dtype = s.dtype == DType::BF16 ? DType::FP16 : DType::BF16; }},
      {kFieldTargets, "targets",
       [](KernelSpec& s) { s.targets = s.targets == IndexType::I64 ? IndexType::I32 : IndexType::I64; }},
      {kFieldReduction, "reduction",
       [](KernelSpec& s) { s.reduction = s.reduction == Reduction::Mean ? Reduction::Sum : Reduction::Mean; }},
      {kFieldBias, "bias", [](KernelSpec& s) { s.bias = !s.bias; }},
      {kFieldTile, "tile", [](KernelSpec& s) { s.tile.stages = s.tile.stages == 2 ? 3 : 2; }},
      // The loss options: a spec may set one only on a kind that reads it (validate()).
      {kFieldSoftcap, "softcap", [](KernelSpec& s) { s.softcap = 30.f; }},
      {kFieldTemperature, "temperature", [](KernelSpec& s) { s.temperature = 0.7f; }},
      {kFieldZLoss, "z_loss_scale", [](KernelSpec& s) { s.z_loss_scale = 1e-4f; }},
      {kFieldLabelSmoothing, "label_smoothing", [](KernelSpec& s) { s.label_smoothing = 0.1f; }},
      {kFieldClassWeight, "class_weight", [](KernelSpec& s) { s.class_weight = true; }},
      {kFieldAccumulate, "accumulate", [](KernelSpec& s) { s.accumulate = true; }},
      {kFieldTokenScaling, "token_scaling", [](KernelSpec& s) { s.token_scaling = true; }},
      {kFieldEntropy, "entropy", [](KernelSpec& s) { s.entropy = true; }},
      {kFieldArgmax, "argmax", [](KernelSpec& s) { s.argmax = true; }},
      {kFieldLogprob, "logprob", [](KernelSpec& s) { s.logprob = true; }},
      {kFieldLseGrad, "lse_grad", [](KernelSpec& s) { s.lse_grad = true; }},
      {kFieldShift, "shift", [](KernelSpec& s) { s.shift = true; }},
      {kFieldEagerOperand, "eager_operand", [](KernelSpec& s) { s.eager_operand = true; }},
      {kFieldEagerFixup, "eager_fixup", [](KernelSpec& s) { s.eager_fixup = true; }},
  };
  return changes;
}

TEST(KernelKindTable, FieldChangesCoverEverySpecField) {
  uint32_t covered = 0;
  for (const FieldChange& f : field_changes()) covered |= f.field;
  EXPECT_EQ(covered, kAllSpecFields);
}

// A small spec of `kind` (small tiles and sizes keep PTX generation fast).
KernelSpec small_spec(KernelKind kind, DType dtype, Reduction reduction) {
  KernelSpec s;
  s.kind = kind;
  s.vocab = 1000;
  s.hidden = 256;
  s.chunk = 512;
  s.dtype = dtype;
  s.reduction = reduction;
  s.arch = Arch::SM80;
  s.tile = TileConfig{64, 64, 64, 2, 2, 2};
  return s;
}

struct Base {
  KernelKind kind;
  DType dtype;
  Reduction reduction;
};

std::string base_name(const testing::TestParamInfo<Base>& info) {
  return std::string(kind_name(info.param.kind)) + "_" + std::string(dtype_name(info.param.dtype)) + "_" +
         std::string(reduction_name(info.param.reduction));
}

class KindFields : public testing::TestWithParam<Base> {};

TEST_P(KindFields, UnreadFieldsLeaveThePtxAndKeyAloneAndReadOnesChangeBoth) {
  const Base& b = GetParam();
  const KernelSpec base = small_spec(b.kind, b.dtype, b.reduction);
  const uint32_t reads = base.fields_read();
  const std::string base_ptx = generate_kernel(base).ptx;
  for (const FieldChange& f : field_changes()) {
    SCOPED_TRACE(std::string(f.name) + " of " + base.text());
    KernelSpec changed = base;
    f.change(changed);
    ASSERT_NE(changed, base);
    if ((reads & f.field) && ((f.field == kFieldEagerOperand && (b.dtype == DType::FP32 || kind_info(b.kind).gemm)) ||
                              f.field == kFieldEagerFixup)) {
      // The GEMMs' operand transform runs in the sm_90a pipeline only (these bases are sm_80 mma.sync
      // tiles): rejected, naming it (templates/gemm/eager_operand.h; its code: codegen_test.cpp).
      EXPECT_THROW(generate_kernel(changed), SpecError) << f.name << " on an sm_80 tile";
    } else if (reads & f.field) {
      EXPECT_NE(generate_kernel(changed).ptx, base_ptx) << f.name << " is marked read but does not change the code";
      EXPECT_NE(changed.normalised().text(), base.normalised().text()) << "normalised() drops " << f.name;
    } else if (f.field & (kLogitMapFields | kFieldZLoss | kTargetTermFields | kFieldAccumulate | kFieldTokenScaling |
                          kOutputFields | kFieldArgmax | kFieldLseGrad | kFieldShift | kFieldEagerOperand |
                          kFieldEagerFixup)) {
      EXPECT_THROW(generate_kernel(changed), SpecError) << f.name << " set on a kind that does not read it";
      EXPECT_EQ(changed.normalised(), base.normalised());
    } else {
      EXPECT_EQ(generate_kernel(changed).ptx, base_ptx)
          << "the template reads " << f.name << ", which kKernelKinds marks unread";
      EXPECT_EQ(changed.normalised(), base.normalised());
    }
  }
}

std::vector<Base> bases() {
  std::vector<Base> out;
  for (const KernelKindInfo& info : kKernelKinds) {
    out.push_back({info.kind, DType::BF16, Reduction::Mean});
    // fp16 kernels that divide out dz_scale read the reduction, and the mode unless it is none.
    if (info.unscales_dz) {
      out.push_back({info.kind, DType::FP16, Reduction::Mean});
      out.push_back({info.kind, DType::FP16, Reduction::None});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, KindFields, testing::ValuesIn(bases()), base_name);

// Reads that depend on the options themselves (KernelSpec::fields_read): lse_forward reads the
// class weights only with label smoothing, loss_reduce the z-loss only for mean with class weights.
TEST(KernelKindTable, ConditionalReadsChangeTheCodeExactlyWhereTheyAreRead) {
  KernelSpec fwd = small_spec(KernelKind::LseForward, DType::BF16, Reduction::Mean);
  fwd.label_smoothing = 0.1f;
  ASSERT_TRUE(fwd.fields_read() & kFieldClassWeight);
  KernelSpec weighted = fwd;
  weighted.class_weight = true;
  EXPECT_NE(generate_kernel(weighted).ptx, generate_kernel(fwd).ptx);
  fwd.label_smoothing = 0.f;
  EXPECT_FALSE(fwd.fields_read() & kFieldClassWeight);

  // dlogits_backward reads the entropy and logprob rows only for their gradients.
  KernelSpec lse_grad = small_spec(KernelKind::DlogitsBackward, DType::BF16, Reduction::Mean);
  EXPECT_FALSE(lse_grad.fields_read() & (kFieldEntropy | kFieldLogprob));
  lse_grad.lse_grad = true;
  ASSERT_TRUE((lse_grad.fields_read() & kOutputFields) == kOutputFields);
  const std::string with_lse_grad = generate_kernel(lse_grad).ptx;
  for (auto set : {+[](KernelSpec& s) { s.entropy = true; }, +[](KernelSpec& s) { s.logprob = true; }}) {
    KernelSpec changed = lse_grad;
    set(changed);
    EXPECT_NE(generate_kernel(changed).ptx, with_lse_grad) << changed.text();
  }

  KernelSpec reduce = small_spec(KernelKind::LossReduce, DType::BF16, Reduction::Mean).normalised();
  EXPECT_FALSE(reduce.fields_read() & kFieldVocab);
  reduce.class_weight = true;
  ASSERT_TRUE(reduce.fields_read() & kFieldZLoss);
  EXPECT_TRUE(reduce.fields_read() & kFieldVocab);  // a target's bound before its weight is read
  reduce.vocab = 1000;
  KernelSpec z_loss = reduce;
  z_loss.z_loss_scale = 1e-4f;
  EXPECT_NE(generate_kernel(z_loss).ptx, generate_kernel(reduce).ptx);
  // dlogits_backward reads V with either target term (eps / V; a target's bound).
  KernelSpec dlogits = small_spec(KernelKind::DlogitsBackward, DType::BF16, Reduction::Mean);
  EXPECT_FALSE(dlogits.fields_read() & kFieldVocab);
  dlogits.label_smoothing = 0.1f;
  EXPECT_TRUE(dlogits.fields_read() & kFieldVocab);
  KernelSpec other_vocab = dlogits;
  other_vocab.vocab += 1;
  EXPECT_NE(generate_kernel(other_vocab).ptx, generate_kernel(dlogits).ptx);
  dlogits.label_smoothing = 0.f;
  dlogits.class_weight = true;
  EXPECT_TRUE(dlogits.fields_read() & kFieldVocab);
  for (Reduction r : {Reduction::Sum, Reduction::None}) {
    z_loss.reduction = r;
    EXPECT_FALSE(z_loss.fields_read() & kFieldZLoss) << reduction_name(r);
    EXPECT_EQ(z_loss.normalised().z_loss_scale, 0.f);
  }
}

TEST(KernelKindTable, ListsEveryKindOnceWithATemplate) {
  std::set<std::string_view> names;
  for (size_t i = 0; i < std::size(kKernelKinds); ++i) {
    const KernelKindInfo& info = kKernelKinds[i];
    EXPECT_EQ(static_cast<size_t>(info.kind), i);
    EXPECT_TRUE(names.insert(info.name).second) << info.name << " twice";
    EXPECT_EQ(parse_kind(info.name), info.kind);
    EXPECT_EQ(&kind_info(info.kind), &info);
    // The registry builds it, and its entry point is named after the kind.
    KernelSpec s = small_spec(info.kind, DType::BF16, Reduction::Mean).normalised();
    EXPECT_EQ(generate_kernel(s).shape.entry, info.name);
  }
  EXPECT_THROW(kind_info(static_cast<KernelKind>(std::size(kKernelKinds))), InternalError);
}

TEST(KernelKindTable, ParseKindNamesTheBadName) {
  const std::string message = testing_errors::spec_error([] { parse_kind("lse_backward"); });
  EXPECT_NE(message.find("'lse_backward'"), std::string::npos) << message;
  EXPECT_NE(message.find("grad_bias"), std::string::npos) << message;
}

TEST(KernelKindTable, SharedMemoryEstimateMatchesTheTemplates) {
  for (const KernelKindInfo& info : kKernelKinds)
    for (DType dtype : {DType::BF16, DType::FP32}) {
      KernelSpec s = small_spec(info.kind, dtype, Reduction::Mean);
      if (dtype == DType::FP32) s.tile = TileConfig{64, 64, 32, 2, 2, 3};
      EXPECT_EQ(generate_kernel(s).shape.smem_bytes, kernel_smem_bytes(s)) << s.text();
    }
}

TEST(KernelSpec, NormalisedSpecsValidate) {
  for (const KernelKindInfo& info : kKernelKinds) {
    const KernelSpec s = small_spec(info.kind, DType::FP16, Reduction::Sum).normalised();
    EXPECT_NO_THROW(s.validate()) << s.text();
    EXPECT_EQ(s.normalised(), s);
  }
}

TEST(KernelSpec, NormalisedForwardKernelsDoNotDependOnTheMode) {
  for (KernelKind kind : {KernelKind::LseForward, KernelKind::LseCombine, KernelKind::LossReduce}) {
    KernelSpec recompute = small_spec(kind, DType::BF16, Reduction::Mean), eager = recompute;
    eager.mode = Mode::Eager;
    EXPECT_EQ(recompute.normalised(), eager.normalised()) << kind_name(kind);
  }
  KernelSpec combine = small_spec(KernelKind::LseCombine, DType::BF16, Reduction::Mean);
  EXPECT_EQ(combine.normalised().text(),
            "lse_combine;V=1000;H=0;chunk=0;mode=recompute;dtype=bf16;targets=i64;reduction=mean;bias=0;"
            "arch=sm_80;tile=128x128x64/2x4/s3");
}

}  // namespace
}  // namespace lfce
