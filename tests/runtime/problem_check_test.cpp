// Problem validation (runtime/problem.cpp): the C struct's conversion and checks, each naming the
// field, and the problem's text key.
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

using testing_errors::spec_error;

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

// Every line of runtime/problem_options.def: the C field reaches the Problem member, changes the
// problem's text key, and a bad value is refused naming the C field; a kernel that reads the
// option gets it in its spec. A line added to the table is covered here without a test edit.
TEST(ProblemFromC, EveryLossOptionOfTheTableReachesTheProblemItsKeyAndItsMessages) {
  lfce_problem base = llama3(8192);
  base.has_bias = 1;  // (accumulate_grad_bias needs a bias)
  const std::string base_text = problem_text(problem_from_c(&base));
  int rows = 0;
#define LFCE_PROBLEM_FLOAT(member, c_field, option, none, lowest, highest, range, help)                    \
  {                                                                                                         \
    ++rows;                                                                                                 \
    lfce_problem c = base;                                                                                  \
    const float value = (none) == (highest) ? (lowest) : (highest);                                         \
    c.c_field = value;                                                                                      \
    const Problem p = problem_from_c(&c);                                                                   \
    EXPECT_EQ(p.member, value) << #member;                                                                  \
    EXPECT_NE(problem_text(p), base_text) << #member;                                                       \
    c.c_field = -(highest);                                                                                 \
    EXPECT_NE(error_of(c).find("lfce_problem." #c_field " must be " range), std::string::npos) << error_of(c); \
  }
#define LFCE_PROBLEM_FLAG(member, c_field, option, spec_member, help)                                                 \
  {                                                                                                                   \
    ++rows;                                                                                                           \
    lfce_problem c = base;                                                                                            \
    c.c_field = 1;                                                                                                    \
    const Problem p = problem_from_c(&c);                                                                             \
    EXPECT_TRUE(p.member) << #member;                                                                                 \
    EXPECT_NE(problem_text(p), base_text) << #member;                                                                 \
    if (bool KernelSpec::* flag = spec_member) {                                                                      \
      EXPECT_TRUE(problem_spec(KernelKind::DlogitsBackward, p, Arch::SM90A).*flag) << #member;                        \
    }                                                                                                                 \
    c.c_field = 2;                                                                                                    \
    EXPECT_NE(error_of(c).find("lfce_problem." #c_field " must be 0 or 1, got 2"), std::string::npos) << error_of(c); \
  }
#include "runtime/problem_options.def"
  EXPECT_EQ(rows, 8);  // softcap, temperature, z_loss_scale, label_smoothing and four flags
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

TEST(Plan, RejectsAProblemThatSkippedTheCApiCheck) {
  Problem p = problem(llama3(1));
  p.tokens = 4611686018427387905;
  EXPECT_NE(spec_error([&] { Plan(p, Arch::SM90A); }).find("4611686018427387905"), std::string::npos);
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

TEST(ProblemFromC, NamesNegativeChunk) {
  lfce_problem p = llama3(1);
  p.chunk_size = -5;
  EXPECT_NE(error_of(p).find("chunk_size"), std::string::npos) << error_of(p);
}

// Bounds: every size is checked before it is used (huge token counts among them).
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

}  // namespace
}  // namespace lfce::runtime
